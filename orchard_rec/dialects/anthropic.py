"""Anthropic Messages (``POST /v1/messages``): to and from chat, its events, errors and opening.

Claude Code speaks only Messages: in token mode the request becomes a chat completions
request for a token-aware server, and the answer is turned back into a message or its
event stream. No I/O here.

Non-obvious bits:
- ``role: "system"`` entries inside ``messages`` (Claude Code) become ``system`` messages.
- ``tool_result`` blocks become ``tool`` messages placed before the rest of that user turn,
  in block order; ``thinking`` blocks become ``reasoning_content``.
- Claude Code's billing block (``x-anthropic-billing-header: ...``) is not prompt.
- A stream streams ``input_json_delta`` fragments: the tool input is parsed once the block
  stops; a fragment stream that is not valid JSON is kept as a string.
- A stream ends with the ``message_stop`` event (its name, never text inside it).
- Errors are ``{"type": "error", "error": {"type": ..., "message": ...}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchard_rec.dialects.base import (
    MESSAGE_SCHEMA,
    TOOL_SCHEMA,
    ItemFold,
    Route,
    WireDialect,
    answer_tokens,
    head_until_user,
    ids_of_type,
    openapi_post,
    upstream_message,
)
from orchard_rec.dialects.content import (
    assistant_turn,
    first_instructions,
    first_user,
    hex_id,
    text_of,
    tool_names_in,
)
from orchard_rec.dialects.images import ImageRef, anthropic_images
from orchard_rec.dialects.sse import encode
from orchard_rec.dialects.view import (
    Block,
    Turn,
    call_block,
    image_block,
    parts_with,
    result_block,
    text_block,
)
from orchard_rec.errors import BadRequest, OrchardError
from orchard_rec.records import Dialect

__all__ = [
    "DIALECT",
    "TERMINAL_EVENTS",
    "MessagesRequest",
    "MessagesStream",
    "assemble",
    "assistant_message",
    "chat_to_messages",
    "error_body",
    "error_kind",
    "error_object",
    "extract_tokens",
    "is_anthropic",
    "opening",
    "stream_error_event",
    "to_chat",
    "upstream_error",
]

TERMINAL_EVENTS = frozenset({"message_stop"})
"""The event that ends a Messages stream."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(pattern="^(user|assistant|system)$")


class MessagesRequest(BaseModel):
    """The fields of a Messages request we read; the rest pass through untouched."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    messages: list[_Message]
    max_tokens: int = Field(ge=1)
    system: Any = None
    tools: list[dict[str, Any]] | None = None
    stream: bool | None = None


def validate(body: dict[str, Any]) -> MessagesRequest:
    """The checks the real API makes before generating (a 400 in its words, never a proxy error)."""
    try:
        return MessagesRequest.model_validate(body)
    except ValidationError as exc:
        fields = [str(e["loc"][0]) for e in exc.errors() if e["loc"]]
        for field, msg in (
            ("messages", "messages: must be a list of {role: user|assistant, content} objects"),
            ("max_tokens", "max_tokens: a positive integer is required"),
            ("model", "model: a string is required"),
            ("tools", "tools: must be a list of tool objects"),
            ("stream", "'stream' must be a boolean"),
        ):
            if field in fields:
                raise BadRequest(msg, param=field) from None
        raise BadRequest(str(exc)) from None


def is_anthropic(path: str, headers: Any) -> bool:
    """Whether a caller speaks Anthropic (for the shape of an error before its route is known)."""
    return "/messages" in path or path[-9:] == "/complete" or "anthropic-version" in headers


def error_object(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(exc: OrchardError) -> bytes:
    """The JSON error body an Anthropic client expects."""
    return orjson.dumps(error_object(error_kind(exc.status), exc.message))


def stream_error_event(err: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An upstream error inside a stream, as the Messages ``error`` event."""
    return "error", error_object("api_error", err.get("message", ""))


