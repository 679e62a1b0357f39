"""Reading a rendered ChatML prompt back into messages (the demo model's side of token-in).

A token-in/token-out client sends the demo server token ids, not messages; the scripted
model needs the conversation to decide what to do, so it decodes the ids and parses the
demo template's own rendering back: system (with its ``<tools>`` list), user, assistant
(``<tool_call>`` blocks) and ``<tool_response>`` turns.
"""

from __future__ import annotations

import json
import re
from typing import Any

from orchard_rec.demo.template import IMAGE_MARKUP

__all__ = ["parse_chatml"]

_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)
_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
_RESP = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


def parse_chatml(text: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] | None = None
    for role, body in _TURN.findall(text):
        if role == "system" and "<tools>" in body:
            head, _, rest = body.partition("\n\n# Tools")
            block = rest.split("XML tags:\n<tools>", 1)[-1].split("\n</tools>", 1)[0]
            tools = [json.loads(line) for line in block.strip().splitlines() if line.strip()]
            if head:
                messages.append({"role": "system", "content": head})
            continue
        if role == "user" and body.startswith("<tool_response>"):
            for out in _RESP.findall(body):
                messages.append({"role": "tool", "content": out})
            continue
        if role == "assistant":
            calls: list[dict[str, Any]] = []
            for raw in _CALL.findall(body):
                try:
                    c = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                calls.append(
                    {
                        "id": f"call_{len(calls)}",
                        "type": "function",
                        "function": {"name": c.get("name"), "arguments": json.dumps(c.get("arguments"))},
                    }
                )
            content = _CALL.sub("", body).strip() or None
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
            continue
        messages.append({"role": role, "content": _parts(body)})
    return messages, tools


def _parts(body: str) -> Any:
    """A turn's text, as chat parts when it shows images (the template's image markup)."""
    if IMAGE_MARKUP not in body:
        return body
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(body.split(IMAGE_MARKUP)):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts
