"""orchard-rec against a real vLLM (CPU, tiny random model): the real server is the judge.

Every test routes orchard-rec's upstream traffic through a ``Tap`` that keeps what vLLM
really sent. Token mode: recorded ids and logprobs equal vLLM's, clients get vLLM's answer
less exactly the injected fields. Passthrough: bytes unchanged. tito: every prompt is the
chat template's render of the conversation, token for token (generated ids kept exact),
each uncut session is one sample, and text, usage and errors are vLLM's.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import anthropic
import openai
import orjson
import pytest

from orchard_rec.dialects import assemble, template_message
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome, Dialect

from .conftest import MODEL, Tap, VLLMServer, sse_events, strip_injected, vllm_tokens

TOOL = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}
# a conversation that already used a tool: multi-turn with tool calls and results
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "README.md setup.py"},
    {"role": "user", "content": "Now read the README."},
]
ANTH_TOOL = {
    "name": "exec_command",
    "description": "Run a shell command",
    "input_schema": TOOL["function"]["parameters"],  # type: ignore[index]
}
ANTH_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "exec_command", "input": {"cmd": "ls"}}],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "README.md setup.py"},
            {"type": "text", "text": "Now read the README."},
        ],
    },
]
RESP_TOOL = {"type": "function", "name": "exec_command", "parameters": TOOL["function"]["parameters"]}  # type: ignore[index]
RESP_INPUT: list[dict[str, Any]] = [
    {"role": "user", "content": "List the files."},
    {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "README.md setup.py"},
    {"role": "user", "content": "Now read the README."},
]
MAX = 160  # tokens per turn; the model ends turns after ~40 on average


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    h = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=orjson.dumps(body), headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _calls(proxy: Any, sid: str) -> list[Any]:
    proxy.flush()
    return proxy.store().calls(sid)


# -- token mode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_token_mode_chat_is_vllms_answer_and_ids(tap: Tap, proxy_factory, sqlite_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(tap.url, sqlite_url)
    sid = f"tok-chat-{stream}"
    msgs = list(HISTORY)
    for turn in range(3):
        n = len(tap.log)
        body = {
            "model": MODEL,
            "messages": msgs,
            "tools": [TOOL],
            "max_tokens": MAX,
            "seed": turn,
            "stream": stream,
        }
        status, raw = _post(f"{proxy.url}/s/{sid}/v1/chat/completions", body)
        assert status == 200, raw
        [ex] = tap.log[n:]
        assert ex.request["return_token_ids"] is True and ex.request["logprobs"] is True
        if stream:  # every event vLLM sent, less exactly the injected fields
            assert sse_events(raw) == [strip_injected(e) for e in ex.events()]
            obj = assemble(Dialect.CHAT, [(None, e) for e in sse_events(raw)])
        else:
            assert orjson.loads(raw) == strip_injected(ex.json())
            obj = orjson.loads(raw)
        msg = obj["choices"][0]["message"]
        msgs = msgs + [
            {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls") and v is not None}
        ]
        msgs.append({"role": "user", "content": f"turn {turn}"})
    calls = _calls(proxy, sid)
    assert len(calls) == 3 and all(c.outcome is CallOutcome.OK for c in calls)
    for call, ex in zip(calls, tap.log[-3:]):
        prompt, ids, lps = vllm_tokens(ex)
        assert list(call.prompt_ids) == prompt
        assert list(call.completion_ids) == ids
        assert list(call.completion_logprobs) == lps
        if stream:  # bug 9: vLLM's fingerprint arrives in the last chunk
            fps = [e.get("system_fingerprint") for e in ex.events() if e.get("system_fingerprint")]
            assert fps and call.response.get("system_fingerprint") == fps[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_token_mode_sdks_record_vllms_ids(tap: Tap, proxy_factory, sqlite_url, stream) -> None:  # type: ignore[no-untyped-def]
    """The real openai (Responses) and anthropic SDKs, translated to vLLM's chat endpoint."""
    proxy = proxy_factory(tap.url, sqlite_url)
    oc = openai.OpenAI(base_url=f"{proxy.url}/s/tok-resp/v1", api_key="x", max_retries=0)
    ac = anthropic.Anthropic(base_url=f"{proxy.url}/s/tok-msg", api_key="x", max_retries=0)
    texts = []
    if stream:
        with oc.responses.stream(
            model=MODEL, input=RESP_INPUT, tools=[RESP_TOOL], max_output_tokens=MAX
        ) as s:  # type: ignore[arg-type]
            events = list(s)
        # response.incomplete when the random model runs to max_output_tokens (the SDK's
        # get_final_response wants response.completed): the last event carries the response
        assert events[-1].type in ("response.completed", "response.incomplete")
        texts.append(events[-1].response.output_text)  # type: ignore[union-attr]
        with ac.messages.stream(model=MODEL, max_tokens=MAX, messages=ANTH_HISTORY, tools=[ANTH_TOOL]) as m:  # type: ignore[arg-type]
            list(m)
            final = m.get_final_message()
    else:
        texts.append(
            oc.responses.create(
                model=MODEL, input=RESP_INPUT, tools=[RESP_TOOL], max_output_tokens=MAX
            ).output_text
        )  # type: ignore[arg-type]
        final = ac.messages.create(model=MODEL, max_tokens=MAX, messages=ANTH_HISTORY, tools=[ANTH_TOOL])  # type: ignore[arg-type]
    texts.append("".join(b.text for b in final.content if b.type == "text"))
    exes = tap.log[-2:]
    for sid, ex, text in zip(("tok-resp", "tok-msg"), exes, texts):
        [call] = _calls(proxy, sid)
        prompt, ids, lps = vllm_tokens(ex)
        assert (list(call.prompt_ids), list(call.completion_ids), list(call.completion_logprobs)) == (
            prompt,
            ids,
            lps,
        )
        obj = assemble(Dialect.CHAT, [(None, e) for e in ex.events()]) if stream else ex.json()
        msg = obj["choices"][0]["message"]
        if not msg.get("tool_calls"):
            assert text == (msg.get("content") or "")
    assert final.usage.input_tokens == len(vllm_tokens(exes[1])[0])


