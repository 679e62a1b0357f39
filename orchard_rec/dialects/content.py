"""Content values every dialect shares: text of a content value, and messages as chat templates read them."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

__all__ = ["assistant_turn", "hex_id", "template_message", "template_text", "text_of"]


def hex_id() -> str:
    """A fresh id suffix (``resp_``, ``msg_``, ``call_`` ... are the dialect's prefixes)."""
    return uuid.uuid4().hex


def assistant_turn(texts: list[str], reasoning: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat assistant message from an answer's text pieces, its reasoning (None: it had none) and
    its tool calls (chat's ``tool_calls`` shape)."""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def text_of(content: Any) -> str:
    """Concatenate the text parts of a content value (str or list of parts/blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, dict):
                t = p.get("text")
                if isinstance(t, str):
                    out.append(t)
                elif p.get("type") in ("input_text", "output_text") and isinstance(p.get("text"), str):
                    out.append(p["text"])
        return "".join(out)
    return str(content)


def template_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text")
        )
    return str(content)


def template_message(m: dict[str, Any]) -> dict[str, Any]:
    """A chat message as chat templates want it (as vLLM hands it over): text content, tool-call arguments as objects."""
    out = dict(m)
    out["content"] = template_text(m.get("content"))
    if m.get("tool_calls"):
        calls = []
        for tc in m["tool_calls"]:
            fn = dict(tc.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = orjson.loads(args) if args else {}
                except orjson.JSONDecodeError:
                    pass
            calls.append({**tc, "function": fn})
        out["tool_calls"] = calls
    return out
