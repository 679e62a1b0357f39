"""The real openai and anthropic SDKs through the proxy (passthrough mode), on both databases.

For every dialect, stream and not, with tools: the SDK parses the answer, the bytes the
client received equal the bytes the upstream sent, and the call is in the database with
its session and sequence number.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from factories import post_json

from orchard_rec.records import CallOutcome, Dialect

from .agents import CHAT_TOOL, RESP_TOOL

TOOLS = [CHAT_TOOL]
RESP_TOOLS = [RESP_TOOL]
ANTH_TOOLS = [
    {
        "name": "Bash",
        "description": "run",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "path,body",
    [
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": "run `ls`"}],
                "tools": TOOLS,
                "return_token_ids": True,
                "logprobs": True,
            },
        ),
        (
            "/v1/completions",
            {"model": "m", "prompt": "Once upon", "max_tokens": 8, "return_token_ids": True, "logprobs": 1},
        ),
        ("/v1/responses", {"model": "m", "input": "run `ls`", "tools": RESP_TOOLS}),
        (
            "/v1/messages?beta=true",
            {
                "model": "m",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "run `ls`"}],
                "tools": ANTH_TOOLS,
            },
        ),
    ],
)
def test_client_receives_the_upstreams_bytes(upstream, proxy_factory, db_url, path, body, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, db_url, mode="passthrough")
    got = post_json(
        f"{proxy.url}/s/bytes{path}",
        {**body, "stream": stream},
        {"anthropic-version": "2023-06-01"} if "messages" in path else None,
    )
    assert got == upstream.fake.sent[-1]
    assert upstream.fake.log[-1][1] == {**body, "stream": stream}  # forwarded body unchanged
    proxy.flush()
    [rec] = proxy.store().calls("bytes")
    assert rec.seq == 1 and rec.stream is stream and rec.outcome is CallOutcome.OK and rec.status_code == 200
    assert rec.path == path and rec.request == {**body, "stream": stream}
    if stream:
        assert rec.events and rec.response is not None
    else:
        assert rec.response == json.loads(got)


@pytest.mark.slow  # the openai SDK, chat + Responses, stream and not: ~20 s on a loaded machine
def test_openai_sdk_chat_completions_and_responses(upstream, proxy_factory, db_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, db_url, mode="passthrough")
    client = openai.OpenAI(base_url=f"{proxy.url}/s/sdk-run/v1", api_key="sk-secret-openai", max_retries=0)

    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "please run `ls -la`"}], tools=TOOLS
    )  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "tool_calls"
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"cmd": "ls -la"}  # type: ignore[index, union-attr]

    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        if c.choices
    )
    assert text == "Hello! You said: hi"

    c = client.completions.create(model="m", prompt="Once", max_tokens=16)
    assert c.choices[0].text == " The answer is 42."
    chunks = list(client.completions.create(model="m", prompt="Once", max_tokens=16, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == " The answer is 42."

    resp = client.responses.create(model="m", input="run `pwd`", tools=RESP_TOOLS)  # type: ignore[arg-type]
    assert resp.output[0].type == "function_call" and json.loads(resp.output[0].arguments) == {"cmd": "pwd"}  # type: ignore[union-attr]
    with client.responses.stream(model="m", input="hello there") as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert final.output_text == "Hello! You said: hello there"
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"

    assert client.models.list().data[0].id == "orchard-demo"
    proxy.flush()
    recs = proxy.store().calls("sdk-run")
    assert [r.seq for r in recs] == list(range(1, 8))
    assert [r.dialect for r in recs] == [
        Dialect.CHAT,
        Dialect.CHAT,
        Dialect.COMPLETIONS,
        Dialect.COMPLETIONS,
        Dialect.RESPONSES,
        Dialect.RESPONSES,
        Dialect.MODELS,
    ]
    assert all(r.harness == "openai-python" for r in recs)
    assert recs[1].response["choices"][0]["message"]["content"] == "Hello! You said: hi"  # stream reassembled
    assert recs[5].response["output"][0]["content"][0]["text"] == "Hello! You said: hello there"
    for r in recs:
        assert "authorization" not in r.headers
        assert "sk-secret-openai" not in json.dumps(r.headers)


def test_anthropic_sdk_messages_with_tool_use(upstream, proxy_factory, db_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, db_url, mode="passthrough")
    client = anthropic.Anthropic(base_url=f"{proxy.url}/s/anth", api_key="sk-ant-secret", max_retries=0)
    m = client.messages.create(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "run `pwd`"}], tools=ANTH_TOOLS
    )  # type: ignore[arg-type]
    assert (
        m.stop_reason == "tool_use"
        and m.content[-1].type == "tool_use"
        and m.content[-1].input == {"command": "pwd"}
    )  # type: ignore[union-attr]
    history = [
        {"role": "user", "content": "run `pwd`"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": m.content[-1].id, "content": "/tmp/work"}],
        },  # type: ignore[union-attr]
    ]
    with client.messages.stream(model="m", max_tokens=100, messages=history, tools=ANTH_TOOLS) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert final.content[0].text == "Done. The command printed: /tmp/work"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    proxy.flush()
    recs = proxy.store().calls("anth")
    assert [(r.seq, r.dialect, r.stream) for r in recs] == [
        (1, Dialect.MESSAGES, False),
        (2, Dialect.MESSAGES, True),
    ]
    assert recs[1].response["content"][0]["text"] == "Done. The command printed: /tmp/work"
    assert all("x-api-key" not in r.headers and r.harness == "anthropic-python" for r in recs)
