"""Content values every dialect shares: text of a content value, the opening of a role'd item
list, and messages as chat templates read them."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

__all__ = [
    "INSTRUCTION_ROLES",
    "assistant_turn",
    "first_instructions",
    "first_user",
    "hex_id",
    "parts_text",
    "template_message",
    "template_text",
    "text_of",
    "tool_names_in",
]

INSTRUCTION_ROLES = ("system", "developer")
"""The roles of an item that instructs the model (chat's ``system``, Responses' ``developer``)."""


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


def parts_text(parts: list[Any]) -> str:
    """The text parts of a list (each ``{"text": str, ...}``: chat, Responses, Messages and Gemini
    parts alike) joined; other parts are skipped."""
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def first_instructions(items: Any, content: str = "content") -> str | None:
    """The text of a conversation list's first system/developer item (its ``content`` key), when
    one comes before the first user item; None otherwise. Stops at the first user item."""
    if isinstance(items, list):
        for m in items:
            if isinstance(m, dict):
                role = m.get("role")
                if role == "user":
                    return None
                if role in INSTRUCTION_ROLES:
                    return text_of(m.get(content))
    return None


def first_user(items: Any, content: str = "content", role: str | None = None) -> str | None:
    """The text of a conversation list's first user item (its ``content`` key: a string, or a list
    whose text parts are joined); None without one, or when its content is neither. ``role``: the
    role of an item that names none (Gemini's ``contents`` default to ``user``)."""
    if isinstance(items, list):
        for m in items:
            if isinstance(m, dict) and m.get("role", role) == "user":
                c = m.get(content)
                return c if isinstance(c, str) else (parts_text(c) if isinstance(c, list) else None)
    return None


def tool_names_in(tools: Any) -> list[str]:
    """The names of a ``tools`` list's entries: chat's ``{"function": {"name"}}`` and the flat
    ``{"name"}`` of Responses and Messages alike."""
    out = []
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict):
            fn = t.get("function")
            name = (fn if isinstance(fn, dict) else t).get("name")
            if isinstance(name, str):
                out.append(name)
    return out


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