def _anthropic_parts(blocks: list[Any]) -> Any:
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, str):
            parts.append({"type": "text", "text": b})
        elif isinstance(b, dict):
            t = b.get("type")
            if t == "text":
                parts.append({"type": "text", "text": b.get("text", "")})
            elif t == "image":
                parts.append({"type": "image_url", "image_url": {"url": _image_url(b.get("source")) or ""}})
            elif t == "document":
                src = b.get("source") or {}
                if src.get("type") == "text":
                    parts.append({"type": "text", "text": src.get("data", "")})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _image_url(src: Any) -> str | None:
    """An image block's source as a URL (a ``data:`` URL for base64 data)."""
    if not isinstance(src, dict):
        return None
    if src.get("type") == "base64":
        return f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
    url = src.get("url")
    return url if isinstance(url, str) else None


def _tool_result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return content if isinstance(content, str) else ("" if content is None else str(content))


def _tool_result_content(content: Any) -> Any:
    """A tool result as a chat tool message's content: its text, or text and image parts when it
    holds images (computer-use screenshots), which a vision-language model must see."""
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "image" for b in content):
        return _anthropic_parts(content)
    return _tool_result_text(content)


_BILLING = "x-anthropic-billing-header:"


def _without_billing_block(system: Any) -> Any:
    """Claude Code, talking to api.anthropic.com itself (intercept mode), opens its system prompt
    with a text block ``x-anthropic-billing-header: ...; cch=<checksum>;`` whose checksum changes
    on every request. It is accounting for Anthropic's API, not prompt: a model served elsewhere
    should not read it, and kept it would break every session's token prefix at its first line."""
    if isinstance(system, list):  # the form Claude Code sends (2.1.332); a plain string is left as it is
        return [
            b
            for b in system
            if not (isinstance(b, dict) and isinstance(b.get("text"), str) and b["text"].startswith(_BILLING))
        ]
    return system


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request as a chat completions request."""
    messages = system_to_chat(body)
    for m in body.get("messages") or ():
        messages += message_to_chat(m)
    return chat_request(body, messages)


def system_to_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a Messages request's ``system`` becomes (none or one)."""
    system = _without_billing_block(body.get("system"))
    return [{"role": "system", "content": text_of(system)}] if system else []


def message_to_chat(m: Any) -> list[dict[str, Any]]:
    """The chat messages one Messages message becomes: a function of that message alone (so a
    resent history's translation can be reused message by message, ``proxy.tochat``)."""
    messages: list[dict[str, Any]] = []
    if not isinstance(m, dict):
        return messages
    role = m.get("role")
    content = m.get("content")
    if role == "system":
        messages.append({"role": "system", "content": text_of(content)})
        return messages
    if isinstance(content, str) or content is None:
        messages.append({"role": role, "content": content or ""})
        return messages
    if role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": None}
        texts: list[dict[str, Any]] = []
        for b in content:
            if not isinstance(b, dict):
                continue
            t = b.get("type")
            if t == "thinking":
                msg["reasoning_content"] = (msg.get("reasoning_content") or "") + b.get("thinking", "")
            elif t == "tool_use":
                msg.setdefault("tool_calls", []).append(
                    {
                        "id": b.get("id"),
                        "type": "function",
                        "function": {
                            "name": b.get("name"),
                            "arguments": orjson.dumps(b.get("input", {})).decode(),
                        },
                    }
                )
            elif t == "text":
                texts.append(b)
        if texts:
            msg["content"] = _anthropic_parts(texts)
        messages.append(msg)
        return messages
    rest: list[Any] = []
    for b in content:
        if isinstance(b, dict) and b.get("type") == "tool_result":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id"),
                    "content": _tool_result_content(b.get("content")),
                }
            )
        else:
            rest.append(b)
    if rest:
        messages.append({"role": role or "user", "content": _anthropic_parts(rest)})
    return messages


def chat_request(body: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request for a Messages ``body`` whose conversation translated to ``messages``."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = []
    for t in body.get("tools") or ():
        if isinstance(t, dict) and "input_schema" in t:
            fn = {
                "name": t.get("name"),
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            }
            if t.get("description"):
                fn["description"] = t["description"]
            tools.append({"type": "function", "function": fn})
    if tools:
        chat["tools"] = tools
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = tc.get("type")
        if kind == "auto":
            chat["tool_choice"] = "auto"
        elif kind == "any":
            chat["tool_choice"] = "required"
        elif kind == "none":
            chat["tool_choice"] = "none"
        elif kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
        if tc.get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    for k in ("temperature", "top_p", "top_k", "stream"):
        if body.get(k) is not None:
            chat[k] = body[k]
    return chat


_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}


