"""Tito's two wires: the token endpoint's request and answer (vLLM ``/v1/completions`` or
``/inference/v1/generate``, SGLang ``/generate``), and the generated text parsed back into the
client's chat completion (``<think>`` reasoning, Hermes/Qwen ``<tool_call>`` JSON) and its chunk
stream. Moved out of ``proxy/tito.py``, which keeps the sessions and their branches.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

from orchard_rec import rlwire
from orchard_rec.errors import BadRequest, UpstreamProtocolError

__all__ = [
    "GENERATE_PATH",
    "chat_completion",
    "parse_generation",
    "read_upstream",
    "server_prompt",
    "synth_chunks",
    "upstream_request",
    "upstream_url",
]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.S)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def parse_generation(text: str, eos_text: str | None, tools: bool = True) -> dict[str, Any]:
    """The assistant message in generated text (``<think>`` reasoning, Hermes tool calls).

    Text is kept as the server detokenized it (no stripping). Tool calls are parsed as
    vLLM's ``hermes`` parser does when the request offers tools: every ``<tool_call>`` must
    hold a JSON object with a ``name`` (a last unclosed one runs to the end), else the whole
    text is content; content is the text before the first ``<tool_call>``; arguments are
    serialized like ``json.dumps``.
    """
    if eos_text and eos_text in text:
        text = text[: text.index(eos_text)]
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    m = _THINK.match(text)
    if m:
        msg["reasoning_content"] = m.group(1).strip("\n")
        text = text[m.end() :]
    calls = _hermes_calls(text) if tools else None
    if calls:
        content = text[: text.index("<tool_call>")]
        msg["content"] = content or None
        msg["tool_calls"] = calls
    else:
        msg["content"] = text or None
    return msg


def _hermes_calls(text: str) -> list[dict[str, Any]] | None:
    if "<tool_call>" not in text:
        return None
    calls = []
    for closed, open_ended in _CALL.findall(text):
        try:
            c = json.loads(closed or open_ended)
            name, args = c["name"], c["arguments"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(name, str):
            return None
        calls.append(
            {
                "id": "chatcmpl-tool-" + uuid.uuid4().hex,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    return calls


def chat_completion(
    model: Any, msg: dict[str, Any], finish: str, n_prompt: int, n_completion: int
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_completion,
            "total_tokens": n_prompt + n_completion,
        },
    }


def _chunk(base: dict[str, Any], delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One chat completion chunk of a single choice."""
    return {
        **base,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def synth_chunks(obj: dict[str, Any], *, usage: bool, translated: bool = False) -> list[dict[str, Any]]:
    """The chunk stream a chat completion object corresponds to.

    ``usage``: end with vLLM's usage chunk (a chat client asked with
    ``stream_options.include_usage``; translators always need it). ``translated``: the chunks
    feed a translator, not a client: the first one carries the usage too, as the prompt
    size an Anthropic ``message_start`` reports.
    """
    base = {
        "id": obj["id"],
        "object": "chat.completion.chunk",
        "created": obj["created"],
        "model": obj["model"],
    }
    choice = obj["choices"][0]
    msg = choice["message"]
    first = _chunk(base, {"role": "assistant", "content": ""})
    if translated:
        first["usage"] = obj["usage"]
    out = [first]
    if msg.get("reasoning_content"):
        out.append(_chunk(base, {"reasoning_content": msg["reasoning_content"]}))
    if msg.get("content"):
        out.append(_chunk(base, {"content": msg["content"]}))
    for k, tc in enumerate(msg.get("tool_calls") or ()):
        head = {
            "index": k,
            "id": tc["id"],
            "type": "function",
            "function": {"name": tc["function"]["name"], "arguments": ""},
        }
        out.append(_chunk(base, {"tool_calls": [head]}))
        args = {"index": k, "function": {"arguments": tc["function"]["arguments"]}}
        out.append(_chunk(base, {"tool_calls": [args]}))
    out.append(_chunk(base, {}, choice["finish_reason"]))
    if usage or translated:
        out.append({**base, "choices": [], "usage": obj["usage"]})
    return out


GENERATE_PATH = rlwire.GENERATE_PATH
"""vLLM's token-in endpoint (``--enable-scale-out``), under the server root, not ``/v1``."""


def upstream_request(
    kind: str,
    chat: dict[str, Any],
    prompt: Sequence[int],
    images: list[str] | None = None,
    *,
    generate: bool = False,
) -> tuple[str, dict[str, Any]]:
    """``(path, body)`` for the upstream's token endpoint; ``images``: the prompt's image URLs
    in order (vLLM's ``/inference/v1/generate`` with ``content_parts``); ``generate``: vLLM's
    ``/inference/v1/generate`` without images too (its answers carry ``weight_versions``)."""
    max_tokens = chat.get("max_completion_tokens") or chat.get("max_tokens") or 4096
    if images or (generate and kind == "vllm"):
        if kind != "vllm":
            raise BadRequest(
                "tito sends images only to vLLM (/inference/v1/generate, vllm serve --enable-scale-out): "
                "use --upstream-kind vllm, or --mode token for this server"
            )
        sp: dict[str, Any] = {"max_tokens": max_tokens, "logprobs": 0, "skip_special_tokens": False}
        for k in ("temperature", "top_p", "top_k", "stop", "seed"):
            if chat.get(k) is not None:
                sp[k] = chat[k]
        if chat.get("cache_salt") is not None:  # a request field, not a sampling parameter
            out_salt: dict[str, Any] = {"cache_salt": chat["cache_salt"]}
        else:
            out_salt = {}
        out: dict[str, Any] = {"model": chat.get("model"), "token_ids": prompt}
        if images:
            out["content_parts"] = [{"type": "image_url", "url": u} for u in images]
        return GENERATE_PATH, {
            **out,
            **out_salt,
            "sampling_params": sp,
            "return_token_ids": True,
            "stream": False,
        }
    if kind == "sglang":
        params: dict[str, Any] = {"max_new_tokens": max_tokens, "skip_special_tokens": False}
        for k in ("temperature", "top_p", "top_k", "stop"):
            if chat.get(k) is not None:
                params[k] = chat[k]
        return "generate", {
            "input_ids": prompt,
            "sampling_params": params,
            "return_logprob": True,
            "stream": False,
        }
    body: dict[str, Any] = {
        "model": chat.get("model"),
        "prompt": prompt,
        "max_tokens": max_tokens,
        "return_token_ids": True,
        "logprobs": 0,
        "skip_special_tokens": False,
        "stream": False,
    }
    for k in ("temperature", "top_p", "top_k", "stop", "seed", "cache_salt"):
        if chat.get(k) is not None:
            body[k] = chat[k]
    return "completions", body


def read_upstream(kind: str, obj: Any) -> tuple[list[int], list[float] | None, str, str | None]:
    """``(generated ids, logprobs, finish_reason, text)`` from the token endpoint's answer.

    ``text`` is the server's own detokenization (None when it sent none): relayed as is, it
    is what the server would have answered on its chat endpoint (a partial UTF-8 character
    at the end dropped, not shown as U+FFFD)."""
    try:
        if kind == "sglang":
            meta = obj["meta_info"]
            ids = list(obj.get("output_ids") or [t[1] for t in meta.get("output_token_logprobs") or []])
            lps = [float(t[0]) for t in meta.get("output_token_logprobs") or []] or None
            fin = meta.get("finish_reason") or {}
            return (
                ids,
                lps,
                "length" if (fin.get("type") if isinstance(fin, dict) else fin) == "length" else "stop",
                obj.get("text") if isinstance(obj.get("text"), str) else None,
            )
        c = obj["choices"][0]
        lp = c.get("logprobs") or {}
        if isinstance(lp.get("content"), list):  # /inference/v1/generate: one entry per generated token
            lps = [float(e["logprob"]) for e in lp["content"]] or None
        else:
            lps = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or []] or None
        text = c.get("text") if isinstance(c.get("text"), str) else None
        return list(c["token_ids"]), lps, "length" if c.get("finish_reason") == "length" else "stop", text
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise UpstreamProtocolError(
            f"the upstream's token endpoint answered without token ids: {type(exc).__name__}: {exc}"
        ) from exc


def upstream_url(kind: str, upstream: str, path: str) -> str:
    """Where ``path`` is served: SGLang's ``/generate`` and vLLM's ``/inference/...`` at the root."""
    root = (kind == "sglang" or path == GENERATE_PATH) and upstream.endswith("/v1")
    return f"{upstream[:-3] if root else upstream}/{path}"


def server_prompt(obj: Any, sent: Sequence[int]) -> Sequence[int]:
    """The prompt ids the server ran: its expanded ``prompt_token_ids`` (images) when it returned
    them, else the ids sent."""
    ids = obj.get("prompt_token_ids") if isinstance(obj, dict) else None
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        return list(ids)
    return sent
