"""Gemini's dialect: to and from chat, its stream, its errors, images and credentials.

The request below has the shape Gemini CLI 0.61.0 sends (recorded through ``serve``: see
``orchard_rec/harnesses/gemini_cli.py``), shortened."""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_rec import dialects
from orchard_rec.dialects import gemini
from orchard_rec.dialects.sse import parse_sse
from orchard_rec.errors import BadRequest, TooManyRequests
from orchard_rec.records import Dialect

G = dialects.get("gemini")
_KEYS = (
    "contents",
    "parts",
    "role",
    "text",
    "thought",
    "functionCall",
    "functionResponse",
    "name",
    "args",
    "id",
    "response",
    "inlineData",
    "fileData",
    "mimeType",
    "data",
    "fileUri",
    "systemInstruction",
    "tools",
    "functionDeclarations",
    "parameters",
    "toolConfig",
    "functionCallingConfig",
    "mode",
    "generationConfig",
    "candidates",
    "content",
    "finishReason",
    "usageMetadata",
)
PNG = base64.b64encode(
    b"\x89PNG\r\n\x1a\n" + b"\0" * 4 + b"IHDR" + (3).to_bytes(4, "big") + (2).to_bytes(4, "big")
).decode()

CLI_BODY = {
    "contents": [
        {"role": "user", "parts": [{"text": "<session_context>..."}, {"text": "Please run `echo orchard`."}]},
        {
            "role": "model",
            "parts": [
                {"text": "Let me think.", "thought": True},
                {
                    "functionCall": {
                        "id": "call_1",
                        "args": {"command": "echo orchard"},
                        "name": "run_shell_command",
                    },
                    "thoughtSignature": "skip_thought_signature_validator",
                },
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "name": "run_shell_command",
                        "response": {"output": "orchard"},
                        "id": "call_1",
                    }
                }
            ],
        },
    ],
    "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
    "tools": [
        {
            "functionDeclarations": [
                {
                    "name": "run_shell_command",
                    "description": "Runs a shell command.",
                    "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}},
                },
                {"name": "legacy", "parameters": {"type": "OBJECT", "properties": {"x": {"type": "STRING"}}}},
            ]
        }
    ],
    "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "maxOutputTokens": 100},
    "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["run_shell_command"]}},
}


def test_the_route_names_the_model_and_the_stream() -> None:
    assert G is not None
    path = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    found = dialects.route("POST", path)
    assert found is not None and found[0] is G
    assert G.model_of(path, {}) == "gemini-2.5-pro" and G.is_stream(path, {})
    assert not G.is_stream("/v1beta/models/m:generateContent", {"stream": True})
    assert dialects.route("POST", "/v1beta/models/m:countTokens") is None


def test_a_gemini_cli_request_as_chat() -> None:
    chat = dialects.to_chat(Dialect("gemini"), CLI_BODY)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Gemini CLI."},
        {"role": "user", "content": "<session_context>...Please run `echo orchard`."},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Let me think.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "run_shell_command", "arguments": '{"command":"echo orchard"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "orchard"},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["run_shell_command", "legacy"]
    assert chat["tools"][1]["function"]["parameters"] == {
        "type": "object",
        "properties": {"x": {"type": "string"}},
    }
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "run_shell_command"}}
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"], chat["top_k"]) == (100, 1, 0.95, 64)


def test_calls_without_ids_pair_with_their_results_by_name_and_order() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "ls", "args": {}}},
                    {"functionCall": {"name": "ls", "args": {"a": 1}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "ls", "response": {"x": 1}}},
                    {"functionResponse": {"name": "ls", "response": {"output": "b"}}},
                    {"text": "and?"},
                ],
            },
        ]
    }
    msgs = dialects.to_chat(Dialect("gemini"), body)["messages"]
    assert [tc["id"] for tc in msgs[1]["tool_calls"]] == ["ls-0", "ls-1"]
    assert [(m["role"], m.get("tool_call_id"), m["content"]) for m in msgs[2:]] == [
        ("tool", "ls-0", '{"x":1}'),
        ("tool", "ls-1", "b"),
        ("user", None, "and?"),
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "user"}]}, None),
        ({"contents": [{"parts": []}]}, None),
        ({"contents": [{"parts": [{"text": "x"}]}], "tools": {}}, "tools"),
    ],
)
def test_unreadable_requests_are_400s(body: dict, param: str | None) -> None:  # type: ignore[type-arg]
    with pytest.raises(BadRequest) as e:
        dialects.to_chat(Dialect("gemini"), body)
    assert e.value.param == param


