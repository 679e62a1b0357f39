"""OpenAI Responses (``POST /v1/responses``): to and from chat, its events, its opening.

Token-aware model servers (vLLM, SGLang) return token ids on chat completions, while Codex
speaks only Responses: in token mode the request becomes a chat completions request, and the
answer is turned back into a Responses object or event stream. No I/O here.

Non-obvious bits:
- ``namespace`` tools (Codex's ``multi_agent_v1``) are flattened; hosted tools
  (``web_search``, ``file_search`` ...) have no chat equivalent and are dropped.
- ``developer`` input messages become ``system`` messages.
- Custom (free-form) tools are exposed as functions taking ``{"input": str}`` and mapped
  back to ``custom_tool_call`` items.
- A stream ends with ``response.completed``, ``response.incomplete`` or ``response.failed``
  (the event's name, never text inside it).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from orchard_rec.dialects import responses_view
from orchard_rec.dialects.base import (
    TOOL_SCHEMA,
    Route,
    WireDialect,
    answer_tokens,
    ids_of_type,
    openapi_post,
)
from orchard_rec.dialects.content import assistant_turn, hex_id, text_of
from orchard_rec.dialects.images import ImageRef, responses_images
from orchard_rec.dialects.sse import encode
from orchard_rec.dialects.view import Turn
from orchard_rec.errors import BadRequest
from orchard_rec.records import Dialect

__all__ = [
    "DIALECT",
    "TERMINAL_EVENTS",
    "ResponsesRequest",
    "ResponsesStream",
    "assemble",
    "assistant_message",
    "chat_to_responses",
    "custom_tools",
    "extract_tokens",
    "stream_error_event",
    "to_chat",
]

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""The events that end a Responses stream."""


class ResponsesRequest(BaseModel):
    """The fields of a Responses request we read; the rest pass through untouched."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: Any = None
    input: str | list[dict[str, Any]]
    instructions: Any = None
    tools: list[dict[str, Any]] | None = None
    stream: bool | None = None


def validate(body: dict[str, Any]) -> ResponsesRequest:
    """The checks the real API makes before generating (a 400 in its words, never a proxy error)."""
    try:
        return ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        field = str(loc[0]) if loc else None
        if field == "tools":
            raise BadRequest("tools: must be a list of tool objects", param="tools") from None
        if field == "stream":
            raise BadRequest("'stream' must be a boolean", param="stream") from None
        raise BadRequest("input: a string or a list of input items is required", param="input") from None


def _responses_content(content: Any) -> Any:
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        t = p.get("type")
        if t in ("input_text", "output_text", "text", "summary_text"):
            parts.append({"type": "text", "text": p.get("text", "")})
        elif t == "refusal":
            parts.append({"type": "text", "text": p.get("refusal", "")})
        elif t == "input_image":
            url = p.get("image_url") or p.get("file_id")
            if url:
                parts.append(
                    {"type": "image_url", "image_url": {"url": url, "detail": p.get("detail", "auto")}}
                )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _tool_output_content(out: Any) -> Any:
    """A tool call's output as a chat tool message's content: its text, or text and image parts
    when it holds ``input_image`` items (screenshots), which a vision-language model must see."""
    if isinstance(out, str):
        return out
    if isinstance(out, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in out):
        return _responses_content(out)
    return text_of(out)


def _responses_tools(tools: Any) -> tuple[list[dict[str, Any]], set[str], list[str]]:
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    dropped: list[str] = []
    for t in tools or ():
        if not isinstance(t, dict):
            continue
        kind = t.get("type")
        if kind == "function":
            fn = {
                "name": t.get("name"),
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            }
            if t.get("description"):
                fn["description"] = t["description"]
            out.append({"type": "function", "function": fn})
        elif kind == "namespace":
            sub, sub_custom, sub_dropped = _responses_tools(t.get("tools"))
            out.extend(sub)
            custom |= sub_custom
            dropped.extend(sub_dropped)
        elif kind == "custom":
            if isinstance(t.get("name"), str):
                custom.add(t["name"])
            fn = {
                "name": t.get("name"),
                "description": t.get("description") or "",
                "parameters": {
                    "type": "object",
                    "properties": {"input": {"type": "string"}},
                    "required": ["input"],
                },
            }
            out.append({"type": "function", "function": fn})
        else:
            dropped.append(str(kind))
    return out, custom, dropped


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as a chat completions request."""
    fold = InputFold(body)
    inp = body.get("input")
    for item in inp if isinstance(inp, list) else ():
        fold.feed(item)
    return chat_request(body, fold.messages)


