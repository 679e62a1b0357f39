"""Anthropic Messages: requests to chat, chat answers (objects and streams) to messages and back, errors."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given

from orchard_rec.dialects import Dialect, anthropic, error_body, is_terminal, to_chat
from orchard_rec.errors import BadRequest, TooManyRequests

from .strategies import SETTINGS, assistant_turns, chunks, completion, normal

REQ = {"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


@SETTINGS
@given(assistant_turns())
def test_chat_to_messages_to_chat_object(msg: dict) -> None:  # type: ignore[type-arg]
    out = anthropic.chat_to_messages(completion(msg), REQ)
    assert out["stop_reason"] == ("tool_use" if msg.get("tool_calls") else "end_turn")
    assert anthropic.assistant_message(out) == normal(msg)


@SETTINGS
@given(assistant_turns())
def test_chat_to_messages_to_chat_stream(msg: dict) -> None:  # type: ignore[type-arg]
    tr = anthropic.MessagesStream(REQ)
    events = [e for c in chunks(msg) for e in tr.feed(c)] + tr.finish()
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    assert sum(n == "message_stop" for n, _ in events) == 1
    final = anthropic.assemble(list(events))
    assert final is not None and final["usage"]["output_tokens"] == 4
    assert anthropic.assistant_message(final) == normal(msg)


def test_request_to_chat_orders_tool_results_first_and_reads_thinking() -> None:
    body = {
        "model": "claude",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": "do it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "plan"},
                    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and then?"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a.txt"}],
                    },
                ],
            },
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
    }
    chat = anthropic.to_chat(body)
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert chat["messages"][2]["reasoning_content"] == "plan"
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "a.txt"}
    assert (
        chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False and chat["stop"] == ["END"]
    )
    assert anthropic.opening(body) == [body["system"], "do it"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**REQ, "messages": "x"}, "messages"),
        ({**REQ, "messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({**REQ, "max_tokens": True}, "max_tokens"),
        ({**REQ, "max_tokens": 0}, "max_tokens"),
        ({k: v for k, v in REQ.items() if k != "max_tokens"}, "max_tokens"),
        ({**REQ, "model": 3}, "model"),
        ({**REQ, "tools": [1]}, "tools"),
    ],
)
def test_unreadable_requests_are_400s_naming_the_field(body: dict, param: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(BadRequest) as e:
        to_chat(Dialect.MESSAGES, body)
    assert e.value.param == param


def test_error_shapes() -> None:
    assert orjson.loads(error_body(TooManyRequests("busy"), anthropic.DIALECT)) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "busy"},
    }
    assert anthropic.stream_error_event({"message": "boom"}) == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "boom"}},
    )
    assert anthropic.is_anthropic("/v1/messages", {}) and anthropic.is_anthropic(
        "/x", {"anthropic-version": "1"}
    )
    assert not anthropic.is_anthropic("/v1/chat/completions", {})


def test_the_end_is_the_event_never_text_inside_one() -> None:
    assert is_terminal(Dialect.MESSAGES, "message_stop", '{"type":"message_stop"}')
    assert not is_terminal(
        Dialect.MESSAGES, "content_block_delta", '{"delta":{"type":"text_delta","text":"message_stop"}}'
    )
    assert not is_terminal(
        Dialect.MESSAGES, None, '{"type":"content_block_delta","text":"\\"type\\":\\"message_stop\\""}'
    )
    assert is_terminal(Dialect.CHAT, None, "[DONE]")
    assert not is_terminal(Dialect.CHAT, None, '{"choices":[{"delta":{"content":"data: [DONE]"}}]}')


def test_tool_result_screenshots_reach_chat_in_image_order() -> None:
    """A computer-use tool result's screenshot is a chat image part where the result sits (a VLM
    must see it), in the order ``images_of`` lists the request's images; text-only results stay text."""
    from orchard_rec.dialects import images_of

    def img(data: str) -> dict:  # type: ignore[type-arg]
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}

    body = {
        "model": "claude",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "go"}, img("QUFB")]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "computer", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "ok"}, img("QkJC")],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "plain"}],
                    },
                ],
            },
        ],
    }
    msgs = to_chat(Dialect.MESSAGES, body)["messages"]
    assert msgs[2] == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": [
            {"type": "text", "text": "ok"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,QkJC"}},
        ],
    }
    assert msgs[3]["content"] == "plain"
    urls = [
        p["image_url"]["url"]
        for m in msgs
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert [u.rsplit(",", 1)[1] for u in urls] == ["QUFB", "QkJC"]
    assert [r.data for r in images_of(Dialect.MESSAGES, body)] == [b"AAA", b"BBB"]