# -- passthrough ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_passthrough_relays_vllm_byte_for_byte(tap: Tap, proxy_factory, sqlite_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(tap.url, sqlite_url, mode="passthrough")
    bodies = {
        "chat/completions": {"model": MODEL, "messages": HISTORY, "tools": [TOOL], "max_tokens": 24},
        "responses": {"model": MODEL, "input": RESP_INPUT, "tools": [RESP_TOOL], "max_output_tokens": 24},
        "messages": {"model": MODEL, "max_tokens": 24, "messages": ANTH_HISTORY, "tools": [ANTH_TOOL]},
    }
    for path, body in bodies.items():
        n = len(tap.log)
        status, raw = _post(f"{proxy.url}/s/pass/v1/{path}", {**body, "stream": stream})
        [ex] = tap.log[n:]
        assert ex.request == {**body, "stream": stream}
        assert (status, raw) == (ex.status, ex.body), path
        assert status == 200, raw


# -- tito ------------------------------------------------------------------------------------------


def _render(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return str(
        tok.apply_chat_template(
            [template_message(m) for m in messages], tools=tools, add_generation_prompt=True, tokenize=False
        )
    )


def _check_tito_session(vllm_server: VLLMServer, tap: Tap, proxy: Any, sid: str, first: int) -> list[Any]:
    """What every tito session must satisfy; returns its calls."""
    tok = vllm_server.tokenizer
    calls = _calls(proxy, sid)
    exes = tap.log[first:]
    assert len(calls) == len(exes) and all(c.outcome is CallOutcome.OK for c in calls)
    for k, (call, ex) in enumerate(zip(calls, exes)):
        assert ex.path == "/v1/completions"
        obj = ex.json()
        c = obj["choices"][0]
        assert list(call.prompt_ids) == ex.request["prompt"] == c["prompt_token_ids"]
        assert list(call.completion_ids) == c["token_ids"]
        assert list(call.completion_logprobs) == [float(x) for x in c["logprobs"]["token_logprobs"]]
        if k:  # the exact history, then the template's tokens for what is new
            prev = calls[k - 1]
            head = list(prev.prompt_ids) + list(prev.completion_ids)
            assert ex.request["prompt"][: len(head)] == head
    for call in calls:  # the template's render of the conversation the client sent, token for token
        chat = call.request if call.dialect is Dialect.CHAT else None
        if chat is not None:
            want = _render(tok, chat["messages"], chat.get("tools"))
            assert tok.decode(list(call.prompt_ids), skip_special_tokens=False) == want
    if all(c.finish_reason != "length" for c in calls[:-1]):
        samples = reconstruct_session(calls)
        assert len(samples) == 1, [c.metadata.get("tito") for c in calls]
        assert samples[0].tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
    return calls


@pytest.mark.parametrize("stream", [False, True])
def test_tito_chat_sessions_are_the_templates_render(
    vllm_server, tap, proxy_factory, sqlite_url, stream
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(tap.url, sqlite_url, mode="tito", tokenizer=str(vllm_server.model_dir))
    client = openai.OpenAI(base_url=f"{proxy.url}/s/tito-chat-{stream}/v1", api_key="x", max_retries=0)
    first = len(tap.log)
    msgs = list(HISTORY)
    for turn in range(3):
        kw = {"model": MODEL, "messages": msgs, "tools": [TOOL], "max_tokens": MAX, "seed": turn}
        n = len(tap.log)
        if stream:
            chunks = list(client.chat.completions.create(**kw, stream=True))  # type: ignore[call-overload]
            assert all(ch.usage is None for ch in chunks)  # bug 3: not asked, not sent
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            calls: dict[int, dict[str, Any]] = {}
            for ch in chunks:
                for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                    d = calls.setdefault(
                        tc.index, {"id": tc.id, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    d["function"]["name"] += tc.function.name or ""
                    d["function"]["arguments"] += tc.function.arguments or ""
            msg: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
            msg = r.choices[0].message.model_dump(
                exclude_none=True, include={"role", "content", "tool_calls"}
            )
            if r.choices[0].finish_reason != "tool_calls":  # bug 4: vLLM's own text, untouched
                assert r.choices[0].message.content == (tap.log[n].json()["choices"][0]["text"] or None)
        msgs = msgs + [msg]
        for tc in msg.get("tool_calls") or ():
            msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": "ok"})
        msgs.append({"role": "user", "content": f"next {turn}"})
    _check_tito_session(vllm_server, tap, proxy, f"tito-chat-{stream}", first)


@pytest.mark.parametrize("stream", [False, True])
def test_tito_anthropic_and_responses(vllm_server, tap, proxy_factory, sqlite_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(tap.url, sqlite_url, mode="tito", tokenizer=str(vllm_server.model_dir))
    ac = anthropic.Anthropic(base_url=f"{proxy.url}/s/tito-msg-{stream}", api_key="x", max_retries=0)
    first = len(tap.log)
    msgs = list(ANTH_HISTORY)
    for turn in range(2):
        kw = {"model": MODEL, "max_tokens": MAX, "messages": msgs, "tools": [ANTH_TOOL]}
        n = len(tap.log)
        if stream:
            with ac.messages.stream(**kw) as s:  # type: ignore[arg-type]
                events = list(s)
                final = s.get_final_message()
            [start] = [e for e in events if e.type == "message_start"]
            # bug 2: the prompt size vLLM counted, from the first event
            assert start.message.usage.input_tokens == len(tap.log[n].request["prompt"]) > 0
        else:
            final = ac.messages.create(**kw)  # type: ignore[arg-type]
        assert final.usage.input_tokens == tap.log[n].json()["usage"]["prompt_tokens"]
        msgs = msgs + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
        ]
        uses = [b for b in final.content if b.type == "tool_use"]
        parts: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in uses
        ]
        msgs.append({"role": "user", "content": parts + [{"type": "text", "text": f"next {turn}"}]})
    _check_tito_session(vllm_server, tap, proxy, f"tito-msg-{stream}", first)

    oc = openai.OpenAI(base_url=f"{proxy.url}/s/tito-resp-{stream}/v1", api_key="x", max_retries=0)
    first = len(tap.log)
    items = list(RESP_INPUT)
    for _ in range(2):
        kw2 = {"model": MODEL, "input": items, "tools": [RESP_TOOL], "max_output_tokens": MAX}
        if stream:
            with oc.responses.stream(**kw2) as rs:  # type: ignore[arg-type]
                events = list(rs)
            # a turn cut at max_output_tokens ends with response.incomplete (the SDK's
            # get_final_response wants response.completed): the last event carries the response
            assert events[-1].type in ("response.completed", "response.incomplete")
            resp = events[-1].response  # type: ignore[union-attr]
        else:
            resp = oc.responses.create(**kw2)  # type: ignore[arg-type]
        items = items + [o.model_dump(exclude_none=True) for o in resp.output]
        items += [
            {"type": "function_call_output", "call_id": o.call_id, "output": "ok"}
            for o in resp.output
            if o.type == "function_call"
        ]
        items.append({"role": "user", "content": "next"})
    _check_tito_session(vllm_server, tap, proxy, f"tito-resp-{stream}", first)


def test_tito_relays_vllms_errors(vllm_server, tap, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """Bug 4: vLLM's error (type, param, code) reaches the client as vLLM sent it."""
    proxy = proxy_factory(tap.url, sqlite_url, mode="tito", tokenizer=str(vllm_server.model_dir))
    body = {"model": MODEL, "messages": HISTORY, "max_tokens": 10**6}
    n = len(tap.log)
    status, raw = _post(f"{proxy.url}/v1/chat/completions", body)
    [ex] = tap.log[n:]
    assert ex.status >= 400
    assert (status, raw) == (ex.status, ex.body)
    err = orjson.loads(raw)["error"]
    assert {"message", "type", "param", "code"} <= set(err)
    status, raw = _post(
        f"{proxy.url}/v1/messages", {"model": MODEL, "max_tokens": 10**6, "messages": ANTH_HISTORY}
    )
    assert status == ex.status
    anth = orjson.loads(raw)
    assert anth["type"] == "error" and anth["error"]["message"] == err["message"]
