"""Bad input gets a clear error in the caller's own dialect, and is recorded as rejected."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from orchard_rec.records import CallOutcome


def _post(
    url: str, data: bytes, ctype: str | None = "application/json", headers: dict[str, str] | None = None
) -> tuple[int, dict]:  # type: ignore[type-arg]
    h = {**({"Content-Type": ctype} if ctype else {}), **(headers or {})}
    req = urllib.request.Request(url, data=data, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _openai_error(body: dict) -> str:  # type: ignore[type-arg]
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    return body["error"]["message"]


def _anthropic_error(body: dict) -> str:  # type: ignore[type-arg]
    assert body["type"] == "error" and {"type", "message"} <= set(body["error"])
    return body["error"]["message"]


@pytest.fixture
def proxy(upstream, proxy_factory, sqlite_url):  # type: ignore[no-untyped-def]
    return proxy_factory(upstream.url, sqlite_url, mode="passthrough", max_body_bytes=4096)


def test_malformed_json_in_each_dialect(proxy) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(f"{proxy.url}/s/bad/v1/chat/completions", b'{"model": "m", "messages": [')
    assert status == 400 and "not valid JSON" in _openai_error(body)
    status, body = _post(f"{proxy.url}/s/bad/v1/messages", b"{nope")
    assert status == 400 and "not valid JSON" in _anthropic_error(body)
    status, body = _post(f"{proxy.url}/s/bad/v1/responses", b"[1, 2]")
    assert status == 400 and "JSON object" in _openai_error(body)
    status, body = _post(f"{proxy.url}/s/bad/v1/chat/completions", b'{"stream": "yes"}')
    assert status == 400 and body["error"]["param"] == "stream"
    status, body = _post(f"{proxy.url}/s/bad/v1/chat/completions", b"\xff\xfe{}")
    assert status == 400
    proxy.flush()
    recs = proxy.store().calls("bad")
    assert len(recs) == 5 and all(r.outcome is CallOutcome.REJECTED and r.status_code == 400 for r in recs)


def test_wrong_content_type_and_oversized_body(proxy) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(
        f"{proxy.url}/v1/chat/completions", b"model=m", ctype="application/x-www-form-urlencoded"
    )
    assert status == 415 and "content-type" in _openai_error(body)
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 10000}]}).encode()
    status, body = _post(f"{proxy.url}/v1/chat/completions", big)
    assert status == 413 and "4096" in _openai_error(body)
    status, body = _post(f"{proxy.url}/v1/messages", big, headers={"anthropic-version": "2023-06-01"})
    assert status == 413 and body["error"]["type"] == "request_too_large"


def test_unknown_route_and_bad_session_id(proxy) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(f"{proxy.url}/v2/chat/completions", b"{}")
    assert status == 404 and "no route" in _openai_error(body)
    status, body = _post(f"{proxy.url}/s/{'x' * 200}/v1/chat/completions", b"{}")
    assert status == 400 and "session id" in _openai_error(body)
    status, body = _post(
        f"{proxy.url}/v1/chat/completions", b"{}", headers={"X-Orchard-Session": "../../etc/passwd"}
    )
    assert status == 400 and "session id" in _openai_error(body)


def test_unreachable_upstream_is_a_502_in_dialect_and_recorded_failed(proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    proxy = proxy_factory(f"http://127.0.0.1:{dead}/v1", sqlite_url, mode="passthrough")
    status, body = _post(f"{proxy.url}/s/dead/v1/chat/completions", b'{"model": "m", "messages": []}')
    assert status == 502 and "unreachable" in _openai_error(body)
    status, body = _post(
        f"{proxy.url}/s/dead/v1/messages", b'{"model": "m", "messages": [], "max_tokens": 5}'
    )
    assert status == 502 and "unreachable" in _anthropic_error(body)
    proxy.flush()
    recs = proxy.store().calls("dead")
    assert [r.outcome for r in recs] == [CallOutcome.FAILED, CallOutcome.FAILED]
    assert all(r.status_code == 502 and "Connect" in (r.error or "") for r in recs)


def test_upstream_errors_are_relayed_with_status_and_body(upstream, proxy) -> None:  # type: ignore[no-untyped-def]
    status, body = _post(f"{proxy.url}/s/uperr/v1/chat/completions", b'{"model": "m"}')
    assert status == 400 and body["error"]["message"].startswith("messages")
    proxy.flush()
    [rec] = proxy.store().calls("uperr")
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR and rec.status_code == 400 and rec.response == body


def test_websocket_upgrade_is_refused_at_once(proxy) -> None:  # type: ignore[no-untyped-def]
    req = urllib.request.Request(
        f"{proxy.url}/v1/responses",
        headers={
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 426


def test_paths_no_route_takes_are_a_404_in_dialect(proxy) -> None:  # type: ignore[no-untyped-def]
    # a line break in the path: the router's own catch-all would not take it (its ``.*`` stops
    # there); every route answers its errors itself (``edge.guarded``, no middleware chain)
    for path in ("/v1/foo%0Abar", "/foo%0Abar", "/%0A", "/s/abc/v1/x%0Ay", "/s/abc/q%0Ar"):
        for method in ("GET", "POST", "PUT"):
            req = urllib.request.Request(f"{proxy.url}{path}", data=b"{}" if method != "GET" else None)
            req.method = method
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    status, raw = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read()
            assert status == 404 and "no route" in _openai_error(json.loads(raw)), (method, path)


def test_a_bug_of_ours_is_a_500_in_dialect_and_recorded(proxy, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    from orchard_rec.proxy import core

    def broken(self, data, status):  # type: ignore[no-untyped-def]
        raise KeyError("boom")

    monkeypatch.setattr(core.Call, "body", broken)
    status, body = _post(
        f"{proxy.url}/s/bug/v1/messages",
        json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"anthropic-version": "2023-06-01"},
    )
    assert status == 500 and "internal proxy error (KeyError)" in _anthropic_error(body)
    assert "internal error on POST /s/bug/v1/messages" in caplog.text
    proxy.flush()
    (rec,) = proxy.store().calls("bug")
    assert rec.outcome is CallOutcome.FAILED and rec.status_code == 500 and "KeyError" in (rec.error or "")
