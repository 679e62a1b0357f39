"""A recorded conversation as neutral turns: what the viewer shows and the step parser reads.

A dialect turns a stored request into ``list[Turn]`` (``WireDialect.turns``, system prompt
first) and a stored answer into one ``Turn`` (``WireDialect.answer_turn``). A turn is
``{"role": str, "blocks": [Block, ...]}``; a block is one of

- ``{"kind": "text", "text": str}`` and ``{"kind": "reasoning", "text": str}``;
- ``{"kind": "image", "url": str | None, "part": <the raw part>}``;
- ``{"kind": "tool_call", "name": str, "id": str | None, "arguments": <a JSON string or an object>}``;
- ``{"kind": "tool_result", "id": str | None, "content": <raw content>, "error": bool}``;
- ``{"kind": "other", "value": <the raw part or item>}``: a shape the dialect does not read
  (shown as its JSON, never dropped).

Blocks keep raw values (arguments, result contents): each caller renders them its own way. The
chat reader here (``chat_turns``, ``chat_answer``) is what a dialect without a native reader
answers through its chat view (``to_chat`` / ``assistant_message``); a dialect that keeps more
than chat can say (Anthropic's ``is_error``, Responses' shell calls) reads its own shape.
``instructions_in`` and ``first_user_in`` read a request's opening from its turns (what
``WireDialect.instructions`` / ``first_user_text`` answer by default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from orchard_rec.dialects.content import INSTRUCTION_ROLES

__all__ = [
    "Block",
    "Turn",
    "call_block",
    "chat_answer",
    "chat_message_turn",
    "chat_parts",
    "chat_turns",
    "first_user_in",
    "image_block",
    "instructions_in",
    "merge_adjacent",
    "other",
    "parts_with",
    "result_block",
    "text_block",
    "turn_text",
]

Block = dict[str, Any]
Turn = dict[str, Any]


def text_block(text: Any, kind: str = "text") -> Block:
    return {"kind": kind, "text": text if isinstance(text, str) else ""}


def other(value: Any) -> Block:
    return {"kind": "other", "value": value}


def image_block(url: Any, part: Any) -> Block:
    return {"kind": "image", "url": url if isinstance(url, str) else None, "part": part}


def call_block(name: Any, call_id: Any, arguments: Any) -> Block:
    return {
        "kind": "tool_call",
        "name": name if isinstance(name, str) else "",
        "id": call_id if isinstance(call_id, str) else None,
        "arguments": arguments,
    }


def result_block(call_id: Any, content: Any, error: bool = False) -> Block:
    return {
        "kind": "tool_result",
        "id": call_id if isinstance(call_id, str) else None,
        "content": content,
        "error": error,
    }


def parts_with(content: Any, part: Callable[[dict[str, Any]], Block | None]) -> list[Block]:
    """Content (a string, or a list of typed parts each read by ``part``) as blocks; a part
    ``part`` does not read (None) and anything not a part become ``other`` blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [text_block(content)] if content else []
    if not isinstance(content, list):
        return [other(content)]
    out: list[Block] = []
    for p in content:
        if isinstance(p, str):
            out.append(text_block(p))
            continue
        b = part(p) if isinstance(p, dict) else None
        out.append(b if b is not None else other(p))
    return out


def _chat_part(p: dict[str, Any]) -> Block | None:
    t = p.get("type")
    if t == "text":
        return text_block(p.get("text"))
    if t == "image_url":
        url = p.get("image_url")
        return image_block(url.get("url") if isinstance(url, dict) else url, p)
    if t == "refusal":
        return text_block(p.get("refusal"))
    return None


def chat_parts(content: Any) -> list[Block]:
    """A chat message's content as blocks."""
    return parts_with(content, _chat_part)


def chat_message_turn(m: dict[str, Any]) -> Turn:
    """One chat message as a turn: its reasoning, content (a tool message's as its result) and calls."""
    role = str(m.get("role", "?"))
    blocks: list[Block] = []
    for key in ("reasoning_content", "reasoning"):
        if isinstance(m.get(key), str) and m[key]:
            blocks.append(text_block(m[key], "reasoning"))
    if role == "tool":
        blocks.append(result_block(m.get("tool_call_id"), m.get("content")))
    else:
        blocks.extend(chat_parts(m.get("content")))
    for tc in m.get("tool_calls") or ():
        if not isinstance(tc, dict):
            continue
        fn: dict[str, Any] = tc["function"] if isinstance(tc.get("function"), dict) else {}
        custom: dict[str, Any] = tc["custom"] if isinstance(tc.get("custom"), dict) else {}
        raw = fn.get("arguments") if "arguments" in fn else custom.get("input")
        blocks.append(call_block(fn.get("name") or custom.get("name"), tc.get("id"), raw))
    return {"role": role, "blocks": blocks}


def chat_turns(chat: Any) -> list[Turn] | None:
    """A chat completions request's messages as turns (None: it has no message list)."""
    msgs = chat.get("messages") if isinstance(chat, dict) else None
    if not isinstance(msgs, list):
        return None
    return [chat_message_turn(m) for m in msgs if isinstance(m, dict)]


def chat_answer(msg: dict[str, Any] | None) -> Turn | None:
    """An answer's assistant message (``WireDialect.assistant_message``) as a turn; None when it
    says nothing (an error, a non-generation call)."""
    if msg is None or not (msg.get("content") or msg.get("tool_calls") or msg.get("reasoning_content")):
        return None
    turn = chat_message_turn(msg)
    turn["role"] = "assistant"
    return turn


def merge_adjacent(turns: Iterable[Turn]) -> list[Turn]:
    """Consecutive assistant turns as one (the items of one model turn: reasoning, text, calls)."""
    out: list[Turn] = []
    for t in turns:
        if out and t["role"] == "assistant" and out[-1]["role"] == "assistant":
            out[-1]["blocks"].extend(t["blocks"])
        else:
            out.append(t)
    return out


def turn_text(turn: Turn) -> str:
    """A turn's text blocks joined (its reasoning, calls, results and images left out)."""
    return "".join(b["text"] for b in turn["blocks"] if b.get("kind") == "text")


def instructions_in(turns: Iterable[Turn]) -> str | None:
    """The text of the first system/developer turn when one comes before the first user turn, else None."""
    for t in turns:
        if t["role"] == "user":
            return None
        if t["role"] in INSTRUCTION_ROLES:
            return turn_text(t)
    return None


def first_user_in(turns: Iterable[Turn]) -> str | None:
    """The text of the first user turn, or None without one."""
    for t in turns:
        if t["role"] == "user":
            return turn_text(t)
    return None