def _stop_reason(finish: str | None, has_tools: bool, stop_sequence: Any) -> str:
    if has_tools:
        return "tool_use"
    if stop_sequence:
        return "stop_sequence"
    return _STOP.get(finish or "stop", "end_turn")


def _usage_messages(u: Any) -> dict[str, Any]:
    u = u if isinstance(u, dict) else {}
    return {
        "input_tokens": u.get("prompt_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": u.get("completion_tokens", 0),
    }


def _tool_input(arguments: str) -> Any:
    try:
        v = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def chat_to_messages(chat: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    """A chat completion (non-stream) as an Anthropic message answering ``req``."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    calls = msg.get("tool_calls") or []
    for tc in calls:
        fn = tc.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": tc.get("id") or "toolu_" + hex_id(),
                "name": fn.get("name", ""),
                "input": _tool_input(fn.get("arguments", "")),
            }
        )
    stop_seq = choice.get("stop_reason") if isinstance(choice.get("stop_reason"), str) else None
    return {
        "id": "msg_" + hex_id(),
        "type": "message",
        "role": "assistant",
        "model": req.get("model") or chat.get("model"),
        "content": content,
        "stop_reason": _stop_reason(choice.get("finish_reason"), bool(calls), stop_seq),
        "stop_sequence": stop_seq,
        "usage": _usage_messages(chat.get("usage")),
    }


class MessagesStream:
    """Turns chat completion chunks into Anthropic's Messages event sequence."""

    def __init__(self, req: dict[str, Any]) -> None:
        self.req = req
        self.started = False
        self.index = -1
        self.open_kind: str | None = None
        self.tool_index: int | None = None
        self.finish_reason: str | None = None
        self.stop_sequence: Any = None
        self.usage: Any = None
        self.any_tool = False
        self.msg: dict[str, Any] = {
            "id": "msg_" + hex_id(),
            "type": "message",
            "role": "assistant",
            "model": req.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }

    def _start(self, prompt_tokens: int) -> list[tuple[str, dict[str, Any]]]:
        self.started = True
        self.msg["usage"]["input_tokens"] = prompt_tokens
        return [
            ("message_start", {"type": "message_start", "message": dict(self.msg)}),
            ("ping", {"type": "ping"}),
        ]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open_kind is None:
            return []
        evs: list[tuple[str, dict[str, Any]]] = []
        if self.open_kind == "thinking":
            evs.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self.index,
                        "delta": {"type": "signature_delta", "signature": ""},
                    },
                )
            )
        evs.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open_kind = None
        return evs

    def _open(self, kind: str, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        evs = self._close()
        self.index += 1
        self.open_kind = kind
        evs.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return evs

    def feed(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        evs: list[tuple[str, dict[str, Any]]] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if not self.started:
            n = len(chunk.get("prompt_token_ids") or ()) or (
                (chunk.get("usage") or {}).get("prompt_tokens") or 0
            )
            evs += self._start(n)
        for c in chunk.get("choices") or ():
            if c.get("index", 0) != 0:
                continue
            d = c.get("delta") or {}
            r = d.get("reasoning_content") or d.get("reasoning")
            if r:
                if self.open_kind != "thinking":
                    evs += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                evs.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self.index,
                            "delta": {"type": "thinking_delta", "thinking": r},
                        },
                    )
                )
            if d.get("content"):
                if self.open_kind != "text":
                    evs += self._open("text", {"type": "text", "text": ""})
                evs.append(
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self.index,
                            "delta": {"type": "text_delta", "text": d["content"]},
                        },
                    )
                )
            for tc in d.get("tool_calls") or ():
                ti = tc.get("index", 0)
                fn = tc.get("function") or {}
                if self.open_kind != "tool_use" or self.tool_index != ti:
                    self.tool_index = ti
                    self.any_tool = True
                    evs += self._open(
                        "tool_use",
                        {
                            "type": "tool_use",
                            "id": tc.get("id") or "toolu_" + hex_id(),
                            "name": fn.get("name") or "",
                            "input": {},
                        },
                    )
                if fn.get("arguments"):
                    evs.append(
                        (
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": self.index,
                                "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]},
                            },
                        )
                    )
            if c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
                if isinstance(c.get("stop_reason"), str):
                    self.stop_sequence = c["stop_reason"]
        return evs

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        evs = [] if self.started else self._start(0)
        evs += self._close()
        usage = _usage_messages(self.usage)
        stop = _stop_reason(self.finish_reason, self.any_tool, self.stop_sequence)
        evs.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": self.stop_sequence},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
        )
        evs.append(("message_stop", {"type": "message_stop"}))
        return evs


