"""The sans-io recording core: headers and bytes in, bytes out, no sockets."""

from __future__ import annotations

import orjson
import pytest

from orchard_rec.dialects.sse import encode, parse_sse
from orchard_rec.errors import OrchardError, UpgradeRequired
from orchard_rec.proxy.core import Call, dialect_of, refuse_websocket
from orchard_rec.records import CallOutcome, Dialect

TRAP = "the end? data: [DONE]\n\nevent: message_stop\n\nresponse.completed"
"""A reply that spells every dialect's end marker, newlines included."""


def _chat_stream(text: str, ids: bool = False) -> bytes:
    frames = [
        encode(None, {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    ]
    for k in range(0, len(text), 4):
        c: dict = {"index": 0, "delta": {"content": text[k : k + 4]}}  # type: ignore[type-arg]
        if ids:
            c["token_ids"] = [k]
        frames.append(encode(None, {"id": "c", "choices": [c]}))
    frames.append(encode(None, {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    return b"".join(frames) + b"data: [DONE]\n\n"


def _messages_stream(text: str) -> bytes:
    evs = [
        ("message_start", {"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(encode(n, d) for n, d in evs)


def _call(dialect: Dialect, body: dict, mode: str = "passthrough", headers: dict | None = None) -> Call:  # type: ignore[type-arg]
    path = {
        Dialect.CHAT: "/v1/chat/completions",
        Dialect.MESSAGES: "/v1/messages",
        Dialect.RESPONSES: "/v1/responses",
    }[dialect]
    call = Call(dialect, "POST", path, headers or {})
    call.name_session("s-1")
    call.identify({"user-agent": "openai/python 1.0", **(headers or {})})
    call.read(orjson.dumps(body), "application/json", mode)
    return call


@pytest.mark.parametrize("size", [1, 3, 7, 64, 10_000])
def test_a_reply_spelling_done_does_not_end_a_chat_stream(size: int) -> None:
    call = _call(Dialect.CHAT, {"model": "m", "messages": [], "stream": True})
    relay = call.response(200, "text/event-stream")
    assert relay is not None
    data = _chat_stream(TRAP)
    last = data.rindex(b"data: [DONE]")
    out = b""
    for k in range(0, len(data), size):
        out += relay.feed(data[k : k + size])
        assert relay.ended == (k + size > last + len(b"data: [DONE]\n\n") - 1), k
    out += relay.finish()
    assert out == data  # passthrough: the bytes as they came
    rec = call.cap.to_record()
    assert rec.response["choices"][0]["message"]["content"] == TRAP


@pytest.mark.parametrize("size", [1, 5, 10_000])
def test_a_reply_spelling_message_stop_does_not_end_a_messages_stream(size: int) -> None:
    call = _call(Dialect.MESSAGES, {"model": "m", "max_tokens": 5, "messages": [], "stream": True})
    relay = call.response(200, "text/event-stream; charset=utf-8")
    assert relay is not None
    data = _messages_stream(TRAP)
    stop = data.rindex(b"event: message_stop")
    for k in range(0, len(data), size):
        relay.feed(data[k : k + size])
        if k + size < stop:
            assert not relay.ended
    assert relay.ended and relay.finish() == b""
    assert call.cap.to_record().response["content"][0]["text"] == TRAP


def test_token_mode_plan_injects_and_strips() -> None:
    call = _call(
        Dialect.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}, "token"
    )
    path, body = call.upstream_target("/v1/chat/completions", "")
    assert path == "/v1/chat/completions" and body is not None
    assert orjson.loads(body)["return_token_ids"] is True
    relay = call.response(200, "text/event-stream")
    assert relay is not None
    out = relay.feed(_chat_stream("hi there", ids=True)) + relay.finish()
    assert b"token_ids" in b"".join(call.cap.chunks) and b'"token_ids":[' not in out
    assert relay.ended and call.cap.bytes_out == 0  # counted only as the front door sends
    relay.sending(len(out))
    assert call.cap.bytes_out == len(out)


def test_token_mode_translates_a_responses_stream_and_ends_at_its_own_event() -> None:
    body = {"model": "m", "input": "say it", "stream": True}
    call = _call(Dialect.RESPONSES, body, "token")
    path, up = call.upstream_target("/v1/responses", "x=1")
    assert path == "/v1/chat/completions" and up is not None  # a translated call drops the query
    relay = call.response(200, "text/event-stream")
    assert relay is not None and call.client_content_type == "text/event-stream; charset=utf-8"
    data = _chat_stream(TRAP, ids=True)
    out = relay.feed(data[: -len(b"data: [DONE]\n\n")])
    assert not relay.ended
    out += relay.feed(b"data: [DONE]\n\n")
    assert relay.ended and relay.finish() == b""
    events = parse_sse([out])
    assert events[-1][0] == "response.completed"
    rec = call.cap.to_record()
    assert rec.response["output"][0]["content"][0]["text"] == TRAP and rec.prompt_ids is None


def test_non_stream_body_in_token_mode_hides_the_ids() -> None:
    call = _call(Dialect.CHAT, {"model": "m", "messages": []}, "token")
    assert call.response(200, "application/json") is None
    upstream = {
        "choices": [{"index": 0, "message": {"content": "x"}, "token_ids": [1]}],
        "prompt_token_ids": [2],
    }
    out = orjson.loads(call.body(orjson.dumps(upstream), 200))
    assert out["prompt_token_ids"] is None and out["choices"][0]["token_ids"] is None
    assert call.cap.to_record().completion_ids == (1,)


def test_websocket_is_refused_in_the_callers_dialect() -> None:
    assert refuse_websocket("/v1/responses", {"upgrade": "h2c"}) is None
    status, body = refuse_websocket("/v1/responses", {"upgrade": "WebSocket"})  # type: ignore[misc]
    assert status == 426 and orjson.loads(body)["error"]["type"] == "invalid_request_error"
    call = Call(Dialect.MESSAGES, "GET", "/v1/messages", {})
    with pytest.raises(UpgradeRequired) as e:
        call.identify({"upgrade": "websocket"})
    status, body = call.reject(e.value)
    assert status == 426 and orjson.loads(body)["type"] == "error"
    assert call.cap.outcome is CallOutcome.REJECTED and call.cap.status_code == 426


@pytest.mark.parametrize(("headers", "anthropic"), [({}, False), ({"anthropic-version": "2023-06-01"}, True)])
def test_bad_input_is_rejected_in_the_dialect(headers: dict, anthropic: bool) -> None:  # type: ignore[type-arg]
    call = Call(Dialect.CHAT, "POST", "/v1/chat/completions", headers)
    with pytest.raises(OrchardError) as e:
        call.read(b"{nope", "application/json", "passthrough")
    status, body = call.reject(e.value)
    assert status == 400 and ("type" in orjson.loads(body)) == anthropic
    assert call.cap.outcome is CallOutcome.REJECTED


def test_routes() -> None:
    assert dialect_of("POST", "/v1/chat/completions/") is Dialect.CHAT
    assert dialect_of("GET", "/v1/chat/completions") is Dialect.OTHER
    assert dialect_of("GET", "/v1/models") is Dialect.MODELS
