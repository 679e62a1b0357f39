"""OpenAI Responses: requests to chat, chat answers (objects and streams) to Responses and back."""

from __future__ import annotations

import pytest
from hypothesis import given

from orchard_rec.dialects import Dialect, is_terminal, responses, responses_view, to_chat
from orchard_rec.errors import BadRequest

from .strategies import SETTINGS, assistant_turns, chunks, completion, normal

REQ = {"model": "m", "input": "hi"}


@SETTINGS
@given(assistant_turns())
def test_chat_to_responses_to_chat_object(msg: dict) -> None:  # type: ignore[type-arg]
    resp = responses.chat_to_responses(completion(msg), REQ)
    assert resp["status"] == "completed" and resp["usage"]["total_tokens"] == 7
    assert responses.assistant_message(resp) == normal(msg)


@SETTINGS
@given(assistant_turns())
def test_chat_to_responses_to_chat_stream(msg: dict) -> None:  # type: ignore[type-arg]
    tr = responses.ResponsesStream(REQ)
    events = [e for c in chunks(msg) for e in tr.feed(c)] + tr.finish()
    seqs = [d["sequence_number"] for _, d in events]
    assert seqs == list(range(len(events)))
    assert [n for n, _ in events if n in responses.TERMINAL_EVENTS] == ["response.completed"]
    assert events[-1][0] == "response.completed"
    final = responses.assemble(list(events))
    assert final == tr.final
    assert responses.assistant_message(final) == normal(msg)


def test_custom_tools_round_trip_as_free_form_input() -> None:
    req = {"model": "m", "input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}
    chat_req = responses.to_chat(req)
    fn = chat_req["tools"][0]["function"]
    assert fn["name"] == "apply_patch" and fn["parameters"]["required"] == ["input"]
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "apply_patch", "arguments": '{"input":"*** Begin"}'},
            }
        ],
    }
    item = responses.chat_to_responses(completion(msg), req)["output"][0]
    assert item["type"] == "custom_tool_call" and item["input"] == "*** Begin" and item["call_id"] == "c1"


def test_request_to_chat() -> None:
    body = {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
            {"type": "message", "role": "user", "content": "run it"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "tools": [
            {"type": "web_search"},
            {"type": "namespace", "tools": [{"type": "function", "name": "sh"}]},
        ],
        "max_output_tokens": 9,
        "reasoning": {"effort": "low"},
    }
    chat = responses.to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "run it"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["sh"]
    assert chat["max_tokens"] == 9 and chat["reasoning_effort"] == "low"
    assert responses_view.opening(body) == ["be brief", [{"type": "input_text", "text": "dev"}], "run it"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"input": 3}, "input"),
        ({"input": [1]}, "input"),
        ({"input": "x", "tools": {}}, "tools"),
    ],
)
def test_unreadable_requests_are_400s_naming_the_field(body: dict, param: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(BadRequest) as e:
        to_chat(Dialect.RESPONSES, body)
    assert e.value.param == param


def test_length_is_incomplete() -> None:
    resp = responses.chat_to_responses(completion({"role": "assistant", "content": "ab"}, "length"), REQ)
    assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
    tr = responses.ResponsesStream(REQ)
    events = [
        e for c in chunks({"role": "assistant", "content": "ab"}, "length") for e in tr.feed(c)
    ] + tr.finish()
    assert events[-1][0] == "response.incomplete"


def test_the_end_is_the_event_never_text_inside_one() -> None:
    assert is_terminal(Dialect.RESPONSES, "response.completed", "{}")
    assert is_terminal(Dialect.RESPONSES, None, '{"type":"response.failed"}')
    assert not is_terminal(
        Dialect.RESPONSES, "response.output_text.delta", '{"delta":"response.completed [DONE] message_stop"}'
    )
    assert not is_terminal(
        Dialect.RESPONSES, None, '{"type":"response.output_text.delta","delta":"response.completed"}'
    )


def test_function_call_output_screenshots_reach_chat() -> None:
    """A tool output's ``input_image`` items are chat image parts of the tool message (a VLM must
    see them); a text-only output list stays text."""
    url = "data:image/png;base64,QUFB"
    body = {
        "model": "m",
        "input": [
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_image", "image_url": url}],
            },
            {"type": "function_call", "call_id": "c2", "name": "sh", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "ok"}],
            },
        ],
    }
    msgs = to_chat(Dialect.RESPONSES, body)["messages"]
    tools = [m for m in msgs if m["role"] == "tool"]
    assert tools[0]["content"] == [{"type": "image_url", "image_url": {"url": url, "detail": "auto"}}]
    assert tools[1]["content"] == "ok"
