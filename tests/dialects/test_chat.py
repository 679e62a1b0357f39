"""Chat and completions: stream reassembly (vLLM's token fields), token extraction, opening, errors."""

from __future__ import annotations

import orjson

from orchard_rec.dialects import chat, completions
from orchard_rec.errors import BadRequest, TooManyRequests


def _chunk(delta: dict, **extra: object) -> dict:  # type: ignore[type-arg]
    return {"id": "c1", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta, **extra}]}


def test_chat_stream_reassembles_content_tools_ids_and_logprobs() -> None:
    events: list = [  # type: ignore[type-arg]
        (None, {**_chunk({"role": "assistant", "content": ""}), "prompt_token_ids": [1, 2]}),
        (None, _chunk({"content": "hi "}, token_ids=[5], logprobs={"content": [{"logprob": -0.5}]})),
        (None, _chunk({"reasoning_content": "hmm"}, token_ids=[6])),
        (
            None,
            _chunk(
                {"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "sh", "arguments": '{"c'}}]}
            ),
        ),
        (
            None,
            _chunk(
                {"tool_calls": [{"index": 0, "function": {"arguments": 'md":1}'}}]},
                finish_reason="tool_calls",
            ),
        ),
        (None, {"id": "c1", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}}),
        (None, "[DONE]"),
    ]
    obj = chat.assemble(events)
    assert obj is not None
    msg = obj["choices"][0]["message"]
    assert msg["content"] == "hi " and msg["reasoning_content"] == "hmm"
    assert msg["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "sh", "arguments": '{"cmd":1}'}}
    ]
    assert chat.extract_tokens(obj) == (
        [1, 2],
        [5, 6],
        [-0.5],
        "tool_calls",
        {"prompt_tokens": 2, "completion_tokens": 2},
    )
    assert chat.assistant_message(obj) == {
        "role": "assistant",
        "content": "hi ",
        "reasoning_content": "hmm",
        "tool_calls": msg["tool_calls"],
    }


def test_completions_keep_prompt_ids_on_the_choice() -> None:
    events: list = [  # type: ignore[type-arg]
        (
            None,
            {
                "id": "x",
                "choices": [
                    {
                        "index": 0,
                        "text": "a",
                        "prompt_token_ids": [1],
                        "token_ids": [7],
                        "logprobs": {"token_logprobs": [-1.0], "tokens": ["a"]},
                    }
                ],
            },
        ),
        (
            None,
            {
                "id": "x",
                "choices": [
                    {
                        "index": 0,
                        "text": "b",
                        "token_ids": [8],
                        "finish_reason": "stop",
                        "logprobs": {"token_logprobs": [None], "tokens": ["b"]},
                    }
                ],
            },
        ),
    ]
    obj = completions.assemble(events)
    assert obj is not None and obj["choices"][0]["text"] == "ab"
    assert completions.extract_tokens(obj)[:4] == ([1], [7, 8], [-1.0, 0.0], "stop")
    assert completions.opening({"prompt": "x"}) is None


def test_opening_is_instructions_up_to_the_first_user_message() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ]
    }
    assert chat.opening(body) == ["S", "U"]
    assert chat.opening({"messages": [{"role": "system", "content": "S"}]}) is None
    assert chat.opening({"messages": "nope"}) is None


def test_openai_error_body() -> None:
    assert orjson.loads(chat.error_body(BadRequest("bad", param="x"))) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": None}
    }
    assert orjson.loads(chat.error_body(TooManyRequests("busy")))["error"]["code"] == "proxy_at_capacity"


def test_request_models_keep_every_field() -> None:
    body = {"model": "m", "messages": [], "vendor_field": {"a": 1}, "stream": True}
    req = chat.ChatRequest.model_validate(body)
    assert req.stream is True and req.model_extra == {"vendor_field": {"a": 1}}