def assemble(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    msg: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: dict[int, str] = {}
    for name, data in events:
        if not isinstance(data, dict):
            continue
        kind = data.get("type") or name
        if kind == "message_start":
            msg = dict(data.get("message") or {})
            msg["content"] = list(msg.get("content") or [])
        elif kind == "content_block_start":
            idx = data.get("index", len(blocks))
            blocks[idx] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            idx = data.get("index", 0)
            b = blocks.setdefault(idx, {})
            d = data.get("delta") or {}
            dt = d.get("type")
            if dt == "text_delta":
                b["text"] = (b.get("text") or "") + d.get("text", "")
            elif dt == "input_json_delta":
                partial_json[idx] = partial_json.get(idx, "") + d.get("partial_json", "")
            elif dt == "thinking_delta":
                b["thinking"] = (b.get("thinking") or "") + d.get("thinking", "")
            elif dt == "signature_delta":
                b["signature"] = (b.get("signature") or "") + d.get("signature", "")
            elif dt == "citations_delta":
                b.setdefault("citations", []).append(d.get("citation"))
        elif kind == "content_block_stop":
            idx = data.get("index", 0)
            if idx in partial_json:
                raw = partial_json.pop(idx)
                try:
                    blocks.setdefault(idx, {})["input"] = orjson.loads(raw) if raw else {}
                except orjson.JSONDecodeError:
                    blocks.setdefault(idx, {})["input"] = raw
        elif kind == "message_delta" and msg is not None:
            d = data.get("delta") or {}
            for k, v in d.items():
                msg[k] = v
            if data.get("usage"):
                msg["usage"] = {**(msg.get("usage") or {}), **data["usage"]}
    if msg is None:
        return None
    for idx, raw in partial_json.items():  # stream cut before content_block_stop
        blocks.setdefault(idx, {})["input"] = raw
    msg["content"] = msg["content"] + [blocks[i] for i in sorted(blocks)]
    return msg


def extract_tokens(obj: Any) -> tuple[None, None, None, Any, Any]:
    """Messages carries no token ids: ``(None, None, None, stop_reason, usage)``."""
    return answer_tokens(obj, "stop_reason")


def assistant_message(response: Any) -> dict[str, Any] | None:
    """The assistant turn a message represents, as a chat message."""
    if not isinstance(response, dict):
        return None
    calls: list[dict[str, Any]] = []
    texts: list[str] = []
    reasoning: str | None = None
    for b in response.get("content") or ():
        kind = b.get("type")
        if kind == "text":
            texts.append(b.get("text", ""))
        elif kind == "thinking":
            reasoning = (reasoning or "") + b.get("thinking", "")
        elif kind == "tool_use":
            calls.append(
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {
                        "name": b.get("name"),
                        "arguments": orjson.dumps(b.get("input", {})).decode(),
                    },
                }
            )
    return assistant_turn(texts, reasoning, calls)


def _view_block(b: dict[str, Any]) -> Block | None:
    t = b.get("type")
    if t == "text":
        return text_block(b.get("text"))
    if t == "image":
        return image_block(_image_url(b.get("source")), b)
    if t in ("thinking", "redacted_thinking"):
        return text_block(b.get("thinking") or b.get("data"), "reasoning")
    if t in ("tool_use", "server_tool_use"):
        return call_block(b.get("name"), b.get("id"), b.get("input"))
    if t == "tool_result":
        return result_block(b.get("tool_use_id"), b.get("content"), bool(b.get("is_error")))
    return None


def turns(body: dict[str, Any]) -> list[Turn]:
    """A Messages request as neutral turns, read natively (a tool result's ``is_error`` kept)."""
    out: list[Turn] = []
    if body.get("system"):
        out.append({"role": "system", "blocks": parts_with(body["system"], _view_block)})
    for m in body.get("messages") or ():
        if isinstance(m, dict):
            out.append({"role": str(m.get("role", "?")), "blocks": parts_with(m.get("content"), _view_block)})
    return out