class InputFold:
    """The chat messages of a Responses request's instructions and input items, fed one item at a
    time (what an item becomes depends on the items before it: reasoning waits for the assistant
    message it belongs to, a function call joins the assistant message before it). ``resumed``
    continues a copy (a resent history's translation reused up to its new items, ``proxy.tochat``)."""

    __slots__ = ("messages", "pending_reasoning")

    def __init__(self, body: dict[str, Any] | None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.pending_reasoning: str | None = None
        if body is None:
            return
        if body.get("instructions"):
            self.messages.append({"role": "system", "content": text_of(body["instructions"])})
        inp = body.get("input")
        if isinstance(inp, str):
            self.messages.append({"role": "user", "content": inp})

    def resumed(self) -> InputFold:
        """A copy to feed more items to, sharing no object ``feed`` may change with this one."""
        out = InputFold(None)
        out.messages = self.messages.copy()
        out.pending_reasoning = self.pending_reasoning
        if out.messages:  # the only message a later item changes (a function call joining it)
            last = out.messages[-1] = dict(out.messages[-1])
            if "tool_calls" in last:
                last["tool_calls"] = list(last["tool_calls"])
        return out

    def feed(self, item: Any) -> None:
        if not isinstance(item, dict):
            return
        messages = self.messages
        pending_reasoning = self.pending_reasoning
        kind = item.get("type") or ("message" if "role" in item else None)
        last = messages[-1] if messages else None
        if kind == "message":
            role = item.get("role", "user")
            if role == "developer":
                role = "system"
            msg: dict[str, Any] = {"role": role, "content": _responses_content(item.get("content"))}
            if role == "assistant" and pending_reasoning:
                msg["reasoning_content"] = pending_reasoning
                pending_reasoning = None
            messages.append(msg)
        elif kind == "reasoning":
            text = text_of(item.get("content")) or text_of(item.get("summary"))
            pending_reasoning = (pending_reasoning or "") + text
        elif kind in ("function_call", "custom_tool_call"):
            args = (
                item.get("arguments")
                if kind == "function_call"
                else orjson.dumps({"input": item.get("input", "")}).decode()
            )
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": args or ""},
            }
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if pending_reasoning:
                    msg["reasoning_content"] = pending_reasoning
                    pending_reasoning = None
                messages.append(msg)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": _tool_output_content(out),
                }
            )
        # item_reference and unknown items carry nothing a chat model can see
        self.pending_reasoning = pending_reasoning


def chat_request(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request for a Responses ``body`` whose instructions and input translated to ``messages``."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools, _custom, _dropped = _responses_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    tc = body.get("tool_choice")
    if isinstance(tc, str):
        chat["tool_choice"] = tc
    elif isinstance(tc, dict) and tc.get("name"):
        chat["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    for k in (
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "stream",
        "user",
        "seed",
        "stop",
        "top_logprobs",
    ):
        if body.get(k) is not None:
            chat[k] = body[k]
    effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort:
        chat["reasoning_effort"] = effort
    return chat


def custom_tools(body: dict[str, Any]) -> set[str]:
    return _responses_tools(body.get("tools"))[1]


def _usage_responses(u: Any) -> dict[str, Any] | None:
    if not isinstance(u, dict):
        return None
    return {
        "input_tokens": u.get("prompt_tokens", 0),
        "input_tokens_details": {
            "cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
        },
        "output_tokens": u.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.get("total_tokens", u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)),
    }


def _response_shell(req: dict[str, Any], rid: str, created: int, status: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "model": req.get("model"),
        "output": [],
        "parallel_tool_calls": req.get("parallel_tool_calls", True),
        "previous_response_id": req.get("previous_response_id"),
        "reasoning": req.get("reasoning") or {"effort": None, "summary": None},
        "store": req.get("store", False),
        "temperature": req.get("temperature"),
        "text": req.get("text") or {"format": {"type": "text"}},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p"),
        "truncation": req.get("truncation", "disabled"),
        "usage": None,
        "metadata": req.get("metadata") or {},
    }


