"""Untagged traffic still gets sessions: from harness headers, else the conversation's opening."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def _post(url: str, body: dict, headers: dict | None = None) -> int:  # type: ignore[type-arg]
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_untagged_calls_are_grouped(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="passthrough")
    sys_msg = {"role": "system", "content": "agent A"}
    first = [sys_msg, {"role": "user", "content": "task one"}]
    _post(f"{proxy.url}/v1/chat/completions", {"model": "m", "messages": first})
    _post(
        f"{proxy.url}/v1/chat/completions",
        {
            "model": "m",
            "messages": first + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}],
        },
    )
    _post(
        f"{proxy.url}/v1/chat/completions",
        {"model": "m", "messages": [sys_msg, {"role": "user", "content": "task two"}]},
    )
    for _ in range(2):  # a harness that names its session in a header (Claude Code)
        _post(
            f"{proxy.url}/v1/messages",
            {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": f"hi {_}"}]},
            {"x-claude-code-session-id": "cc-123", "anthropic-version": "2023-06-01"},
        )
    proxy.flush()
    sessions = {s.id: s.call_count for s in proxy.store().sessions()}
    conv = sorted(n for sid, n in sessions.items() if sid.startswith("c-"))
    assert conv == [1, 2]  # same opening -> same session
    [(_cc, n)] = [(sid, n) for sid, n in sessions.items() if sid.startswith("h-claude-code-")]
    assert n == 2


def test_outcome_route_validates_and_records(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="passthrough")
    assert (
        _post(
            f"{proxy.url}/sessions/run-1/outcome",
            {
                "reward": {"tests": 1.0},
                "status": "completed",
                "step_values": [0.1, 0.5],
                "metadata": {"task": "t1"},
                "create": True,
            },
        )
        == 200
    )
    # an unknown session is an error, not a phantom session (unless "create": true above)
    assert _post(f"{proxy.url}/sessions/run-2/outcome", {"reward": 1}) == 404
    assert proxy.store().session("run-2") is None
    assert _post(f"{proxy.url}/sessions/run-1/outcome", {"reward": "high"}) == 400
    assert _post(f"{proxy.url}/sessions/run-1/outcome", {"status": "great"}) == 400
    assert _post(f"{proxy.url}/sessions/..%2Fetc/outcome", {"reward": 1}) in (400, 404)
    o = proxy.store().session("run-1").outcome
    assert o.reward == {"tests": 1.0} and o.step_values == (0.1, 0.5) and o.metadata == {"task": "t1"}
