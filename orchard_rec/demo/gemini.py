"""The demo server's own reading of Gemini ``generateContent`` requests and writing of its answers.

Written apart from ``orchard_rec.dialects.gemini`` (the proxy's translation), as ``demo.wire`` is
for Responses and Messages: passthrough demos and tests drive the proxy against this server, so a
proxy bug must not be mirrored here. The answer is built from a ``Generation`` the way Google's
API answers (https://ai.google.dev/api/generate-content): ``candidates[0].content.parts`` (text,
``thought`` text, whole ``functionCall`` parts with an ``id``), ``finishReason``, ``usageMetadata``;
a stream is one ``data:`` event per token piece, CRLF-framed, the calls and finish in the last.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from orchard_rec.demo.model import Generation, Section

__all__ = ["gemini_events", "gemini_input", "gemini_object"]

Pieces = Callable[[Section], list[str]]


def _text(parts: Any) -> str:
    return "".join(str(p["text"]) for p in parts or () if isinstance(p, dict) and "text" in p)


def _lower(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _lower(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = out["type"].lower()
        return out
    return [_lower(x) for x in schema] if isinstance(schema, list) else schema


def gemini_input(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """``(chat messages, chat tools, max tokens)`` for a ``generateContent`` request."""
    msgs: list[dict[str, Any]] = []
    system = body.get("systemInstruction")
    if system:
        msgs.append(
            {"role": "system", "content": system if isinstance(system, str) else _text(system.get("parts"))}
        )
    for c in body.get("contents") or []:
        parts = [p for p in c.get("parts") or [] if isinstance(p, dict)]
        if c.get("role") == "model":
            turn: dict[str, Any] = {
                "role": "assistant",
                "content": _text(p for p in parts if not p.get("thought")) or None,
            }
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            if calls:
                turn["tool_calls"] = [
                    {
                        "id": fc.get("id") or f"{fc.get('name')}-{i}",
                        "type": "function",
                        "function": {"name": fc.get("name"), "arguments": json.dumps(fc.get("args") or {})},
                    }
                    for i, fc in enumerate(calls)
                ]
            msgs.append(turn)
            continue
        for i, p in enumerate(p for p in parts if "functionResponse" in p):
            fr = p["functionResponse"]
            resp = fr.get("response")
            out = (
                resp["output"]
                if isinstance(resp, dict) and isinstance(resp.get("output"), str)
                else json.dumps(resp)
            )
            msgs.append(
                {"role": "tool", "tool_call_id": fr.get("id") or f"{fr.get('name')}-{i}", "content": out}
            )
        rest = [p for p in parts if "functionResponse" not in p]
        if any("inlineData" in p for p in rest):
            content: Any = [
                {
                    "type": "image_url",
                    "image_url": {
                        "url": f"data:{p['inlineData'].get('mimeType')};base64,{p['inlineData'].get('data')}"
                    },
                }
                if "inlineData" in p
                else {"type": "text", "text": str(p.get("text", ""))}
                for p in rest
            ]
            msgs.append({"role": "user", "content": content})
        elif rest:
            msgs.append({"role": "user", "content": _text(rest)})
    tools = []
    for t in body.get("tools") or []:
        for fd in t.get("functionDeclarations") or []:
            params = (
                fd.get("parametersJsonSchema")
                or _lower(fd.get("parameters"))
                or {"type": "object", "properties": {}}
            )
            fn: dict[str, Any] = {"name": fd.get("name"), "parameters": params}
            if fd.get("description"):
                fn["description"] = fd["description"]
            tools.append({"type": "function", "function": fn})
    return msgs, tools, (body.get("generationConfig") or {}).get("maxOutputTokens")


def _call(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "functionCall": {
            "id": "call_" + uuid.uuid4().hex[:12],
            "name": call["name"],
            "args": json.loads(call["arguments"]),
        }
    }


def _answer(parts: list[dict[str, Any]], gen: Generation, model: str, rid: str, last: bool) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    out: dict[str, Any] = {"candidates": [cand]}
    if last:
        cand["finishReason"] = "MAX_TOKENS" if gen.finish_reason == "length" else "STOP"
        n, m = len(gen.prompt_ids), len(gen.ids)
        out["usageMetadata"] = {"promptTokenCount": n, "candidatesTokenCount": m, "totalTokenCount": n + m}
    out["modelVersion"] = model
    out["responseId"] = rid
    return out


def gemini_object(gen: Generation, model: str) -> dict[str, Any]:
    """The ``GenerateContentResponse`` answering with ``gen``."""
    parts: list[dict[str, Any]] = []
    if gen.reasoning:
        parts.append({"text": gen.reasoning, "thought": True})
    if gen.content:
        parts.append({"text": gen.content})
    parts += [_call(c) for c in gen.tool_calls]
    return _answer(parts, gen, model, uuid.uuid4().hex[:22], True)


def gemini_events(gen: Generation, model: str, pieces: Pieces) -> list[dict[str, Any]]:
    """The ``streamGenerateContent`` events answering with ``gen`` (text streamed token by token)."""
    rid = uuid.uuid4().hex[:22]
    events = []
    for s in gen.sections:
        if s.kind in ("reasoning", "content") and s.text:
            for p in pieces(s):
                part: dict[str, Any] = {"text": p, "thought": True} if s.kind == "reasoning" else {"text": p}
                events.append(_answer([part], gen, model, rid, False))
    last = [_call(c) for c in gen.tool_calls] or [{"text": ""}]
    events.append(_answer(last, gen, model, rid, True))
    return events
