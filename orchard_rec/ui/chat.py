"""A recorded request or response as chat turns, whatever its dialect.

The dialect registry reads the stored body (``dialects.turns_of`` / ``answer_turn_of``: neutral
turns with raw values, so a dialect added by an entry point shows with no edit here); this module
renders those values as text. Each turn is ``{"role": ..., "blocks": [...]}``; a block is
``{"kind": "text" | "reasoning" | "tool_call" | "tool_result" | "image", ...}`` with ``text`` (and
``name``/``id`` for tool calls and results, ``url`` for images). Unknown shapes fall back to their
JSON text: nothing is lost.
"""

from __future__ import annotations

from typing import Any

import orjson

from orchard_rec import dialects

__all__ = ["conversation", "response_turn"]

Block = dict[str, Any]
Turn = dict[str, Any]


def _json(v: Any) -> str:
    try:
        return orjson.dumps(v, option=orjson.OPT_INDENT_2).decode()
    except TypeError:
        return str(v)


def _args(v: Any) -> str:
    """Tool-call arguments, pretty when they are JSON."""
    if isinstance(v, str):
        try:
            return _json(orjson.loads(v))
        except orjson.JSONDecodeError:
            return v
    return _json(v)


def _text_of(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "\n".join(_text_of(p.get("text") if isinstance(p, dict) and "text" in p else p) for p in v)
    return _json(v)


def _display(b: dialects.Block) -> Block:
    """A neutral block (``dialects.view``) as the page shows it: raw values as text."""
    kind = b.get("kind")
    if kind in ("text", "reasoning"):
        return {"kind": kind, "text": b.get("text") or ""}
    if kind == "image":
        url = b.get("url")
        return {"kind": "image", "url": url or "", "text": "" if url else _json(b.get("part"))}
    if kind == "tool_call":
        return {
            "kind": "tool_call",
            "name": b.get("name"),
            "id": b.get("id"),
            "text": _args(b.get("arguments")),
        }
    if kind == "tool_result":
        return {"kind": "tool_result", "id": b.get("id"), "text": _text_of(b.get("content"))}
    return {"kind": "text", "text": _json(b.get("value", b))}


def _turn(t: dialects.Turn) -> Turn:
    return {"role": str(t.get("role", "?")), "blocks": [_display(b) for b in t.get("blocks") or ()]}


def conversation(request: Any, dialect: str) -> list[Turn]:
    """The turns a request sent (system prompt included), as its dialect reads them (the
    registry's: a dialect added by an entry point shows with no edit here)."""
    if request is None:
        return []
    turns = dialects.turns_of(dialect, request)
    if turns is None:  # no dialect reads it: its JSON, nothing lost
        return [{"role": "?", "blocks": [{"kind": "text", "text": _json(request)}]}]
    return [_turn(t) for t in turns]


def response_turn(response: Any, dialect: str) -> Turn | None:
    """The assistant turn a response carried, or None (errors, non-generation calls)."""
    turn = dialects.answer_turn_of(dialect, response)
    return _turn(turn) if turn is not None else None