def test_a_chat_answer_as_a_gemini_response() -> None:
    chat = {
        "choices": [
            {
                "message": {
                    "content": "Done.",
                    "reasoning_content": "ok",
                    "tool_calls": [{"id": "c9", "function": {"name": "ls", "arguments": '{"d": "."}'}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    out = G.from_chat(chat, {}, "/v1beta/models/m1:generateContent")  # type: ignore[union-attr]
    cand = out["candidates"][0]
    assert cand["content"] == {
        "parts": [
            {"text": "ok", "thought": True},
            {"text": "Done."},
            {"functionCall": {"id": "c9", "name": "ls", "args": {"d": "."}}},
        ],
        "role": "model",
    }
    assert cand["finishReason"] == "STOP" and out["modelVersion"] == "m1"
    assert out["usageMetadata"] == {"promptTokenCount": 7, "candidatesTokenCount": 3, "totalTokenCount": 10}
    back = dialects.assistant_message("gemini", out)
    assert back is not None and back["content"] == "Done." and back["tool_calls"][0]["id"] == "c9"


def test_a_chat_stream_as_gemini_events_and_back() -> None:
    s = G.chat_stream({}, "/v1beta/models/m1:streamGenerateContent")  # type: ignore[union-attr]
    assert s is not None
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "function": {"name": "ls", "arguments": '{"d"'}}
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ': "."}'}}]},
                    "finish_reason": "tool_calls",
                }
            ]
        },
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}},
    ]
    events = [e for c in chunks for e in s.feed(c)] + list(s.finish())
    wire = b"".join(G.encode_event(n, d) for n, d in events)  # type: ignore[union-attr]
    assert wire.count(b"\r\n\r\n") == len(events) == 3
    parsed = [(n, orjson.loads(d)) for n, d in parse_sse([wire])]
    assert [G.is_terminal(n, orjson.dumps(d).decode()) for n, d in parsed] == [False, False, True]  # type: ignore[union-attr]
    whole = dialects.assemble("gemini", parsed)
    assert whole["candidates"][0]["content"]["parts"] == [
        {"text": "Hello"},
        {"functionCall": {"id": "c1", "name": "ls", "args": {"d": "."}}},
    ]
    assert whole["usageMetadata"]["totalTokenCount"] == 9
    assert dialects.extract_tokens("gemini", whole)[3] == "STOP"


def test_the_end_is_a_finish_reason_never_text() -> None:
    assert not G.is_terminal(None, '{"candidates":[{"content":{"parts":[{"text":"finishReason STOP"}]}}]}')  # type: ignore[union-attr]
    end = dialects.StreamEnd(Dialect("gemini"))
    assert not end.feed(b'data: {"candidates":[{"content":{"parts":[{"text":"finishReason"}]}}]}\r\n\r\n')
    assert end.feed(b'data: {"candidates":[{"content":{"parts":[]},"finishReason":"STOP"}]}\r\n\r\n')


def test_errors_and_credentials() -> None:
    body = orjson.loads(dialects.error_body(TooManyRequests("busy"), G))
    assert body == {"error": {"code": 429, "message": "busy", "status": "RESOURCE_EXHAUSTED"}}
    assert dialects.caller("/v1beta/models/m:generateContent", {}).name == "gemini"
    up = orjson.loads(G.upstream_error(400, b'{"error": {"message": "too long", "type": "BadRequestError"}}'))  # type: ignore[union-attr]
    assert up == {"error": {"code": 400, "message": "too long", "status": "INVALID_ARGUMENT"}}
    assert "x-goog-api-key" in dialects.secret_headers()
    assert dialects.redact_query("/v1beta/models/m:generateContent?key=AIza123&alt=sse") == (
        "/v1beta/models/m:generateContent?key=REDACTED&alt=sse"
    )


def test_images_in_prompt_order_and_in_the_chat_view() -> None:
    body = {
        "contents": [
            {
                "role": "user",
                "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": PNG}}],
            },
            {
                "role": "user",
                "parts": [{"fileData": {"mimeType": "image/jpeg", "fileUri": "https://x/y.jpg"}}],
            },
        ]
    }
    refs = dialects.images_of("gemini", body)
    assert [(r.mime, r.width, r.height, r.url) for r in refs] == [
        ("image/png", 3, 2, None),
        (None, None, None, "https://x/y.jpg"),
    ]
    msgs = dialects.to_chat(Dialect("gemini"), body)["messages"]
    assert msgs[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{PNG}"},
    }


def test_the_opening_and_the_incremental_translation() -> None:
    assert G.opening(CLI_BODY) == ["You are Gemini CLI.", CLI_BODY["contents"][0]["parts"]]  # type: ignore[union-attr]
    from orchard_rec.proxy.tochat import Translator

    tr = Translator(1 << 20)
    first = {**CLI_BODY, "contents": CLI_BODY["contents"][:1]}
    assert tr.to_chat(G, first, "s", 100) == dialects.to_chat("gemini", first)  # type: ignore[arg-type]
    grown = {**CLI_BODY, "contents": first["contents"] + CLI_BODY["contents"][1:]}  # the same first object
    assert tr.to_chat(G, grown, "s", 100) == dialects.to_chat("gemini", grown)  # type: ignore[arg-type]
    assert tr.reused == 1 and tr.hits == 1


def test_assistant_message_of_something_else_is_none() -> None:
    assert gemini.assistant_message({"error": {}}) is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
@given(body=st.dictionaries(st.sampled_from(_KEYS), _json, max_size=5))
@settings(max_examples=300, deadline=None)
def test_any_json_is_read_without_a_crash(body: dict) -> None:  # type: ignore[type-arg]
    """Reading a recorded request or answer never raises (the writer thread and the viewer read
    what clients and upstreams sent); translating one raises only the dialect's 400."""
    assert G is not None
    G.opening(body)
    G.images(body)
    G.model_of("/v1beta/models/m:generateContent", body)
    G.extract_tokens(body)
    G.assistant_message(body)
    G.finish_of(body)
    G.assemble([(None, body), (None, {"candidates": [body]})])
    G.is_terminal(None, orjson.dumps(body).decode())
    try:
        dialects.to_chat("gemini", body)
    except BadRequest:
        pass
