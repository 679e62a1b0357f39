"""Google's Gemini API through the proxy, with the real ``google-genai`` SDK as the client.

Passthrough relays the demo upstream's native Gemini answers (``orchard_rec.demo.gemini``, code
of its own) byte for byte; token and tito modes translate to chat upstream and back, objects and
event streams. The SDK parses every answer (its pydantic models), and a tool-using session is one
exact sample. The API key (``x-goog-api-key`` or ``?key=``) reaches the upstream in passthrough and
is stored nowhere.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from factories import check_invariants, post_json
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome

from .agents import INJECTED, TURNS, tool_output

KEY = "AIzaSy-orchard-secret-1234"
SHELL = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def gemini_agent(base_url: str, stream: bool | None = None, version: str = "v1beta") -> int:
    """A Gemini CLI-like loop: resends ``contents`` whole, answers each ``functionCall`` with a
    ``functionResponse`` carrying its id; alternates stream / non-stream when ``stream`` is None.
    ``version``: Gemini CLI's bundled SDK calls ``v1beta``, the Python SDK's default is ``v1``."""
    client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=base_url, api_version=version))
    config = types.GenerateContentConfig(
        system_instruction="You are an agent.",
        tools=[
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(
                        name="run_shell_command", description="Runs a command.", parameters_json_schema=SHELL
                    )
                ]
            )
        ],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list[types.Content] = []
    n = 0
    for turn in TURNS:
        contents.append(types.Content(role="user", parts=[types.Part(text=turn)]))
        while True:
            s = (n % 2 == 1) if stream is None else stream
            n += 1
            if s:
                parts: list[types.Part] = []
                for chunk in client.models.generate_content_stream(
                    model="fake-model", contents=contents, config=config
                ):
                    _clean(chunk)
                    parts += chunk.candidates[0].content.parts or []  # type: ignore[index,union-attr]
            else:
                resp = client.models.generate_content(model="fake-model", contents=contents, config=config)
                _clean(resp)
                parts = list(resp.candidates[0].content.parts or [])  # type: ignore[index,union-attr]
            text = "".join(p.text or "" for p in parts if p.text and not p.thought)
            model_parts = [p for p in parts if p.function_call is not None]
            if text:
                model_parts.insert(0, types.Part(text=text))
            contents.append(types.Content(role="model", parts=model_parts))
            calls = [p.function_call for p in parts if p.function_call is not None]
            if not calls:
                break
            contents.append(
                types.Content(
                    role="user",
                    parts=[
                        types.Part(
                            function_response=types.FunctionResponse(
                                id=fc.id,
                                name=fc.name,
                                response={"output": tool_output((fc.args or {})["command"])},
                            )
                        )
                        for fc in calls
                    ],
                )
            )
    return n


def _clean(obj: Any) -> None:
    dumped = json.dumps(obj.model_dump(mode="json"))
    for k in INJECTED:
        assert k not in dumped, f"client received injected field {k}"


def _no_key_stored(proxy: Any, db: str) -> None:
    """The credential is nowhere in the database or the spool (files read as bytes)."""
    proxy.flush()
    files = [Path(db.removeprefix("sqlite:///"))]
    files += list(files[0].parent.glob(files[0].name + "*")) + list(Path(proxy.config.spool).parent.glob("*"))
    for f in files:
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f


BODY = {
    "contents": [{"role": "user", "parts": [{"text": "run `ls`"}]}],
    "systemInstruction": {"parts": [{"text": "You are an agent."}]},
    "tools": [{"functionDeclarations": [{"name": "run_shell_command", "parametersJsonSchema": SHELL}]}],
}


@pytest.mark.parametrize("stream", [False, True])
def test_passthrough_relays_the_upstreams_bytes_and_stores_no_key(
    upstream, proxy_factory, sqlite_url, stream
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="passthrough")
    verb = "streamGenerateContent?alt=sse&" if stream else "generateContent?"
    got = post_json(f"{proxy.url}/s/bytes/v1beta/models/gem-1:{verb}key={KEY}", BODY, {"x-goog-api-key": KEY})
    assert got == upstream.fake.sent[-1]  # byte for byte (CRLF-framed events included)
    assert upstream.fake.log[-1] == ("/v1beta/models/gem-1:" + verb.split("?")[0], BODY)
    assert upstream.fake.headers[-1]["x-goog-api-key"] == KEY  # the client's credential reaches the upstream
    proxy.flush()
    [rec] = proxy.store().calls("bytes")
    assert rec.dialect == "gemini" and rec.model == "gem-1" and rec.stream is stream
    assert rec.path == f"/v1beta/models/gem-1:{verb}key=REDACTED" and "x-goog-api-key" not in rec.headers
    assert rec.response["candidates"][0]["content"]["parts"][0]["functionCall"]["name"] == "run_shell_command"
    assert rec.finish_reason == "STOP" and rec.usage["totalTokenCount"] > 0  # type: ignore[index]
    _no_key_stored(proxy, sqlite_url)


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
@pytest.mark.parametrize("version", ["v1beta", "v1"])
def test_the_sdk_runs_a_tool_session_in_passthrough(upstream, proxy_factory, sqlite_url, version) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="passthrough")
    n = gemini_agent(f"{proxy.url}/s/pass", version=version)
    proxy.flush()
    calls = proxy.store().calls("pass")
    assert len(calls) == n >= 4 and all(c.outcome is CallOutcome.OK and c.dialect == "gemini" for c in calls)
    assert [c.stream for c in calls] == [k % 2 == 1 for k in range(n)]
    assert {c.path.split("/")[1] for c in calls} == {version}


@pytest.mark.parametrize("stream", [None, True, False])
def test_token_mode_translates_and_a_session_is_one_exact_sample(
    upstream, proxy_factory, sqlite_url, stream
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    n = gemini_agent(f"{proxy.url}/s/tok", stream)
    up = [b for p, b in upstream.fake.log]
    assert all(b["return_token_ids"] is True and b["model"] == "fake-model" for b in up)  # chat upstream
    assert all(b["messages"][0] == {"role": "system", "content": "You are an agent."} for b in up)
    proxy.flush()
    calls = proxy.store().calls("tok")
    assert len(calls) == n >= 4 and all(c.outcome is CallOutcome.OK and c.prompt_ids for c in calls)
    for a, b in itertools.pairwise(calls):  # each prompt extends the last call's prompt and answer exactly
        assert list(b.prompt_ids)[: len(a.prompt_ids) + len(a.completion_ids)] == list(a.prompt_ids) + list(
            a.completion_ids
        )
    assert all(c.response["candidates"][0]["finishReason"] == "STOP" for c in calls)
    [sample] = reconstruct_session(calls, on_mismatch="split")
    check_invariants(calls, [sample])
    assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
    _no_key_stored(proxy, sqlite_url)


@pytest.mark.slow
@pytest.mark.network
def test_tito_mode_is_exact(upstream_factory, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(drift=True)
    proxy = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo")
    n = gemini_agent(f"{proxy.url}/s/tito")
    proxy.flush()
    calls = proxy.store().calls("tito")
    assert len(calls) == n and [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * (n - 1)
    [sample] = reconstruct_session(calls)
    assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)


@pytest.mark.parametrize("mode", ["passthrough", "token"])
def test_bad_input_is_a_gemini_error(upstream, proxy_factory, sqlite_url, mode) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode=mode)
    req = urllib.request.Request(
        f"{proxy.url}/v1beta/models/m:generateContent",
        data=b"{nope",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    err = orjson.loads(e.value.read())["error"]
    assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT" and "not valid JSON" in err["message"]
    client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=proxy.url))
    with pytest.raises(genai_errors.ClientError) as ce:
        client.models.generate_content(
            model="m", contents=[types.Content(role="user", parts=[])]
        )  # the API's own 400
    assert ce.value.code == 400