def _call_item(
    call_id: str, name: str, arguments: str, custom: set[str], status: str = "completed"
) -> dict[str, Any]:
    if name in custom:
        try:
            inp = orjson.loads(arguments).get("input", "")
        except (orjson.JSONDecodeError, AttributeError):
            inp = arguments
        return {
            "type": "custom_tool_call",
            "id": "ctc_" + hex_id(),
            "call_id": call_id,
            "name": name,
            "input": inp,
            "status": status,
        }
    return {
        "type": "function_call",
        "id": "fc_" + hex_id(),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def chat_to_responses(chat: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """A chat completion (non-stream) as a Responses object answering ``req``."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    finish = choice.get("finish_reason")
    resp = _response_shell(req, "resp_" + hex_id(), int(chat.get("created") or time.time()), "completed")
    custom = custom_tools(req)
    out = resp["output"]
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        out.append(
            {
                "type": "reasoning",
                "id": "rs_" + hex_id(),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    if msg.get("content"):
        out.append(
            {
                "type": "message",
                "id": "msg_" + hex_id(),
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": msg["content"], "annotations": [], "logprobs": []}
                ],
            }
        )
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function") or {}
        out.append(
            _call_item(
                tc.get("id") or "call_" + hex_id(), fn.get("name", ""), fn.get("arguments", ""), custom
            )
        )
    if finish == "length":
        resp["status"] = "incomplete"
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    resp["usage"] = _usage_responses(chat.get("usage"))
    return resp


class ResponsesStream:
    """Turns chat completion chunks into the Responses API's event sequence.

    ``feed(chunk)`` and ``finish()`` return ``[(event_name, data), ...]``; every data
    carries ``type`` (= the event name) and a growing ``sequence_number``.
    """

    def __init__(self, req: dict[str, Any]) -> None:
        self.req = req
        self.custom = custom_tools(req)
        self.seq = 0
        self.resp = _response_shell(req, "resp_" + hex_id(), int(time.time()), "in_progress")
        self.started = False
        self.items: list[dict[str, Any]] = []
        self.open: Any = None  # the item being streamed (a dict)
        self.open_kind: str | None = None
        self.tool_index: int | None = None
        self.finish_reason: str | None = None
        self.usage: Any = None

    def _ev(self, kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        d = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return kind, d

    def _start(self) -> list[tuple[str, dict[str, Any]]]:
        self.started = True
        snap = dict(self.resp)
        return [
            self._ev("response.created", response=snap),
            self._ev("response.in_progress", response=dict(snap)),
        ]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        item, kind = self.open, self.open_kind
        if item is None:
            return []
        self.open = self.open_kind = None
        idx = len(self.items)
        evs: list[tuple[str, dict[str, Any]]] = []
        if kind == "message":
            part = item["content"][0]
            evs.append(
                self._ev(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            evs.append(
                self._ev(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    part=dict(part),
                )
            )
            item["status"] = "completed"
        elif kind == "reasoning":
            text = item["content"][0]["text"]
            evs.append(
                self._ev(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    text=text,
                )
            )
        elif kind == "call":
            item = _call_item(item["call_id"], item["name"], item["arguments"], self.custom)
            item["id"] = self._call_id_item
            if item["type"] == "function_call":
                evs.append(
                    self._ev(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=idx,
                        name=item["name"],
                        arguments=item["arguments"],
                    )
                )
            else:
                evs.append(
                    self._ev(
                        "response.custom_tool_call_input.done",
                        item_id=item["id"],
                        output_index=idx,
                        input=item["input"],
                    )
                )
        evs.append(self._ev("response.output_item.done", output_index=idx, item=item))
        self.items.append(item)
        return evs

    def feed(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        evs = [] if self.started else self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            if c.get("index", 0) != 0:
                continue
            d = c.get("delta") or {}
            r = d.get("reasoning_content") or d.get("reasoning")
            if r:
                if self.open_kind != "reasoning":
                    self._open_reasoning(evs)
                self.open["content"][0]["text"] += r
                evs.append(
                    self._ev(
                        "response.reasoning_text.delta",
                        item_id=self.open["id"],
                        output_index=len(self.items),
                        content_index=0,
                        delta=r,
                    )
                )
            if d.get("content"):
                if self.open_kind != "message":
                    self._open_message(evs)
                self.open["content"][0]["text"] += d["content"]
                evs.append(
                    self._ev(
                        "response.output_text.delta",
                        item_id=self.open["id"],
                        output_index=len(self.items),
                        content_index=0,
                        delta=d["content"],
                        logprobs=[],
                    )
                )
            for tc in d.get("tool_calls") or ():
                ti = tc.get("index", 0)
                fn = tc.get("function") or {}
                if self.open_kind != "call" or self.tool_index != ti:
                    self._open_call(evs, tc, ti, fn)
                elif fn.get("name"):
                    self.open["name"] += fn["name"]
                if fn.get("arguments"):
                    self.open["arguments"] += fn["arguments"]
                    if self.open["name"] in self.custom:
                        continue  # custom tool input is only known once the JSON wrapper is complete
                    evs.append(
                        self._ev(
                            "response.function_call_arguments.delta",
                            item_id=self._call_id_item,
                            output_index=len(self.items),
                            delta=fn["arguments"],
                        )
                    )
            if c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
        return evs

    def _open_reasoning(self, evs: list[tuple[str, dict[str, Any]]]) -> None:
        """The open item closed, a reasoning item opened (its events appended to ``evs``)."""
        evs += self._close()
        self.open = {
            "type": "reasoning",
            "id": "rs_" + hex_id(),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": ""}],
        }
        self.open_kind = "reasoning"
        evs.append(
            self._ev(
                "response.output_item.added",
                output_index=len(self.items),
                item={**self.open, "content": []},
            )
        )

    def _open_message(self, evs: list[tuple[str, dict[str, Any]]]) -> None:
        """The open item closed, a message item and its text part opened."""
        evs += self._close()
        self.open = {
            "type": "message",
            "id": "msg_" + hex_id(),
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.open_kind = "message"
        idx = len(self.items)
        evs.append(
            self._ev("response.output_item.added", output_index=idx, item={**self.open, "content": []})
        )
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.open["content"].append(part)
        evs.append(
            self._ev(
                "response.content_part.added",
                item_id=self.open["id"],
                output_index=idx,
                content_index=0,
                part=dict(part),
            )
        )

    def _open_call(
        self, evs: list[tuple[str, dict[str, Any]]], tc: dict[str, Any], ti: int, fn: dict[str, Any]
    ) -> None:
        """The open item closed, tool call ``ti`` opened (a custom tool's item id is ``ctc_``)."""
        evs += self._close()
        self.tool_index = ti
        self.open_kind = "call"
        self.open = {
            "call_id": tc.get("id") or "call_" + hex_id(),
            "name": fn.get("name") or "",
            "arguments": "",
        }
        self._call_id_item = ("ctc_" if self.open["name"] in self.custom else "fc_") + hex_id()
        added = _call_item(self.open["call_id"], self.open["name"], "", self.custom, status="in_progress")
        added["id"] = self._call_id_item
        evs.append(self._ev("response.output_item.added", output_index=len(self.items), item=added))

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        evs = [] if self.started else self._start()
        evs += self._close()
        final = dict(self.resp)
        final["output"] = self.items
        final["usage"] = _usage_responses(self.usage)
        if self.finish_reason == "length":
            final["status"] = "incomplete"
            final["incomplete_details"] = {"reason": "max_output_tokens"}
            evs.append(self._ev("response.incomplete", response=final))
        else:
            final["status"] = "completed"
            evs.append(self._ev("response.completed", response=final))
        self.final = final
        return evs


def assemble(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    final = None
    latest = None
    for name, data in events:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = data.get("response")
        elif isinstance(data.get("response"), dict):
            latest = data["response"]
    return final if final is not None else latest


def extract_tokens(obj: Any) -> tuple[None, None, None, Any, Any]:
    """Responses carries no token ids: ``(None, None, None, status, usage)``."""
    return answer_tokens(obj, "status")


def assistant_message(response: Any) -> dict[str, Any] | None:
    """The assistant turn a Responses object represents, as a chat message."""
    if not isinstance(response, dict):
        return None
    calls: list[dict[str, Any]] = []
    texts: list[str] = []
    reasoning: str | None = None
    for item in response.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            texts.append(text_of(item.get("content")))
        elif kind == "reasoning":
            reasoning = (reasoning or "") + (text_of(item.get("content")) or text_of(item.get("summary")))
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                }
            )
        elif kind == "custom_tool_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {
                        "name": item.get("name"),
                        "arguments": orjson.dumps({"input": item.get("input", "")}).decode(),
                    },
                }
            )
    return assistant_turn(texts, reasoning, calls)


