"""Regression tests for issue 17's faults, against the demo upstream (the real vLLM checks
are in tests/vllm/)."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest

from orchard_rec.dialects import assemble
from orchard_rec.records import Dialect


def _post(url: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=raw, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read())


BODIES = {
    "chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "responses": {"model": "m", "input": "hi"},
    "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
}


def test_bad_gzip_body_is_a_400_in_the_dialect(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Bug 8: ``Content-Encoding: gzip`` over a body that is not gzip was a 500 on all four endpoints."""
    proxy = proxy_factory(upstream.url, sqlite_url)
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    for path in BODIES:
        _check_gzip(proxy.url, path, headers)


def _check_gzip(url: str, path: str, headers: dict[str, str]) -> None:
    raw = orjson.dumps(BODIES[path])
    status, body = _post(f"{url}/v1/{path}", raw, headers)
    assert status == 400, body
    if path == "messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"
    # a real gzip body still works
    status, body = _post(f"{url}/v1/{path}", gzip.compress(raw), headers)
    assert status == 200, body


def test_streamed_chat_keeps_the_last_chunks_system_fingerprint() -> None:
    """Bug 9: vLLM sends ``system_fingerprint`` in the last chunk only."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [
        (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        (None, {**base, "system_fingerprint": "fp_vllm", "choices": [], "usage": {"prompt_tokens": 1}}),
    ]
    assert assemble(Dialect.CHAT, events)["system_fingerprint"] == "fp_vllm"


# -- tito (bugs 1-4) --------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "exec_command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


@pytest.mark.slow  # a Hugging Face tokenizer and multi-turn tito sessions: 3-55 s on a loaded machine
def test_tito_prompts_are_the_templates_render_turn_after_turn(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Bug 1: the template's ``\\n`` after ``<|im_end|>`` was dropped between turns."""
    import openai

    from orchard_rec.dialects import template_message
    from orchard_rec.tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer("demo")
    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo")
    client = openai.OpenAI(base_url=f"{proxy.url}/s/render/v1", api_key="x", max_retries=0)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "S"}]
    for turn in ("run `echo one`", "and now `echo two`", "thanks"):
        msgs.append({"role": "user", "content": turn})
        before = len(upstream.fake.log)
        r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)  # type: ignore[arg-type]
        [(_, sent)] = upstream.fake.log[before:]
        want = tok.apply_chat_template(
            [template_message(m) for m in msgs], tools=TOOLS, add_generation_prompt=True, tokenize=False
        )
        assert tok.decode(sent["prompt"], skip_special_tokens=False) == want
        m = r.choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        for tc in m.tool_calls or ():
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": "ok"})
    proxy.flush()
    calls = proxy.store().calls("render")
    assert [c.metadata["tito"]["fresh"] for c in calls] == [True, False, False]


@pytest.mark.slow  # a Hugging Face tokenizer and multi-turn tito sessions: 3-55 s on a loaded machine
def test_tito_streams_like_vllm(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Bug 2: a streaming Anthropic client got ``input_tokens: 0``; bug 3: a chat client that
    did not ask for usage got a usage chunk."""
    import anthropic
    import openai

    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo")
    msgs = [{"role": "user", "content": "hello"}]
    client = openai.OpenAI(base_url=f"{proxy.url}/s/u/v1", api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=msgs, stream=True))  # type: ignore[arg-type]
    assert chunks and all(c.usage is None for c in chunks)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=msgs,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0

    ac = anthropic.Anthropic(base_url=f"{proxy.url}/s/a", api_key="x", max_retries=0)
    with ac.messages.stream(model="m", max_tokens=64, messages=msgs) as s:  # type: ignore[arg-type]
        events = list(s)
        final = s.get_final_message()
    [start] = [e for e in events if e.type == "message_start"]
    proxy.flush()
    [call] = proxy.store().calls("a")
    assert start.message.usage.input_tokens == len(call.prompt_ids) > 0
    assert final.usage.input_tokens == len(call.prompt_ids)


def _fake_token_server(answers: list[tuple[int, Any]]) -> Any:
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        status, obj = answers.pop(0)
        return web.json_response(obj, status=status)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.mark.slow  # a Hugging Face tokenizer and multi-turn tito sessions: 3-55 s on a loaded machine
def test_tito_relays_the_servers_text_and_errors(proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Bug 4: answer text was stripped and re-decoded (U+FFFD for a cut UTF-8 character);
    upstream errors were re-wrapped (type, param, code lost) and a 5xx became a 400."""
    import anthropic
    import openai

    from orchard_rec.proxy.server import BackgroundServer
    from orchard_rec.tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer("demo")
    ids = tok.encode("  hé", add_special_tokens=False)
    cut = [i for i in ids] + tok.encode("é", add_special_tokens=False)[:1]  # a partial character
    err400 = {
        "error": {
            "message": "max_tokens is too large",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }
    err503 = {
        "error": {
            "message": "engine overloaded",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }
    text = {
        "choices": [
            {"index": 0, "text": "  hé", "token_ids": cut, "finish_reason": "length", "logprobs": None}
        ]
    }
    answers: list[tuple[int, Any]] = [(200, text), (400, err400), (503, err503), (503, err503)]
    with BackgroundServer(_fake_token_server(answers)) as up:
        proxy = proxy_factory(up.url + "/v1", sqlite_url, mode="tito", tokenizer="demo")
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        r = client.chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
        assert r.choices[0].message.content == "  hé"  # the server's text: unstripped, no U+FFFD
        try:
            client.chat.completions.create(model="m", messages=msgs, max_tokens=10**9)  # type: ignore[arg-type]
            raise AssertionError("expected an error")
        except openai.BadRequestError as exc:
            assert exc.status_code == 400 and exc.body == err400["error"]
        try:
            client.chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
            raise AssertionError("expected an error")
        except openai.InternalServerError as exc:
            assert exc.status_code == 503 and exc.body == err503["error"]
        ac = anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0)
        try:
            ac.messages.create(model="m", max_tokens=8, messages=msgs)  # type: ignore[arg-type]
            raise AssertionError("expected an error")
        except anthropic.APIStatusError as exc:
            assert exc.status_code == 503
            assert exc.body == {
                "type": "error",
                "error": {"type": "api_error", "message": "engine overloaded"},
            }


def test_tito_parses_tool_calls_like_vllms_hermes_parser() -> None:
    from orchard_rec.proxy.tito_wire import parse_generation

    m = parse_generation(' Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', None)
    assert m["content"] == " Sure.\n"
    assert m["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    bad = ' x <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call><tool_call>{oops'
    assert parse_generation(bad, None) == {"role": "assistant", "content": bad}
    assert parse_generation("  keep  ", "<|im_end|>")["content"] == "  keep  "
    no_tools = parse_generation('<tool_call>{"name": "f", "arguments": {}}</tool_call>', None, tools=False)
    assert "tool_calls" not in no_tools
