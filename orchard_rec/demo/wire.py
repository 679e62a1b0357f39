"""The demo server's own reading of Responses and Messages requests, and writing of their answers.

Deliberately written apart from ``orchard_rec.dialects`` (the proxy's translations): the tests
drive the proxy against this server, so a translation bug in the proxy must not be mirrored
here, where it would be invisible. Answers are built straight from a ``Generation`` (its
sections: reasoning, content, tool calls), the way vLLM's own ``/v1/responses`` and
``/v1/messages`` servers build them from a generation, not from a chat completion.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from orchard_rec.demo.model import Generation, Section

__all__ = [
    "message_events",
    "message_object",
    "messages_input",
    "response_events",
    "response_object",
    "responses_input",
]

Event = tuple[str, dict[str, Any]]
Pieces = Callable[[Section], list[str]]
"""A section's text as it is streamed: one piece per generated token."""


def _new(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _plain(content: Any) -> str:
    """The text of a content value: a string, or the ``text`` of each part that has one."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p["text"]) for p in content if isinstance(p, dict) and "text" in p)
    return "" if content is None else json.dumps(content)


def _image_url(p: dict[str, Any]) -> str | None:
    """The URL of an image part of any dialect (chat ``image_url``, Responses ``input_image``,
    Anthropic ``image`` with a ``base64`` or ``url`` source); None for other parts."""
    t = p.get("type")
    if t == "image_url":
        u = p.get("image_url")
        return str(u.get("url") if isinstance(u, dict) else u)
    if t == "input_image":
        u = p.get("image_url")
        return str(u.get("url") if isinstance(u, dict) else u or p.get("file_id") or "")
    if t == "image":
        src = p.get("source") or {}
        if src.get("type") == "base64":
            return f"data:{src.get('media_type') or 'image/png'};base64,{src.get('data') or ''}"
        return str(src.get("url") or "")
    return None


def _with_images(content: Any) -> Any:
    """A content value as chat content: its text when it has no image, else chat parts in order."""
    if not isinstance(content, list) or not any(
        isinstance(p, dict) and _image_url(p) is not None for p in content
    ):
        return _plain(content)
    parts: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        url = _image_url(p)
        if url is not None:
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif "text" in p:
            parts.append({"type": "text", "text": str(p["text"])})
    return parts


def _function(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
    if description:
        fn["description"] = description
    return {"type": "function", "function": fn}


# ==== OpenAI Responses ===========================================================================


def _responses_tools(tools: Any, custom: set[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in tools if isinstance(tools, list) else []:
        kind = t.get("type")
        if kind == "function":
            out.append(_function(t.get("name"), t.get("description"), t.get("parameters")))
        elif kind == "custom":  # free-form input: a function of one string
            custom.add(t.get("name"))
            schema = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
            out.append(_function(t.get("name"), t.get("description") or "", schema))
        elif kind == "namespace":
            out += _responses_tools(t.get("tools"), custom)
        # hosted tools (web_search ...) are not the model's to call
    return out


def responses_input(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], set[str], Any]:
    """``(chat messages, chat tools, names of custom tools, max tokens)`` for a Responses request."""
    msgs: list[dict[str, Any]] = []
    if body.get("instructions"):
        msgs.append({"role": "system", "content": _plain(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    thinking = ""
    for it in items if isinstance(items, list) else []:
        kind = it.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(it.get("role"), it.get("role") or "user")
            msgs.append({"role": role, "content": _with_images(it.get("content"))})
            if role == "assistant" and thinking:
                msgs[-1]["reasoning_content"], thinking = thinking, ""
        elif kind == "reasoning":
            thinking += _plain(it.get("content")) or _plain(it.get("summary"))
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "function_call":
                args = it.get("arguments") or ""
            else:
                args = json.dumps({"input": it.get("input", "")})
            call = {
                "id": it.get("call_id"),
                "type": "function",
                "function": {"name": it.get("name"), "arguments": args},
            }
            prev = msgs[-1] if msgs else {}
            if prev.get("role") == "assistant":
                prev.setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if thinking:
                    msgs[-1]["reasoning_content"], thinking = thinking, ""
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = it.get("output")
            msgs.append({"role": "tool", "tool_call_id": it.get("call_id"), "content": _with_images(out)})
    custom: set[str] = set()
    tools = _responses_tools(body.get("tools"), custom)
    return msgs, tools, custom, body.get("max_output_tokens")


def _response(body: dict[str, Any], model: str, status: str) -> dict[str, Any]:
    return {
        "id": _new("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model") or model,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", False),
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation", "disabled"),
        "usage": None,
        "metadata": body.get("metadata") or {},
    }


def _response_usage(gen: Generation) -> dict[str, Any]:
    n_in, n_out = len(gen.prompt_ids), len(gen.ids)
    return {
        "input_tokens": n_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n_in + n_out,
    }


def _call_output(call: dict[str, Any], custom: set[str]) -> dict[str, Any]:
    if call["name"] in custom:
        return {
            "type": "custom_tool_call",
            "id": _new("ctc_"),
            "call_id": _new("call_"),
            "name": call["name"],
            "input": json.loads(call["arguments"]).get("input", ""),
            "status": "completed",
        }
    return {
        "type": "function_call",
        "id": _new("fc_"),
        "call_id": _new("call_"),
        "name": call["name"],
        "arguments": call["arguments"],
        "status": "completed",
    }


def _finish(resp: dict[str, Any], gen: Generation) -> None:
    resp["usage"] = _response_usage(gen)
    if gen.finish_reason == "length":
        resp["status"] = "incomplete"
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        resp["status"] = "completed"


def response_object(body: dict[str, Any], gen: Generation, custom: set[str], model: str) -> dict[str, Any]:
    """The Responses object answering ``body`` with ``gen``."""
    resp = _response(body, model, "completed")
    if gen.reasoning:
        resp["output"].append(
            {
                "type": "reasoning",
                "id": _new("rs_"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": gen.reasoning}],
            }
        )
    if gen.content:
        resp["output"].append(
            {
                "type": "message",
                "id": _new("msg_"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": gen.content, "annotations": [], "logprobs": []}],
            }
        )
    resp["output"] += [_call_output(c, custom) for c in gen.tool_calls]
    _finish(resp, gen)
    return resp


Emit = Callable[..., None]


def _item_groups(gen: Generation) -> list[tuple[str, list[Section]]]:
    """The generation's sections, consecutive ones of one kind (not tool calls) in one group:
    each group makes one output item."""
    groups: list[tuple[str, list[Section]]] = []
    for s in gen.sections:
        if s.kind == "eos" or (s.kind != "tool_call" and not s.text):
            continue
        if groups and groups[-1][0] == s.kind and s.kind != "tool_call":
            groups[-1][1].append(s)
        else:
            groups.append((s.kind, [s]))
    return groups


def _reasoning_events(emit: Emit, n: int, secs: list[Section], pieces: Pieces) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": _new("rs_"), "summary": [], "content": []}
    emit("response.output_item.added", output_index=n, item=dict(item))
    text = ""
    for s in secs:
        for p in pieces(s):
            text += p
            emit(
                "response.reasoning_text.delta",
                item_id=item["id"],
                output_index=n,
                content_index=0,
                delta=p,
            )
    emit("response.reasoning_text.done", item_id=item["id"], output_index=n, content_index=0, text=text)
    item["content"] = [{"type": "reasoning_text", "text": text}]
    return item


def _message_events(emit: Emit, n: int, secs: list[Section], pieces: Pieces) -> dict[str, Any]:
    item: dict[str, Any] = {
        "type": "message",
        "id": _new("msg_"),
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    emit("response.output_item.added", output_index=n, item=dict(item))
    part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    emit(
        "response.content_part.added",
        item_id=item["id"],
        output_index=n,
        content_index=0,
        part=dict(part),
    )
    for s in secs:
        for p in pieces(s):
            part["text"] += p
            emit(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=n,
                content_index=0,
                delta=p,
                logprobs=[],
            )
    emit(
        "response.output_text.done",
        item_id=item["id"],
        output_index=n,
        content_index=0,
        text=part["text"],
        logprobs=[],
    )
    emit("response.content_part.done", item_id=item["id"], output_index=n, content_index=0, part=part)
    item["content"], item["status"] = [part], "completed"
    return item


def _call_events(emit: Emit, n: int, call: dict[str, Any], custom: set[str]) -> dict[str, Any]:
    item = _call_output(call, custom)
    emit("response.output_item.added", output_index=n, item={**item, "status": "in_progress"})
    if item["type"] == "function_call":
        emit(
            "response.function_call_arguments.delta",
            item_id=item["id"],
            output_index=n,
            delta=item["arguments"],
        )
        emit(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=n,
            name=item["name"],
            arguments=item["arguments"],
        )
    else:
        emit(
            "response.custom_tool_call_input.done",
            item_id=item["id"],
            output_index=n,
            input=item["input"],
        )
    return item


def response_events(
    body: dict[str, Any], gen: Generation, custom: set[str], model: str, pieces: Pieces
) -> list[Event]:
    """The Responses event stream answering ``body`` with ``gen`` (text streamed token by token)."""
    events: list[Event] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    resp = _response(body, model, "in_progress")
    emit("response.created", response=dict(resp))
    emit("response.in_progress", response=dict(resp))
    out: list[dict[str, Any]] = []
    for kind, secs in _item_groups(gen):
        n = len(out)
        if kind == "reasoning":
            item = _reasoning_events(emit, n, secs, pieces)
        elif kind == "content":
            item = _message_events(emit, n, secs, pieces)
        else:
            item = _call_events(emit, n, secs[0].call or {"name": "", "arguments": "{}"}, custom)
        emit("response.output_item.done", output_index=n, item=item)
        out.append(item)
    resp["output"] = out
    _finish(resp, gen)
    emit("response.incomplete" if resp["status"] == "incomplete" else "response.completed", response=resp)
    return events


# ==== Anthropic Messages ===========================================================================


def messages_input(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """``(chat messages, chat tools, max tokens)`` for a Messages request."""
    msgs: list[dict[str, Any]] = []
    if body.get("system"):
        msgs.append({"role": "system", "content": _plain(body["system"])})
    for m in body.get("messages") or []:
        role, content = m.get("role"), m.get("content")
        if isinstance(content, str) or role == "system":
            msgs.append({"role": role, "content": _plain(content)})
            continue
        blocks = content if isinstance(content, list) else []
        if role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": None}
            texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
            if texts:
                turn["content"] = "".join(texts)
            thinking = "".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking")
            if thinking:
                turn["reasoning_content"] = thinking
            calls = [
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})},
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            if calls:
                turn["tool_calls"] = calls
            msgs.append(turn)
            continue
        for b in blocks:  # tool results answer the previous turn's calls: they come first
            if b.get("type") == "tool_result":
                inner = b.get("content")
                msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _plain(inner)})
                shots = [
                    {"type": "image_url", "image_url": {"url": _image_url(x)}}
                    for x in (inner if isinstance(inner, list) else [])
                    if isinstance(x, dict) and x.get("type") == "image"
                ]
                if shots:  # a screenshot a tool returned follows as a user turn (as vLLM's server does)
                    msgs.append({"role": "user", "content": shots})
        rest = [b for b in blocks if b.get("type") in ("text", "image")]
        if any(b.get("type") == "image" for b in rest):
            msgs.append({"role": role or "user", "content": _with_images(rest)})
        elif rest:
            msgs.append({"role": role or "user", "content": "".join(b.get("text", "") for b in rest)})
    tools = [
        _function(t.get("name"), t.get("description"), t.get("input_schema"))
        for t in body.get("tools") or []
        if "input_schema" in t
    ]
    return msgs, tools, body.get("max_tokens")


def _stop_reason(gen: Generation) -> str:
    if gen.tool_calls:
        return "tool_use"
    return "max_tokens" if gen.finish_reason == "length" else "end_turn"


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": _new("toolu_"),
        "name": call["name"],
        "input": json.loads(call["arguments"]),
    }


def message_object(body: dict[str, Any], gen: Generation, model: str) -> dict[str, Any]:
    """The Anthropic message answering ``body`` with ``gen``."""
    content: list[dict[str, Any]] = []
    if gen.reasoning:
        content.append({"type": "thinking", "thinking": gen.reasoning, "signature": ""})
    if gen.content:
        content.append({"type": "text", "text": gen.content})
    content += [_tool_use(c) for c in gen.tool_calls]
    return {
        "id": _new("msg_"),
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or model,
        "content": content,
        "stop_reason": _stop_reason(gen),
        "stop_sequence": None,
        "usage": {
            "input_tokens": len(gen.prompt_ids),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": len(gen.ids),
        },
    }


def message_events(body: dict[str, Any], gen: Generation, model: str, pieces: Pieces) -> list[Event]:
    """The Messages event stream answering ``body`` with ``gen`` (text streamed token by token)."""
    head = message_object(body, gen, model)
    head.update(content=[], stop_reason=None)
    head["usage"] = {**head["usage"], "output_tokens": 0}
    events: list[Event] = [
        ("message_start", {"type": "message_start", "message": head}),
        ("ping", {"type": "ping"}),
    ]
    index = -1
    open_kind: str | None = None

    def block(kind: str, start: dict[str, Any]) -> None:
        nonlocal index, open_kind
        close()
        index += 1
        open_kind = kind
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
        )

    def delta(d: dict[str, Any]) -> None:
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}))

    def close() -> None:
        nonlocal open_kind
        if open_kind is None:
            return
        if open_kind == "thinking":
            delta({"type": "signature_delta", "signature": ""})
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        open_kind = None

    for s in gen.sections:
        if s.kind == "tool_call" and s.call is not None:
            use = _tool_use(s.call)
            block("tool_use", {**use, "input": {}})
            delta({"type": "input_json_delta", "partial_json": s.call["arguments"]})
        elif s.kind in ("reasoning", "content") and s.text:
            kind = "thinking" if s.kind == "reasoning" else "text"
            if open_kind != kind:
                block(
                    kind,
                    {"type": "thinking", "thinking": "", "signature": ""}
                    if kind == "thinking"
                    else {"type": "text", "text": ""},
                )
            for p in pieces(s):
                delta(
                    {"type": "thinking_delta", "thinking": p}
                    if kind == "thinking"
                    else {"type": "text_delta", "text": p}
                )
    close()
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(gen), "stop_sequence": None},
                "usage": {"output_tokens": len(gen.ids)},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events
