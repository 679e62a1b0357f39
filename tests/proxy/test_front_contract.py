"""The proxy's HTTP server, black-box: what a client gets on the wire and what is recorded.

Each test talks to a proxy started as users start it (``RecordingProxy``, or ``orchard-rec serve``
in a subprocess) over real loopback sockets: raw bytes (``rawclient``) where framing matters,
the real ``openai`` SDK for concurrency. The upstream is ``frontup.FrontUpstream`` (passthrough
mode: every byte the proxy relays is the upstream's). These tests pin the server's behaviour as
aiohttp's web server gives it, so that any other server in front of the app is judged by them:
keep-alive and pipelining, heads and bodies in pieces, chunked bodies, ``Expect: 100-continue``,
HTTP/1.0, HEAD and OPTIONS, the body limit, malformed requests, disconnects, slow readers,
response headers and framing, ``Connection: close``, graceful stop, odd paths, idle connections.
"""

from __future__ import annotations

import asyncio
import email.utils
import gzip
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from .frontup import FrontUpstream, chat_object, piece, stream_bytes
from .rawclient import RawClient, RawResponse, chunked, post_json, request

from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.server import BackgroundServer, RecordingProxy
from orchard_rec.records import CallOutcome, CallRecord
from orchard_rec.storage.store import Store

pytestmark = pytest.mark.network

