"""A sample's conversation as chat messages, for the text-based (SFT) formats.

``conversation_of`` is the chat view of a recorded call: its request's messages (any dialect,
translated by ``orchard_rec.dialects``) followed by the answer. ``turn_flagged_messages``
flags each assistant message with whether the credit policy trains on that turn. Pure: no
storage (``exporters.pipeline.attach_messages`` fetches the call).
"""

from __future__ import annotations

from typing import Any

from orchard_rec.dialects import assistant_message, chat_request_of
from orchard_rec.reconstruct import Sample
from orchard_rec.records import CallRecord

__all__ = ["conversation_of", "turn_flagged_messages"]


def conversation_of(call: CallRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(messages, tools)``: the chat view of ``call``'s request plus its answer."""
    chat = chat_request_of(call.dialect.value, call.request) or {}
    answer = assistant_message(call.dialect.value, call.response)
    msgs = [dict(m) for m in chat.get("messages") or ()]
    if answer is not None:
        msgs.append(answer)
    return msgs, list(chat.get("tools") or [])


def turn_flagged_messages(s: Sample, key: str) -> list[dict[str, Any]]:
    """The sample's conversation, each message flagged under ``key``: 1 if it is a credited
    assistant turn, else 0 (observations, prompts, and turns the credit policy dropped)."""
    credited = [any(s.loss_mask[t.start : t.end]) for t in s.turns]
    out = []
    k = 0
    for m in s.messages or ():
        m = dict(m)
        if m.get("role") == "assistant":
            m[key] = int(credited[k]) if k < len(credited) else 0
            k += 1
        else:
            m[key] = 0
        out.append(m)
    return out
