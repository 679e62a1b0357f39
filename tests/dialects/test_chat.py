"""Chat and completions: stream reassembly (vLLM's token fields), token extraction, opening, errors."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _reference(events: list) -> dict | None:  # type: ignore[type-arg]
    """Reassembly written the plain way (each piece appended to the text), for the property below."""
    chunks = [d for _, d in events if isinstance(d, dict)]
    if not chunks:
        return None
    out: dict = {k: chunks[0].get(k) for k in ("id", "object", "created", "model")}  # type: ignore[type-arg]
    out["object"] = "chat.completion"
    accs: dict = {}  # type: ignore[type-arg]
    usage = None
    for ch in chunks:
        if ch.get("prompt_token_ids") is not None and "prompt_token_ids" not in out:
            out["prompt_token_ids"] = list(ch["prompt_token_ids"])
        if ch.get("system_fingerprint") is not None:
            out["system_fingerprint"] = ch["system_fingerprint"]
        usage = ch.get("usage") or usage
        for c in ch.get("choices") or ():
            acc = accs.setdefault(
                c.get("index", 0),
                {
                    "index": c.get("index", 0),
                    "message": {"role": "assistant", "content": None},
                    "finish_reason": None,
                    "tools": {},
                },
            )
            delta = c.get("delta") or {}
            msg = acc["message"]
            if delta.get("role"):
                msg["role"] = delta["role"]
            for key in ("content", "reasoning_content", "reasoning", "refusal"):
                if delta.get(key):
                    msg[key] = (msg.get(key) or "") + delta[key]
            for tc in delta.get("tool_calls") or ():
                t = acc["tools"].setdefault(
                    tc.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                t["id"] = tc.get("id") or t["id"]
                t["function"]["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            if (c.get("logprobs") or {}).get("content"):
                acc.setdefault("logprobs", {"content": []})["content"].extend(c["logprobs"]["content"])
            if c.get("token_ids") is not None:
                acc.setdefault("token_ids", []).extend(c["token_ids"])
            for k in ("finish_reason", "stop_reason"):
                if c.get(k) is not None:
                    acc[k] = c[k]
    for acc in accs.values():
        tools = acc.pop("tools")
        if tools:
            acc["message"]["tool_calls"] = [tools[i] for i in sorted(tools)]
    out["choices"] = [accs[i] for i in sorted(accs)]
    if usage is not None:
        out["usage"] = usage
    return out


_TEXT = st.sampled_from(["content", "reasoning_content", "reasoning", "refusal", "role"])
_DELTA = st.dictionaries(_TEXT, st.sampled_from(["", "a", "é ", "assistant"]), max_size=3) | st.builds(
    lambda i, tid, args: {"tool_calls": [{"index": i, "id": tid, "function": {"arguments": args}}]},
    st.integers(0, 1),
    st.sampled_from([None, "t1"]),
    st.sampled_from(["", '{"a"', ":1}"]),
)
_CHOICE = st.fixed_dictionaries(
    {"index": st.integers(0, 1), "delta": _DELTA | st.none()},
    optional={
        "token_ids": st.lists(st.integers(0, 9), max_size=2) | st.none(),
        "logprobs": st.just({"content": [{"logprob": -0.5}]}) | st.none(),
        "finish_reason": st.sampled_from([None, "stop", "length"]),
        "stop_reason": st.sampled_from([None, 7]),
    },
)


@settings(deadline=None, max_examples=150)
@given(st.lists(st.lists(_CHOICE, max_size=2), max_size=8))
def test_chat_reassembly_equals_appending_each_piece_in_order(choices: list) -> None:  # type: ignore[type-arg]
    events = [(None, {"id": "c", "created": 1, "model": "m", "choices": cs}) for cs in choices]
    events.append((None, "[DONE]"))
    assert orjson.dumps(chat.assemble(events)) == orjson.dumps(_reference(events))  # the keys' order too