LIMIT = 8192  # the proxy's max_body_bytes in these tests
CHAT = {"model": "front-model", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "front-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = chat_object("hello from upstream")


@dataclass
class Front:
    proxy: RecordingProxy
    fake: FrontUpstream
    config: ProxyConfig

    @property
    def port(self) -> int:
        return self.proxy.port

    def calls(self, sid: str | None = None, *, at_least: int = 0, wait: float = 5.0) -> list[CallRecord]:
        """The recorded calls (of session ``sid``), once at least ``at_least`` are in."""
        deadline = time.monotonic() + wait
        while True:
            assert self.proxy.flush(10), "recorder did not drain"
            store = Store(self.config.db)
            try:
                recs = store.calls(sid)
            finally:
                store.close()
            if len(recs) >= at_least or time.monotonic() > deadline:
                return recs
            time.sleep(0.05)


def _upstream(fake: FrontUpstream) -> BackgroundServer:
    return BackgroundServer(fake.app()).start()


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    fake = FrontUpstream()
    up = _upstream(fake)
    cfg = ProxyConfig(
        upstream=up.url + "/v1",
        db=f"sqlite:///{tmp_path / 'front.db'}",
        mode="passthrough",
        max_body_bytes=LIMIT,
        spool=str(tmp_path / "front.spool"),
    )
    proxy = RecordingProxy(cfg).start()
    try:
        yield Front(proxy, fake, cfg)
    finally:
        proxy.stop()
        up.stop()


def _chat(sid: str, **extra: Any) -> bytes:
    return post_json(f"/s/{sid}/v1/chat/completions", {**CHAT, **extra})


def _ok_call(r: RawResponse) -> None:
    assert (r.version, r.status, r.framing) == ("HTTP/1.1", 200, "length"), r.raw[:300]
    assert r.json() == ANSWER and r.header("x-upstream-thing") == "kept"


def _healthy(port: int) -> float:
    """Seconds a fresh connection's ``GET /healthz`` took (asserting it is a 200)."""
    t = time.monotonic()
    with RawClient(port) as c:
        c.send(request("GET", "/healthz"))
        r = c.response()
    assert r.status == 200 and r.json()["status"] == "ok"
    return time.monotonic() - t


# -- 1, 2: keep-alive and pipelining -----------------------------------------------------------------


def test_keep_alive_mixes_routes_on_one_connection(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(request("GET", "/healthz"))
        r = c.response()
        assert (r.status, r.framing) == (200, "length") and r.json()["status"] == "ok"
        c.send(post_json("/v1/chat/completions", CHAT, {"X-Orchard-Session": "mix"}))
        _ok_call(c.response("POST"))
        c.send(request("GET", "/metrics"))
        r = c.response()
        assert (r.status, r.framing) == (200, "length") and b"# TYPE" in r.body
        assert r.header("content-type") == "text/plain; charset=utf-8"
        c.send(_chat("mix"))
        _ok_call(c.response("POST"))
        c.send(request("GET", "/v1/models", headers={"X-Orchard-Session": "mix"}))
        r = c.response()
        assert (r.status, r.framing) == (200, "length") and r.json()["data"][0]["id"] == "front-model"
        c.send(request("GET", "/no/such/route"))
        r = c.response()
        assert (r.status, r.framing) == (404, "length") and r.json()["error"]["code"] == "not_found"
        c.send(_chat("mix"))
        _ok_call(c.response("POST"))
        assert not c.closed(0.2)
    recs = front.calls("mix")
    # the three chat calls and the models listing; the 404 route, /healthz and /metrics are no calls
    assert [(r.method, r.path, r.status_code, r.outcome) for r in recs] == [
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
        ("GET", "/v1/models", 200, CallOutcome.OK),
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
    ]
    assert len(front.calls()) == 4 and front.fake.seen == 3


@pytest.mark.parametrize("call_first", [True, False], ids=["call-first", "healthz-first"])
def test_pipelined_requests_are_answered_in_order(front: Front, call_first: bool) -> None:
    sid = f"pipe-{call_first}"
    reqs = [
        ("POST", _chat(sid, n=1)),
        ("GET", request("GET", "/healthz")),
        ("POST", _chat(sid, n=2)),
    ]
    if not call_first:
        reqs = [reqs[1], reqs[0], ("GET", request("GET", "/metrics")), reqs[2]]
    with RawClient(front.port) as c:
        c.send(b"".join(data for _, data in reqs))  # one write
        answers = [c.response(method) for method, _ in reqs]
        for (_, data), r in zip(reqs, answers, strict=True):
            if b"/chat/completions" in data:
                _ok_call(r)
            else:
                assert (r.status, r.framing) == (200, "length")
                if b"/healthz" in data:
                    assert r.json()["status"] == "ok"
        assert not c.closed(0.2)  # nothing more came, and the connection stays
    recs = front.calls(sid)
    assert [r.request["n"] for r in recs] == [1, 2] and {r.outcome for r in recs} == {CallOutcome.OK}


# -- 3, 4: requests in pieces, chunked bodies, Expect: 100-continue ------------------------------------


def test_head_byte_by_byte_and_body_in_three_pieces(front: Front) -> None:
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 300}]}).encode()
    head = request(
        "POST", "/s/trickle/v1/chat/completions", None, {"Content-Type": "application/json"}
    ).replace(b"\r\n\r\n", f"\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    with RawClient(front.port) as c:
        c.trickle(head, 1)
        third = len(body) // 3 + 1
        c.trickle(body, third, pause=0.05)
        _ok_call(c.response("POST"))
        c.trickle(head, 7)  # again on the same connection, in 7-byte writes
        c.trickle(body, third, pause=0.01)
        _ok_call(c.response("POST"))
    recs = front.calls("trickle")
    assert len(recs) == 2 and all(r.request_text == body.decode() and r.bytes_in == len(body) for r in recs)


def test_chunked_request_body(front: Front) -> None:
    body = json.dumps({**CHAT, "n": 7}).encode()
    pieces = (body[:5], body[5:40], body[40:])
    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    with RawClient(front.port) as c:
        c.send(request("POST", "/s/chunked/v1/chat/completions", None, headers))
        c.trickle(chunked(*pieces), 9, pause=0.005)  # the chunk framing itself in pieces
        _ok_call(c.response("POST"))
        c.send(request("POST", "/s/chunked/v1/chat/completions", chunked(*pieces), headers))
        _ok_call(c.response("POST"))
    recs = front.calls("chunked")
    assert [r.request_text for r in recs] == [body.decode()] * 2
    assert all(r.outcome is CallOutcome.OK and r.request["n"] == 7 for r in recs)


def test_expect_100_continue(front: Front) -> None:
    body = json.dumps(CHAT).encode()
    head = request(
        "POST",
        "/s/expect/v1/chat/completions",
        None,
        {"Content-Type": "application/json", "Content-Length": str(len(body)), "Expect": "100-continue"},
    )
    with RawClient(front.port) as c:
        for _ in range(2):  # twice on one connection
            c.send(head)  # as curl: the body only after the 100
            interim = c.response("POST", interim=True)
            assert (interim.version, interim.status, interim.body) == ("HTTP/1.1", 100, b"")
            assert interim.raw.startswith(b"HTTP/1.1 100 ")
            c.send(body)
            _ok_call(c.response("POST"))
    recs = front.calls("expect")
    assert [(r.outcome, r.request_text) for r in recs] == [(CallOutcome.OK, body.decode())] * 2


def test_gzip_request_body(front: Front) -> None:
    body = json.dumps({**CHAT, "n": 3}).encode()
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    with RawClient(front.port) as c:
        c.send(request("POST", "/s/gz/v1/chat/completions", gzip.compress(body), headers))
        _ok_call(c.response("POST"))
        c.send(request("POST", "/s/gz/v1/chat/completions", b"not gzip at all", headers))
        r = c.response("POST")
        assert (r.status, r.framing) == (400, "length")
        assert "content-encoding 'gzip'" in r.json()["error"]["message"]
    recs = front.calls("gz")
    assert [(r.outcome, r.status_code) for r in recs] == [(CallOutcome.OK, 200), (CallOutcome.REJECTED, 400)]
    assert recs[0].request_text == body.decode()