def stream_error_event(err: dict[str, Any], sequence_number: int) -> tuple[str, dict[str, Any]]:
    """An upstream error inside a stream, as the Responses ``error`` event."""
    return (
        "error",
        {
            "type": "error",
            "code": err.get("code"),
            "message": err.get("message", ""),
            "param": err.get("param"),
            "sequence_number": sequence_number,
        },
    )


class _ResponsesFold:
    """``InputFold`` as a ``Fold``: it continues only after all of its items, and only while the
    ``instructions`` are the same (an item's translation depends on the items before it)."""

    __slots__ = ("inner", "instructions", "n")

    def __init__(self, body: dict[str, Any] | None) -> None:
        self.inner = InputFold(body)
        self.instructions = body.get("instructions") if body is not None else None
        self.n = 0

    def feed(self, item: Any) -> None:
        self.inner.feed(item)
        self.n += 1

    def resumed(self, k: int, body: dict[str, Any]) -> _ResponsesFold | None:
        if k < self.n or body.get("instructions") != self.instructions:
            return None
        out = _ResponsesFold(None)
        out.inner, out.instructions, out.n = self.inner.resumed(), self.instructions, self.n
        return out

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return chat_request(body, self.inner.messages.copy())


class _Stream(ResponsesStream):
    def error(self, err: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [stream_error_event(err, self.seq)]


class _Responses(WireDialect):
    name = Dialect.RESPONSES
    routes = (Route("POST", r"/v1/responses"),)
    conversation_keys = ("input",)
    chat_view = True
    end_marks = tuple(e.encode() for e in TERMINAL_EVENTS)
    terminal_events = TERMINAL_EVENTS
    finish_key = "status"

    def openapi(self) -> dict[str, dict[str, Any]]:
        props = {
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
            "instructions": {"type": "string"},
            "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": TOOL_SCHEMA},
        }
        return {"/v1/responses": openapi_post("responses", props, ["model", "input"])}

    def validate(self, body: dict[str, Any]) -> None:
        validate(body)

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return to_chat(body)

    def fold(self, body: dict[str, Any]) -> _ResponsesFold:
        return _ResponsesFold(body)

    def from_chat(self, chat: dict[str, Any], req: dict[str, Any], path: str = "") -> dict[str, Any]:
        return chat_to_responses(chat, req)

    def chat_stream(self, req: dict[str, Any], path: str = "") -> _Stream:
        return _Stream(req)

    def assemble(self, events: list[tuple[str | None, Any]]) -> Any:
        return assemble(events)

    def assistant_message(self, response: Any) -> dict[str, Any] | None:
        return assistant_message(response)

    def stream_error(self, message: str) -> bytes:
        return encode(*stream_error_event({"message": message, "code": "server_error"}, 0))

    def images(self, request: Any) -> list[ImageRef]:
        return responses_images(request) if isinstance(request, dict) else []

    def opening(self, body: dict[str, Any]) -> list[Any] | None:
        return responses_view.opening(body)

    def tool_call_ids(self, response: Any) -> list[str]:
        return ids_of_type(response, "output", "function_call", "call_id")

    def instructions(self, body: dict[str, Any]) -> str | None:
        return responses_view.instructions(body)

    def first_user_text(self, body: dict[str, Any]) -> str | None:
        return responses_view.first_user_text(body)

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return responses_view.tool_names(body)

    def turns(self, request: dict[str, Any]) -> list[Turn] | None:
        return responses_view.turns(request)

    def answer_turn(self, response: dict[str, Any]) -> Turn | None:
        return responses_view.answer_turn(response)


DIALECT = _Responses()
"""OpenAI Responses, as the registry lists it."""
