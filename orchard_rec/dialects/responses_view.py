"""The Responses dialect's stored requests and answers as neutral turns (``dialects.view``), and
what a request's opening says (``opening``, ``instructions``, ``first_user_text``, ``tool_names``).

Read natively, not through the chat view: its items say more than chat can (shell calls, custom
tool calls and their outputs, reasoning summaries), and the items of one model turn (reasoning,
message, calls) become one assistant turn. Part of the Responses dialect (``responses``, which
hands these out as its ``turns``, ``answer_turn``, ``opening`` ...); a module of its own for size.
"""

from __future__ import annotations

from typing import Any

from orchard_rec.dialects.base import head_until_user
from orchard_rec.dialects.content import first_instructions, first_user, text_of, tool_names_in
from orchard_rec.dialects.view import (
    Block,
    Turn,
    call_block,
    image_block,
    merge_adjacent,
    other,
    parts_with,
    result_block,
    text_block,
)

__all__ = ["answer_turn", "first_user_text", "instructions", "item_turn", "opening", "tool_names", "turns"]

_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})


def _part(p: dict[str, Any]) -> Block | None:
    t = p.get("type")
    if t in ("input_text", "output_text", "text", "summary_text"):
        return text_block(p.get("text"))
    if t == "refusal":
        return text_block(p.get("refusal"))
    if t == "input_image":
        return image_block(p.get("image_url"), p)
    return None


def _reasoning(item: dict[str, Any]) -> str:
    """A reasoning item's summary paragraphs, else its content."""
    for key in ("summary", "content"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "\n".join(
                p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
            if text:
                return text
    return ""


def item_turn(item: Any) -> Turn:
    """One input or output item as a turn (a call or reasoning: an assistant turn; an output: a tool's)."""
    if isinstance(item, str):
        return {"role": "user", "blocks": [text_block(item)]}
    if not isinstance(item, dict):
        return {"role": "?", "blocks": [other(item)]}
    t = item.get("type")
    cid = item.get("call_id")
    if t == "function_call":
        return {"role": "assistant", "blocks": [call_block(item.get("name"), cid, item.get("arguments"))]}
    if t == "custom_tool_call":
        return {"role": "assistant", "blocks": [call_block(item.get("name"), cid, item.get("input"))]}
    if t == "local_shell_call":
        action: dict[str, Any] = item["action"] if isinstance(item.get("action"), dict) else {}
        return {
            "role": "assistant",
            "blocks": [call_block("local_shell", cid, {"command": action.get("command")})],
        }
    if t in _OUTPUTS:
        return {"role": "tool", "blocks": [result_block(cid, item.get("output"))]}
    if t == "reasoning":
        return {"role": "assistant", "blocks": [text_block(_reasoning(item), "reasoning")]}
    if "role" in item and t in (None, "message"):
        return {"role": str(item["role"]), "blocks": parts_with(item.get("content"), _part)}
    return {"role": "?", "blocks": [other(item)]}


def turns(body: dict[str, Any]) -> list[Turn]:
    """A Responses request as turns: its instructions, then its input items."""
    out: list[Turn] = []
    if body.get("instructions"):
        out.append({"role": "system", "blocks": parts_with(body["instructions"], _part)})
    inp = body.get("input")
    if isinstance(inp, str):
        out.append({"role": "user", "blocks": parts_with(inp, _part)})
    elif isinstance(inp, list):
        out += merge_adjacent(item_turn(i) for i in inp)
    return out


def answer_turn(response: dict[str, Any]) -> Turn | None:
    """A Responses object's output items as one assistant turn (None: no output list)."""
    output = response.get("output")
    if not isinstance(output, list):
        return None
    return {"role": "assistant", "blocks": [b for i in output for b in item_turn(i)["blocks"]]}


def opening(body: dict[str, Any]) -> list[Any] | None:
    """What every call of one conversation repeats: the instructions and the input up to the first user message."""
    inp = body.get("input")
    items = (
        [{"role": "user", "content": inp}] if isinstance(inp, str) else (inp if isinstance(inp, list) else [])
    )
    return head_until_user([body.get("instructions")], items)


def instructions(body: dict[str, Any]) -> str | None:
    """The ``instructions``, else the first system/developer input item before the first user one."""
    text = body.get("instructions")
    return text_of(text) if text else first_instructions(body.get("input"))


def first_user_text(body: dict[str, Any]) -> str | None:
    """The text of the first user input item (a string ``input`` is that message)."""
    inp = body.get("input")
    return inp if isinstance(inp, str) else first_user(inp)


def tool_names(body: dict[str, Any]) -> list[str]:
    """The names of the tools offered (function, custom and built-in tools that have one)."""
    return tool_names_in(body.get("tools"))
