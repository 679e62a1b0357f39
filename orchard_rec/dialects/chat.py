"""OpenAI Chat Completions (``POST /v1/chat/completions``): the dialect every other one translates to.

Owns the chat request model, stream reassembly (vLLM sends ``prompt_token_ids`` on the first
chunk only, ``system_fingerprint`` on the last only, and per-chunk ``choices[i].token_ids`` deltas), token extraction, the stream's end
(a ``data: [DONE]`` event, never the text inside one), the OpenAI error body shared by the
OpenAI dialects, and the session opening.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from orchard_rec.dialects.base import (
    MESSAGE_SCHEMA,
    TOOL_SCHEMA,
    Route,
    Tokens,
    WireDialect,
    assemble_chunks,
    head_until_user,
    openai_type,
    openapi_post,
)
from orchard_rec.dialects.content import first_instructions, first_user, tool_names_in
from orchard_rec.dialects.images import ImageRef, chat_images
from orchard_rec.dialects.view import Turn, chat_message_turn
from orchard_rec.errors import BadRequest, OrchardError
from orchard_rec.records import Dialect

__all__ = [
    "DIALECT",
    "DONE",
    "ChatRequest",
    "assemble",
    "assistant_message",
    "error_body",
    "error_object",
    "extract_tokens",
    "injected",
    "opening",
]

DONE = "[DONE]"
"""The data of the event that ends an OpenAI chat or completions stream."""


class ChatRequest(BaseModel):
    """The fields of a chat request we read; the rest pass through untouched."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: Any = None
    messages: Any = None
    tools: Any = None
    stream: bool | None = None
    return_token_ids: Any = None
    logprobs: Any = None


