"""ZeroClaw is not installable here: its request shapes, taken from its OpenAI-compatible
provider (src/providers/compatible.rs: ``model, messages, temperature, stream, tools,
tool_choice: "auto"``; 9-character alphanumeric tool-call ids it makes itself), are
replayed over HTTP through the proxy, and its generated config is checked."""

from __future__ import annotations

import json
import tomllib
import urllib.request

import pytest

from orchard_rec.harnesses import ZEROCLAW, run_harness
from orchard_rec.reconstruct import reconstruct_session

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def _post(url: str, body: dict) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer sk-orchard",
            "User-Agent": "zeroclaw/0.9",
        },
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
    if body.get("stream"):
        content, calls = "", {}
        for block in raw.decode().split("\n\n"):
            if not block.startswith("data: {"):
                continue
            for ch in json.loads(block[6:])["choices"]:
                d = ch["delta"]
                content += d.get("content") or ""
                for tc in d.get("tool_calls") or ():
                    c = calls.setdefault(
                        tc["index"],
                        {"id": tc.get("id"), "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    c["function"]["name"] += (tc.get("function") or {}).get("name") or ""
                    c["function"]["arguments"] += (tc.get("function") or {}).get("arguments") or ""
        return {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)]}
    return json.loads(raw)["choices"][0]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_zeroclaw_request_shapes_through_the_proxy(upstream, proxy_factory, sqlite_url, stream) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    cfg = tomllib.loads(ZEROCLAW.config_toml(proxy.url, "zc-1", "fake-model"))
    base = cfg["providers"]["models"]["custom"]["orchard"]["uri"]
    assert cfg["agents"]["main"]["model_provider"] == "custom.orchard" and cfg["schema_version"] == 3
    messages = [
        {"role": "system", "content": "You are ZeroClaw."},
        {"role": "user", "content": "run `echo hi`"},
    ]
    body = {
        "model": "fake-model",
        "messages": messages,
        "temperature": 0.7,
        "tools": TOOLS,
        "tool_choice": "auto",
        "stream": stream,
    }
    m1 = _post(base + "/chat/completions", body)
    [tc] = m1["tool_calls"]
    assert json.loads(tc["function"]["arguments"]) == {"command": "echo hi"}
    # ZeroClaw keeps its own 9-alphanumeric tool-call id when it resends the history
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "aB3dE5gH7", "type": "function", "function": tc["function"]}],
        },
        {"role": "tool", "tool_call_id": "aB3dE5gH7", "content": "hi"},
    ]
    m2 = _post(base + "/chat/completions", {**body, "messages": messages})
    assert m2["content"] == "Done. The command printed: hi"
    proxy.flush()
    calls = proxy.store().calls("zc-1")
    assert len(calls) == 2 and all(c.harness == "zeroclaw" for c in calls)
    [s] = reconstruct_session(calls)
    assert s.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)


def test_zeroclaw_run_says_how_to_get_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FileNotFoundError, match="put it on PATH or pass --bin"):
        run_harness(
            ZEROCLAW, "http://127.0.0.1:9", "x", ["hi"], home=tmp_path, workdir=tmp_path, report=False
        )
    assert (tmp_path / ".zeroclaw" / "config.toml").exists()
