"""Token ids for calls recorded without them (passthrough mode, commercial APIs).

The prompt is rendered with the model's Hugging Face chat template (with the recorded
tools), the way vLLM does it: tool-call arguments handed to the template as objects,
list contents flattened to text. The completion is the template's rendering of the
answer's assistant turn (plus a ``<think>`` block for recorded reasoning), cut after the
end-of-turn token. Such ids are a best effort, not what the model saw: samples built
from them carry ``metadata.token_source = "retokenized"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from orchard_rec.dialects import assistant_message, chat_request_of, raw_text, template_message
from orchard_rec.records import CallRecord

__all__ = ["retokenize"]


def _ids(x: Any) -> list[int]:
    if isinstance(x, dict) or hasattr(x, "input_ids"):
        x = x["input_ids"]
    return list(x)


def retokenize(call: CallRecord, tokenizer: Any) -> CallRecord | None:
    """A copy of ``call`` with prompt and completion ids from ``tokenizer`` (None if it cannot)."""
    raw = raw_text(call.dialect, call.request, call.response)
    if raw is not None:  # a text-in, text-out dialect (completions): no chat template between them
        p = tokenizer.encode(raw[0], add_special_tokens=False)
        c = tokenizer.encode(raw[1], add_special_tokens=False)
        return dataclasses.replace(
            call, prompt_ids=tuple(p), completion_ids=tuple(c), completion_logprobs=None
        )
    chat = chat_request_of(call.dialect.value, call.request)
    answer = assistant_message(call.dialect.value, call.response)
    if chat is None or answer is None:
        return None
    messages = [template_message(m) for m in chat.get("messages") or ()]
    tools = chat.get("tools") or None
    prompt = _ids(
        tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    )
    full = _ids(
        tokenizer.apply_chat_template(
            messages + [template_message(answer)], tools=tools, add_generation_prompt=False, tokenize=True
        )
    )
    if full[: len(prompt)] == prompt:
        completion = full[len(prompt) :]
    else:  # a template that renders the history differently once an answer follows
        content = answer.get("content")
        completion = tokenizer.encode(content if isinstance(content, str) else "", add_special_tokens=False)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and eos in completion:
        completion = completion[: len(completion) - completion[::-1].index(eos)]
    reasoning = answer.get("reasoning_content")
    if reasoning:
        completion = (
            tokenizer.encode("<think>\n" + reasoning.strip("\n") + "\n</think>\n\n", add_special_tokens=False)
            + completion
        )
    return dataclasses.replace(
        call, prompt_ids=tuple(prompt), completion_ids=tuple(completion), completion_logprobs=None
    )