def error_object(exc: OrchardError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": openai_type(exc), "param": exc.param, "code": exc.code}}


def error_body(exc: OrchardError) -> bytes:
    """The JSON error body an OpenAI client (chat, completions, responses) expects."""
    return orjson.dumps(error_object(exc))


def _new_choice(idx: int) -> dict[str, Any]:
    return {
        "index": idx,
        "message": {"role": "assistant", "content": None},
        "finish_reason": None,
        "_tools": {},
        "_texts": {},
    }


def _add_chunk(out: dict[str, Any], ch: dict[str, Any]) -> None:
    if ch.get("prompt_token_ids") is not None and "prompt_token_ids" not in out:
        v = ch["prompt_token_ids"]  # a list copied; the writer's immutable ``Ids`` as it is
        out["prompt_token_ids"] = list(v) if isinstance(v, list) else v
    if ch.get("system_fingerprint") is not None:  # vLLM sends it in the last chunk only
        out["system_fingerprint"] = ch["system_fingerprint"]


_TEXTS = ("content", "reasoning_content", "reasoning", "refusal")
"""The delta's text fields, each the concatenation of its pieces in the message."""


def _add_choice(acc: dict[str, Any], c: dict[str, Any]) -> None:
    delta = c.get("delta")
    if type(delta) is dict and len(delta) == 1 and "content" in delta:  # most chunks: a piece of text
        piece = delta["content"]
        if piece:
            parts = acc["_texts"].get("content")
            if parts is None:
                acc["_texts"]["content"] = parts = []
            parts.append(piece)
    elif delta:
        msg = acc["message"]
        if delta.get("role"):
            msg["role"] = delta["role"]
        for key in _TEXTS:
            piece = delta.get(key)
            if piece:  # the pieces joined once (``_done``), not the text copied per chunk
                parts = acc["_texts"].get(key)
                if parts is None:
                    acc["_texts"][key] = parts = []
                    msg.setdefault(key, None)  # its place in the message: where its first piece came
                parts.append(piece)
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            _add_tools(acc["_tools"], tool_calls)
    lp = c.get("logprobs")
    if lp and lp.get("content"):
        got = acc.get("logprobs")
        if got is None:
            acc["logprobs"] = got = {"content": []}
        got["content"].extend(lp["content"])
    ids = c.get("token_ids")
    if ids is not None:
        had = acc.get("token_ids")
        if had is None:
            acc["token_ids"] = had = []
        had.extend(ids)
    if c.get("finish_reason") is not None:
        acc["finish_reason"] = c["finish_reason"]
    if c.get("stop_reason") is not None:
        acc["stop_reason"] = c["stop_reason"]


def _add_tools(tools: dict[Any, dict[str, Any]], deltas: Any) -> None:
    for tc in deltas:
        t = tools.setdefault(
            tc.get("index", 0),
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if tc.get("id"):
            t["id"] = tc["id"]
        if tc.get("type"):
            t["type"] = tc["type"]
        fn = tc.get("function") or {}
        if fn.get("name"):
            t["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            t["function"]["arguments"] += fn["arguments"]


def _done(acc: dict[str, Any]) -> dict[str, Any]:
    msg = acc["message"]
    for key, parts in acc.pop("_texts").items():
        msg[key] = "".join(parts)
    tools = acc.pop("_tools")
    if tools:
        msg["tool_calls"] = [tools[i] for i in sorted(tools)]
    return acc


def assemble(events: list[tuple[str | None, Any]]) -> dict[str, Any] | None:
    """The chat completion a non-stream call would have returned, from a stream's parsed chunks."""
    return assemble_chunks(events, "chat.completion", _new_choice, _add_choice, _add_chunk, _done)


def extract_tokens(obj: Any) -> tuple[Any, Any, list[float] | None, Any, Any]:
    """``(prompt_ids, completion_ids, completion_logprobs, finish_reason, usage)`` of choice 0."""
    if not isinstance(obj, dict):
        return None, None, None, None, None
    choices = obj.get("choices") or [{}]
    c0 = choices[0] if isinstance(choices[0], dict) else {}
    lps = None
    content = (c0.get("logprobs") or {}).get("content") if isinstance(c0.get("logprobs"), dict) else None
    if content:
        lps = [float(x.get("logprob", 0.0)) for x in content]
    return obj.get("prompt_token_ids"), c0.get("token_ids"), lps, c0.get("finish_reason"), obj.get("usage")


def assistant_message(response: Any) -> dict[str, Any] | None:
    """The assistant turn of a chat completion (choice 0)."""
    if not isinstance(response, dict):
        return None
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    m = ((response.get("choices") or [{}])[0] or {}).get("message") or {}
    msg["content"] = m.get("content")
    if m.get("reasoning_content") or m.get("reasoning"):
        msg["reasoning_content"] = m.get("reasoning_content") or m.get("reasoning")
    calls = list(m.get("tool_calls") or [])
    if calls:
        msg["tool_calls"] = calls
    return msg


def opening(body: dict[str, Any]) -> list[Any] | None:
    """What every call of one conversation repeats: system/developer messages up to the first user message."""
    items: list[Any] = body["messages"] if isinstance(body.get("messages"), list) else []
    return head_until_user([], items)


def injected(request: Any, upstream: Any) -> tuple[bool, bool]:
    """Which of (ids, logprobs) token mode added to what a chat client asked for (``proxy.token``)."""
    if not isinstance(upstream, dict) or not isinstance(request, dict):
        return False, False
    ids = upstream.get("return_token_ids") is True and not request.get("return_token_ids")
    return ids, upstream.get("logprobs") is True and not request.get("logprobs")


class _Chat(WireDialect):
    name = Dialect.CHAT
    routes = (Route("POST", r"/v1/chat/completions"),)
    conversation_keys = ("messages",)
    token_native = True
    chat_view = True
    upstream_path = "/v1/chat/completions"

    def openapi(self) -> dict[str, dict[str, Any]]:
        props = {
            "model": {"type": "string"},
            "messages": {"type": "array", "items": MESSAGE_SCHEMA},
            "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": TOOL_SCHEMA},
            "max_tokens": {"type": "integer", "minimum": 1},
        }
        return {"/v1/chat/completions": openapi_post("chat", props, ["model", "messages"])}

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def token_request(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool, bool]:
        up = dict(body)
        up["return_token_ids"] = True
        up["logprobs"] = True
        return up, not body.get("return_token_ids"), not body.get("logprobs")

    def validate(self, body: dict[str, Any]) -> None:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise BadRequest("messages: a list of message objects is required", param="messages")

    def assemble(self, events: list[tuple[str | None, Any]]) -> Any:
        return assemble(events)

    def extract_tokens(self, obj: Any) -> Tokens:
        return extract_tokens(obj)

    def injected(self, request: Any, upstream: Any) -> tuple[bool, bool]:
        return injected(request, upstream)

    def assistant_message(self, response: Any) -> dict[str, Any] | None:
        return assistant_message(response)

    def images(self, request: Any) -> list[ImageRef]:
        return chat_images(request) if isinstance(request, dict) else []

    def opening(self, body: dict[str, Any]) -> list[Any] | None:
        return opening(body)

    def instructions(self, body: dict[str, Any]) -> str | None:
        return first_instructions(body.get("messages"))

    def first_user_text(self, body: dict[str, Any]) -> str | None:
        return first_user(body.get("messages"))

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return tool_names_in(body.get("tools"))

    def answer_turn(self, response: dict[str, Any]) -> Turn | None:
        c0 = (response.get("choices") or [None])[0]
        m = c0.get("message") if isinstance(c0, dict) else None
        if not isinstance(m, dict):
            return None
        turn = chat_message_turn(m)
        turn["role"] = "assistant"
        return turn

    def tool_call_ids(self, response: Any) -> list[str]:
        try:
            calls = response["choices"][0]["message"].get("tool_calls") or []
            return [str(tc["id"]) for tc in calls]
        except (KeyError, IndexError, TypeError, AttributeError):
            return []


DIALECT = _Chat()
"""OpenAI Chat Completions, as the registry lists it."""