def answer_turn(response: dict[str, Any]) -> Turn | None:
    """A message's content blocks as the assistant turn (None: an error, no content)."""
    content = response.get("content")
    return (
        {"role": "assistant", "blocks": parts_with(content, _view_block)}
        if isinstance(content, list)
        else None
    )


def opening(body: dict[str, Any]) -> list[Any] | None:
    """What every call of one conversation repeats: the system prompt and the messages up to the first user one."""
    items: list[Any] = body["messages"] if isinstance(body.get("messages"), list) else []
    return head_until_user([body.get("system")], items)


_ERROR_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_kind(status: int) -> str:
    """Anthropic's word for an error of that HTTP status (``error.type``)."""
    return _ERROR_KINDS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def upstream_error(status: int, data: bytes) -> bytes:
    """A chat upstream's error as Anthropic's error shape (its message kept)."""
    return orjson.dumps(error_object(error_kind(status), upstream_message(data)))


class _Stream(MessagesStream):
    def error(self, err: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [stream_error_event(err)]


class _Messages(WireDialect):
    name = Dialect.MESSAGES
    routes = (Route("POST", r"/v1/messages"),)
    conversation_keys = ("messages",)
    secret_headers = frozenset({"x-api-key"})
    chat_view = True
    end_marks = tuple(e.encode() for e in TERMINAL_EVENTS)
    terminal_events = TERMINAL_EVENTS
    finish_key = "stop_reason"

    def openapi(self) -> dict[str, dict[str, Any]]:
        props = {
            "model": {"type": "string"},
            "max_tokens": {"type": "integer", "minimum": 1},
            "messages": {"type": "array", "items": MESSAGE_SCHEMA},
            "system": {},
            "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": TOOL_SCHEMA},
        }
        return {"/v1/messages": openapi_post("messages", props, ["model", "max_tokens", "messages"])}

    def claims(self, path: str, headers: Mapping[str, str]) -> bool:
        return is_anthropic(path, headers)

    def auth_headers(self, key: str, headers: Mapping[str, str]) -> dict[str, str]:
        return {"x-api-key": key} if "anthropic-version" in headers else {}

    def validate(self, body: dict[str, Any]) -> None:
        validate(body)

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return to_chat(body)

    def fold(self, body: dict[str, Any]) -> ItemFold:
        return ItemFold(message_to_chat, system_to_chat, chat_request)

    def from_chat(self, chat: dict[str, Any], req: dict[str, Any], path: str = "") -> dict[str, Any]:
        return chat_to_messages(chat, req)

    def chat_stream(self, req: dict[str, Any], path: str = "") -> _Stream:
        return _Stream(req)

    def assemble(self, events: list[tuple[str | None, Any]]) -> Any:
        return assemble(events)

    def assistant_message(self, response: Any) -> dict[str, Any] | None:
        return assistant_message(response)

    def error_body(self, exc: OrchardError) -> bytes:
        return error_body(exc)

    def upstream_error(self, status: int, data: bytes) -> bytes:
        return upstream_error(status, data)

    def stream_error(self, message: str) -> bytes:
        return encode(*stream_error_event({"message": message}))

    def images(self, request: Any) -> list[ImageRef]:
        return anthropic_images(request) if isinstance(request, dict) else []

    def opening(self, body: dict[str, Any]) -> list[Any] | None:
        return opening(body)

    def tool_call_ids(self, response: Any) -> list[str]:
        return ids_of_type(response, "content", "tool_use", "id")

    def instructions(self, body: dict[str, Any]) -> str | None:
        system = body.get("system")  # else Claude Code's ``role: "system"`` messages
        return text_of(system) if system else first_instructions(body.get("messages"))

    def first_user_text(self, body: dict[str, Any]) -> str | None:
        return first_user(body.get("messages"))

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return tool_names_in(body.get("tools"))

    def turns(self, request: dict[str, Any]) -> list[Turn] | None:
        return turns(request)

    def answer_turn(self, response: dict[str, Any]) -> Turn | None:
        return answer_turn(response)


DIALECT = _Messages()
"""Anthropic Messages, as the registry lists it."""
