"""Harness recognition from the plug-ins' data, probes, and side conversations (fast).

Headers and bodies are those the real CLIs sent (``shared/HARNESSES.md``, observed with the
pinned versions); the real CLIs themselves run in ``test_plugin_harnesses.py``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.harnesses import KIMI, PI, identify, is_probe, side_conversation
from orchard_rec.proxy.identity import derive_session
from orchard_rec.records import Dialect

HERMES_TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {}}}
    for n in ("browser_click", "delegate_task", "session_search", "skill_view", "terminal", "todo")
]


def test_each_harness_is_named_by_what_it_sends() -> None:
    cases = [
        (
            {"User-Agent": "codex_exec/0.171.0 (Linux)", "originator": "codex_exec", "session-id": "t1"},
            None,
            ("codex", "t1"),
        ),
        (
            {"User-Agent": "claude-cli/2.1.332 (external, sdk-cli)", "X-Claude-Code-Session-Id": "c1"},
            None,
            ("claude-code", "c1"),
        ),
        (
            {"User-Agent": "OpenAI/JS 6.26.0", "session_id": "019a", "x-session-affinity": "019a"},
            None,
            ("pi", "019a"),
        ),
        (
            {
                "User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14",
                "x-session-id": "ses_1",
            },
            None,
            ("opencode", "ses_1"),
        ),
        (
            {"User-Agent": "KimiCLI/1.50.0", "X-Msh-Platform": "kimi_cli"},
            {"prompt_cache_key": "k-1", "messages": []},
            ("kimi", "k-1"),
        ),
        ({"User-Agent": "OpenAI/Python 2.24.0"}, {"messages": [], "tools": HERMES_TOOLS}, ("hermes", None)),
        (
            {"User-Agent": "OpenAI/Python 2.24.0"},
            {"messages": [], "tools": HERMES_TOOLS[:2]},
            ("openai-python", None),
        ),
        ({"User-Agent": "OpenAI/JS 6.26.0"}, None, ("openai-node", None)),
    ]
    for headers, body, want in cases:
        assert identify(headers, body) == want, headers
    oc = {
        "messages": [
            {"role": "system", "content": "..."},
            {
                "role": "user",
                "content": "[Wed 2026-12-02 14:57 UTC] hi\n\nRuntime: agent=main | session=agent:main:explicit:0a1b2c3d-0000 | sessionId=0a1b2c3d-0000 | host=x",
            },
        ]
    }
    assert identify({"user-agent": "OpenAI/JS 7.15.0", "traceparent": "00-" + "a" * 32 + "-b-01"}, oc) == (
        "openclaw",
        "0a1b2c3d-0000",
    )
    # the harness's own session id names the session when the URL has none: two runs, two sessions
    a = derive_session("kimi", "k-1", Dialect.CHAT, {"messages": [{"role": "user", "content": "same"}]})
    b = derive_session("kimi", "k-2", Dialect.CHAT, {"messages": [{"role": "user", "content": "same"}]})
    assert a != b and a.startswith("h-kimi-")  # type: ignore[union-attr]


def test_side_conversations_and_probes() -> None:
    title = {
        "messages": [
            {"role": "system", "content": "You are a title generator. You output ONLY a thread title."}
        ]
    }
    assert side_conversation("opencode", {}, title) == "title"
    assert (
        side_conversation("opencode", {}, {"messages": [{"role": "system", "content": "You are opencode"}]})
        is None
    )
    assert side_conversation("pi", {}, title) is None  # only the plug-in that declares it
    assert (
        side_conversation("claude-code", {"X-Claude-Code-Auxiliary-Type": "memory_save"}, {}) == "memory_save"
    )
    for path in ("/api/v1/models", "/api/tags", "/v1/props", "/props", "/version", "/"):
        assert is_probe("GET", path, {"user-agent": "python-httpx/0.28.1"})
    assert is_probe("GET", "/v1/models", {"user-agent": "python-requests/2.33.0"})
    assert not is_probe(
        "GET", "/v1/models", {"user-agent": "OpenAI/Python 2.24.0"}
    )  # a client listing models
    assert not is_probe("POST", "/api/tags", {"user-agent": "python-httpx/0.28.1"})


def _get(url: str, ua: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"User-Agent": ua})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_probes_are_relayed_not_recorded(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url)
    for base in (proxy.url, proxy.url + "/s/run-1"):
        for path in ("/api/v1/models", "/api/tags", "/v1/props", "/props", "/version"):
            status, _ = _get(base + path, "python-httpx/0.28.1")
            assert status == 404  # the demo upstream has none of them: its answer is relayed
        status, body = _get(base + "/v1/models", "python-requests/2.33.0")
        assert status == 200 and json.loads(body)["data"]  # relayed from the upstream
    status, body = _get(proxy.url + "/v1/models", "OpenAI/Python 2.24.0")
    assert status == 200
    status, body = _get(proxy.url + "/nothing/here", "python-httpx/0.28.1")
    assert status == 404 and b"no route" in body
    proxy.flush()
    calls = proxy.store().calls()
    assert [(c.path, c.harness) for c in calls] == [
        ("/v1/models", "openai-python")
    ]  # only the real client's call


def test_plugin_config_snippets() -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["harness", "config", "pi", "--session", "s1"]).output
    assert '"baseUrl": "http://127.0.0.1:8100/s/s1/v1"' in out and '"sendSessionAffinityHeaders": true' in out
    out = runner.invoke(app, ["harness", "config", "opencode", "--session", "s1"]).output
    assert '"baseURL": "http://127.0.0.1:8100/s/s1/v1"' in out and "@ai-sdk/openai-compatible" in out
    out = runner.invoke(app, ["harness", "config", "hermes", "--session", "s1"]).output
    assert 'base_url: "http://127.0.0.1:8100/s/s1/v1"' in out and "provider: custom" in out
    out = runner.invoke(app, ["harness", "config", "kimi"]).output
    assert 'base_url = "http://127.0.0.1:8100/v1"' in out and 'type = "kimi"' in out
    r = runner.invoke(app, ["run", "nope", "--upstream", "http://127.0.0.1:9/v1"])
    assert r.exit_code == 2 and "unknown harness 'nope'" in r.output and "Traceback" not in r.output


def test_install_folders_are_per_harness(tmp_path: Path) -> None:
    from orchard_rec.harnesses.install import folder

    assert folder(PI, tmp_path) == tmp_path / "pi" and folder(KIMI, tmp_path) == tmp_path / "kimi"


def _post(url: str, body: dict, headers: dict[str, str]) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def test_side_conversation_is_its_own_flagged_sample(upstream, proxy_factory, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from orchard_rec.exporters.pipeline import export

    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    headers = {"User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.23", "x-session-id": "ses_abc"}
    url = proxy.url + "/v1/chat/completions"  # no /s/ID: the session comes from x-session-id
    title = [
        {"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
        {"role": "user", "content": "Generate a title for this conversation:"},
        {"role": "user", "content": "hello there"},
    ]
    _post(url, {"model": "m", "messages": title}, headers)
    agent = [{"role": "system", "content": "You are opencode."}, {"role": "user", "content": "hello there"}]
    answer = _post(url, {"model": "m", "messages": agent}, headers)["choices"][0]["message"]
    agent += [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "thanks"}]
    _post(url, {"model": "m", "messages": agent}, headers)
    proxy.flush()
    calls = proxy.store().calls()
    assert len({c.session_id for c in calls}) == 1 and calls[0].session_id.startswith("h-opencode-")  # type: ignore[union-attr]
    assert [c.metadata.get("auxiliary") for c in calls] == ["title", None, None]
    out = tmp_path / "s.jsonl"
    export(sqlite_url, "jsonl", out)  # kept, flagged
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["metadata"].get("auxiliary"), len(r["metadata"]["call_ids"])) for r in rows] == [
        (True, 1),
        (None, 2),
    ]
    export(sqlite_url, "jsonl", out, auxiliary=False)
    assert len(out.read_text().splitlines()) == 1
    assert export(sqlite_url, "openrlhf", tmp_path / "o.jsonl").samples == 1  # trainer formats: left out
    assert export(sqlite_url, "openrlhf", tmp_path / "o.jsonl", auxiliary=True).samples == 2
