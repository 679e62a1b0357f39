"""Token mode through the real SDKs: ids and logprobs are recorded, the client sees none of them.

Chat and completions stay native with ``return_token_ids``/``logprobs`` injected and
stripped again; Responses and Messages are translated to chat upstream and back.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from factories import post_json

from orchard_rec.records import Dialect

from .agents import ANTH_TOOL, CHAT_TOOL, RESP_TOOL

TOOLS = [CHAT_TOOL]
RESP_TOOLS = [RESP_TOOL]
ANTH_TOOLS = [ANTH_TOOL]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_ids_recorded_and_hidden_from_the_client(upstream, proxy_factory, sqlite_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "run `ls`"}],
        "tools": TOOLS,
        "stream": stream,
    }
    got = post_json(f"{proxy.url}/s/t/v1/chat/completions", body)
    assert b'token_ids":[' not in got and b'"logprob"' not in got
    sent_up = upstream.fake.log[-1][1]
    assert sent_up["return_token_ids"] is True and sent_up["logprobs"] is True
    # what the client got is the upstream's answer less exactly the injected fields
    up_bytes = upstream.fake.sent[-1]
    if not stream:
        expect = json.loads(up_bytes)  # the answer less exactly what we injected, as vLLM writes it unasked
        expect["prompt_token_ids"] = None
        expect["choices"][0]["token_ids"] = None
        expect["choices"][0]["logprobs"] = None
        assert json.loads(got) == expect
    else:
        ups = [json.loads(ln[6:]) for ln in up_bytes.decode().split("\n\n") if ln.startswith("data: {")]
        downs = [json.loads(ln[6:]) for ln in got.decode().split("\n\n") if ln.startswith("data: {")]
        assert len(ups) == len(downs)
        for u, d in zip(ups, downs):
            if "prompt_token_ids" in u:
                u["prompt_token_ids"] = None
            for c in u["choices"]:
                if "token_ids" in c:
                    c["token_ids"] = None
                c["logprobs"] = None
            assert u == d
        assert got.endswith(b"data: [DONE]\n\n")
    proxy.flush()
    [rec] = proxy.store().calls("t")
    gen_ids = [i for s in upstream.fake.model.generate(body["messages"], TOOLS).sections for i in s.ids]
    assert list(rec.completion_ids) == gen_ids  # type: ignore[arg-type]
    assert rec.prompt_ids and len(rec.completion_logprobs) == len(gen_ids)  # type: ignore[arg-type]
    assert rec.upstream_request["return_token_ids"] is True


def test_client_that_asks_for_ids_gets_them_untouched(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "return_token_ids": True,
        "logprobs": True,
    }
    got = post_json(f"{proxy.url}/v1/chat/completions", body)
    assert got == upstream.fake.sent[-1]
    got = post_json(
        f"{proxy.url}/v1/completions", {"model": "m", "prompt": "x", "return_token_ids": True, "logprobs": 1}
    )
    assert got == upstream.fake.sent[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_completions_ids_recorded_and_hidden(upstream, proxy_factory, sqlite_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    client = openai.OpenAI(base_url=f"{proxy.url}/s/c/v1", api_key="x", max_retries=0)
    if stream:
        chunks = list(client.completions.create(model="m", prompt="Hello", max_tokens=32, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
    else:
        r = client.completions.create(model="m", prompt="Hello", max_tokens=32)
        text = r.choices[0].text
        assert r.choices[0].logprobs is None and r.choices[0].model_dump().get("token_ids") is None
    assert text == " The answer is 42."
    proxy.flush()
    [rec] = proxy.store().calls("c")
    assert rec.prompt_ids == tuple(upstream.fake.model.encode("Hello"))
    assert rec.completion_ids and rec.completion_ids[-1] == upstream.fake.model.eos
    assert len(rec.completion_logprobs) == len(rec.completion_ids)  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_translated_to_chat_and_back(upstream, proxy_factory, db_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, db_url, mode="token")
    client = openai.OpenAI(base_url=f"{proxy.url}/s/r/v1", api_key="x", max_retries=0)
    kw: dict[str, Any] = {"model": "m", "tools": RESP_TOOLS, "instructions": "Be brief."}
    first_input: list[Any] = [
        {"type": "message", "role": "developer", "content": "You run commands."},
        {"role": "user", "content": "run `echo hi`"},
    ]
    if stream:
        with client.responses.stream(input=first_input, **kw) as s:
            types = [e.type for e in s]
            r1 = s.get_final_response()
        assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
        assert "response.function_call_arguments.delta" in types and "response.output_item.done" in types
    else:
        r1 = client.responses.create(input=first_input, **kw)
    call = r1.output[-1]
    assert call.type == "function_call" and json.loads(call.arguments) == {"cmd": "echo hi"}  # type: ignore[union-attr]
    second_input = first_input + [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "hi"},
    ]  # type: ignore[union-attr]
    if stream:
        with client.responses.stream(input=second_input, **kw) as s:
            r2 = s.get_final_response()
    else:
        r2 = client.responses.create(input=second_input, **kw)
    assert r2.output_text == "Done. The command printed: hi"
    assert r2.usage is not None and r2.usage.output_tokens > 0
    proxy.flush()
    recs = proxy.store().calls("r")
    assert [r.dialect for r in recs] == [Dialect.RESPONSES, Dialect.RESPONSES]
    up = recs[1].upstream_request
    assert (
        up["messages"][0] == {"role": "system", "content": "Be brief."}
        and up["messages"][1]["role"] == "system"
    )
    assert up["messages"][-1]["role"] == "tool" and up["messages"][-2]["tool_calls"][0]["id"] == call.call_id  # type: ignore[union-attr]
    for r in recs:
        assert r.prompt_ids and r.completion_ids and len(r.completion_logprobs) == len(r.completion_ids)  # type: ignore[arg-type]
        assert r.response["object"] == "response" and r.response["status"] == "completed"
    # call 2's prompt extends call 1's prompt + completion: the Responses history re-renders exactly
    assert (
        recs[1].prompt_ids[: len(recs[0].prompt_ids) + len(recs[0].completion_ids)]
        == recs[0].prompt_ids + recs[0].completion_ids
    )  # type: ignore[operator, arg-type]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_translated_to_chat_and_back(upstream, proxy_factory, db_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, db_url, mode="token")
    client = anthropic.Anthropic(base_url=f"{proxy.url}/s/a", api_key="x", max_retries=0)
    kw: dict[str, Any] = {
        "model": "m",
        "max_tokens": 200,
        "tools": ANTH_TOOLS,
        "system": [{"type": "text", "text": "You are Claude.", "cache_control": {"type": "ephemeral"}}],
    }
    msgs: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "run `pwd`"}]}]

    def ask(messages: list[Any]) -> Any:
        if stream:
            with client.messages.stream(messages=messages, **kw) as s:
                kinds = [e.type for e in s]
                assert kinds[0] == "message_start" and "message_stop" in kinds
                return s.get_final_message()
        return client.messages.create(messages=messages, **kw)

    m1 = ask(msgs)
    assert m1.stop_reason == "tool_use" and m1.content[-1].input == {"command": "pwd"}
    msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": m1.content[-1].id, "content": "/work"}],
        },
    ]
    m2 = ask(msgs)
    assert m2.content[0].text == "Done. The command printed: /work" and m2.stop_reason == "end_turn"
    assert m2.usage.output_tokens > 0
    proxy.flush()
    recs = proxy.store().calls("a")
    assert [r.dialect for r in recs] == [Dialect.MESSAGES, Dialect.MESSAGES]
    assert all(r.completion_ids and r.prompt_ids for r in recs)
    assert recs[1].response["type"] == "message" and recs[1].response["content"][0]["text"].startswith(
        "Done."
    )
    assert recs[1].finish_reason == "end_turn"


def test_upstream_error_on_translated_messages_is_anthropic_shaped(
    upstream, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    client = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=10, messages="nope")  # type: ignore[arg-type]
    assert e.value.status_code == 400
