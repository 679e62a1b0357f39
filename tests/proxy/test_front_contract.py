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
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard_rec.records import CallOutcome

from .frontup import (
    ANSWER,
    CHAT,
    MODEL,
    Front,
    FrontUpstream,
    chat,
    healthz_time,
    ok_call,
    piece,
    running_front,
    stored_calls,
    stream_bytes,
    upstream,
)
from .rawclient import RawClient, RawResponse, chunked, post_json, request

pytestmark = pytest.mark.network

LIMIT = 8192  # the proxy's max_body_bytes in these tests
MESSAGES = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    with running_front(tmp_path, max_body_bytes=LIMIT) as f:
        yield f


# -- 1, 2: keep-alive and pipelining -----------------------------------------------------------------


def test_keep_alive_mixes_routes_on_one_connection(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(request("GET", "/healthz"))
        r = c.response()
        assert (r.status, r.framing) == (200, "length") and r.json()["status"] == "ok"
        c.send(post_json("/v1/chat/completions", CHAT, {"X-Orchard-Session": "mix"}))
        ok_call(c.response("POST"))
        c.send(request("GET", "/metrics"))
        r = c.response()
        assert (r.status, r.framing) == (200, "length") and b"# TYPE" in r.body
        assert r.header("content-type") == "text/plain; charset=utf-8"
        c.send(chat("mix"))
        ok_call(c.response("POST"))
        c.send(request("GET", "/v1/models", headers={"X-Orchard-Session": "mix"}))
        r = c.response()
        assert (r.status, r.framing) == (200, "length") and r.json()["data"][0]["id"] == "front-model"
        c.send(request("GET", "/no/such/route"))
        r = c.response()
        assert (r.status, r.framing) == (404, "length") and r.json()["error"]["code"] == "not_found"
        c.send(chat("mix"))
        ok_call(c.response("POST"))
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
        ("POST", chat(sid, n=1)),
        ("GET", request("GET", "/healthz")),
        ("POST", chat(sid, n=2)),
    ]
    if not call_first:
        reqs = [reqs[1], reqs[0], ("GET", request("GET", "/metrics")), reqs[2]]
    with RawClient(front.port) as c:
        c.send(b"".join(data for _, data in reqs))  # one write
        answers = [c.response(method) for method, _ in reqs]
        for (_, data), r in zip(reqs, answers, strict=True):
            if b"/chat/completions" in data:
                ok_call(r)
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
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    head = request("POST", "/s/trickle/v1/chat/completions", None, headers)
    with RawClient(front.port) as c:
        c.trickle(head, 1)
        third = len(body) // 3 + 1
        c.trickle(body, third, pause=0.05)
        ok_call(c.response("POST"))
        c.trickle(head, 7)  # again on the same connection, in 7-byte writes
        c.trickle(body, third, pause=0.01)
        ok_call(c.response("POST"))
    recs = front.calls("trickle")
    assert len(recs) == 2 and all(r.request_text == body.decode() and r.bytes_in == len(body) for r in recs)


def test_chunked_request_body(front: Front) -> None:
    body = json.dumps({**CHAT, "n": 7}).encode()
    pieces = (body[:5], body[5:40], body[40:])
    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    with RawClient(front.port) as c:
        c.send(request("POST", "/s/chunked/v1/chat/completions", None, headers))
        c.trickle(chunked(*pieces), 9, pause=0.005)  # the chunk framing itself in pieces
        ok_call(c.response("POST"))
        c.send(request("POST", "/s/chunked/v1/chat/completions", chunked(*pieces), headers))
        ok_call(c.response("POST"))
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
            ok_call(c.response("POST"))
    recs = front.calls("expect")
    assert [(r.outcome, r.request_text) for r in recs] == [(CallOutcome.OK, body.decode())] * 2


def test_gzip_request_body(front: Front) -> None:
    body = json.dumps({**CHAT, "n": 3}).encode()
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    with RawClient(front.port) as c:
        c.send(request("POST", "/s/gz/v1/chat/completions", gzip.compress(body), headers))
        ok_call(c.response("POST"))
        c.send(request("POST", "/s/gz/v1/chat/completions", b"not gzip at all", headers))
        r = c.response("POST")
        assert (r.status, r.framing) == (400, "length")
        assert "content-encoding 'gzip'" in r.json()["error"]["message"]
    recs = front.calls("gz")
    assert [(r.outcome, r.status_code) for r in recs] == [(CallOutcome.OK, 200), (CallOutcome.REJECTED, 400)]
    assert recs[0].request_text == body.decode()


# -- 5: HTTP/1.0, HEAD, OPTIONS ----------------------------------------------------------------------


def test_http10_is_answered_in_http10_and_closed_unless_kept_alive(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(post_json("/s/h10/v1/chat/completions", CHAT, version="HTTP/1.0"))
        r = c.response("POST")
        assert (r.version, r.status, r.framing) == ("HTTP/1.0", 200, "length") and r.json() == ANSWER
        assert r.header("connection") is None
        assert c.closed()
    with RawClient(front.port) as c:  # a stream: no chunked coding in 1.0, the close ends the body
        c.send(post_json("/s/h10/v1/chat/completions", {**CHAT, "stream": True}, version="HTTP/1.0"))
        r = c.response("POST")
        assert (r.version, r.status, r.framing) == ("HTTP/1.0", 200, "close")
        assert r.body == stream_bytes(3, 8) and r.header("transfer-encoding") is None
        assert c.closed()
    with RawClient(front.port) as c:
        for _ in range(2):
            c.send(
                post_json(
                    "/s/h10/v1/chat/completions", CHAT, {"Connection": "keep-alive"}, version="HTTP/1.0"
                )
            )
            r = c.response("POST")
            assert (r.version, r.status, r.framing) == ("HTTP/1.0", 200, "length") and r.json() == ANSWER
            assert r.header("connection") == "keep-alive"
        assert not c.closed(0.3)
    recs = front.calls("h10")
    assert [(r.stream, r.outcome) for r in recs] == [
        (False, CallOutcome.OK),
        (True, CallOutcome.OK),
        (False, CallOutcome.OK),
        (False, CallOutcome.OK),
    ]


def test_head_of_a_relayed_route_and_of_healthz(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(request("HEAD", "/s/head/v1/models"))
        r = c.response("HEAD")
        assert (r.version, r.status) == ("HTTP/1.1", 200)
        assert r.header("x-upstream-thing") == "kept" and r.header("content-type") is not None
        assert r.header("content-length") is None and r.header("transfer-encoding") is None
        c.send(request("HEAD", "/healthz"))
        r = c.response("HEAD")
        assert r.status == 200 and r.header("content-type") == "application/json; charset=utf-8"
        c.send(request("GET", "/healthz"))  # no body bytes were sent after either head
        r = c.response()
        assert r.status == 200 and r.json()["status"] == "ok"
        assert r.raw.startswith(b"HTTP/1.1 200 ")
    recs = front.calls("head")
    assert [(r.method, r.path, r.status_code, r.outcome) for r in recs] == [
        ("HEAD", "/v1/models", 200, CallOutcome.OK)
    ]


def test_options_on_a_call_route_is_relayed(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(request("OPTIONS", "/s/opt/v1/chat/completions"))
        r = c.response("OPTIONS")  # the upstream's own answer (aiohttp: 405, Allow: POST)
        assert (r.status, r.framing, r.body) == (405, "length", b"405: Method Not Allowed")
        assert r.header("allow") == "POST"
        c.send(chat("opt"))
        ok_call(c.response("POST"))
    recs = front.calls("opt")
    assert [(r.method, r.status_code, r.outcome) for r in recs] == [
        ("OPTIONS", 405, CallOutcome.UPSTREAM_ERROR),
        ("POST", 200, CallOutcome.OK),
    ]


# -- 6, 7: too large, malformed ----------------------------------------------------------------------


TOO_LARGE = f"request body is larger than the proxy's limit of {LIMIT} bytes"


def _too_large(r: RawResponse) -> dict[str, Any]:
    """The body of a 413 (whole, JSON, with the limit in its message)."""
    assert (r.version, r.status, r.framing) == ("HTTP/1.1", 413, "length")
    assert r.header("content-type") == "application/json"
    body: dict[str, Any] = r.json()
    assert body["error"]["message"] == TOO_LARGE
    return body


def test_body_over_the_limit_is_413_in_dialect_and_the_connection_stays(front: Front) -> None:
    pad = "x" * (LIMIT + 10)
    with RawClient(front.port) as c:
        c.send(chat("big", pad=pad))
        assert _too_large(c.response("POST")) == {  # OpenAI's error shape
            "error": {
                "message": TOO_LARGE,
                "type": "invalid_request_error",
                "param": None,
                "code": "request_too_large",
            }
        }
        c.send(post_json("/s/big/v1/messages", {**MESSAGES, "pad": pad}, {"anthropic-version": "2023-06-01"}))
        assert _too_large(c.response("POST")) == {  # Anthropic's
            "type": "error",
            "error": {"type": "request_too_large", "message": TOO_LARGE},
        }
        body = json.dumps({**CHAT, "pad": pad}).encode()
        te = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        c.send(request("POST", "/s/big/v1/chat/completions", chunked(body[:100], body[100:]), te))
        _too_large(c.response("POST"))
        c.send(chat("big", pad="y" * 300_000))  # far over: the rest is read and dropped
        _too_large(c.response("POST"))
        c.send(chat("big"))  # the same connection goes on
        ok_call(c.response("POST"))
    recs = front.calls("big")
    assert [(r.status_code, r.outcome, r.bytes_in) for r in recs] == [(413, CallOutcome.REJECTED, 0)] * 4 + [
        (200, CallOutcome.OK, len(json.dumps(CHAT)))
    ]
    assert all("limit of 8192 bytes" in (r.error or "") for r in recs[:4])
    assert front.fake.seen == 1


def test_body_over_the_limit_after_expect_100_continue(front: Front) -> None:
    body = json.dumps({**CHAT, "pad": "x" * (LIMIT + 10)}).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "Expect": "100-continue"}
    with RawClient(front.port) as c:
        c.send(request("POST", "/s/big100/v1/chat/completions", None, headers))
        assert c.response("POST", interim=True).status == 100
        c.send(body)
        _too_large(c.response("POST"))
    recs = front.calls("big100")
    assert [(r.status_code, r.outcome) for r in recs] == [(413, CallOutcome.REJECTED)]


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
        b"POST /s/bad/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /s/bad/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}{",
        b"POST /s/bad/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /healthz?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
        b"POST /s/bad/v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
        b"get /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\nHost: x\n\n",
    ],
    ids=[
        "request-line",
        "header-line",
        "content-length",
        "nul-in-value",
        "length-and-chunked",
        "two-lengths",
        "chunk-size",
        "header-over-8190",
        "target-over-8190",
        "200-headers",
        "http11-without-host",
        "lower-case-method",
        "bare-lf",
    ],
)
def test_malformed_request_is_400_and_closed_and_others_go_on(front: Front, raw: bytes) -> None:
    """Nothing is recorded of it (not even on a call route)."""
    with RawClient(front.port) as other:  # a connection opened before, kept alive
        other.send(chat("bad"))
        ok_call(other.response("POST"))
        with RawClient(front.port) as c:
            c.send(raw)
            r = c.response()
            assert r.status == 400 and r.framing == "length"
            assert c.closed()
        other.send(chat("bad"))
        ok_call(other.response("POST"))
    assert healthz_time(front.port) < 1.0
    assert len(front.calls("bad")) == 2 and len(front.calls()) == 2


def test_empty_bodies_and_targets_that_are_no_paths(front: Front) -> None:
    """A call without a body is the dialect's 400 (recorded rejected); ``CONNECT host:port`` and
    ``OPTIONS *`` are plain 404s; the connection goes on after each."""
    with RawClient(front.port) as c:
        for data in (
            request("POST", "/s/empty/v1/chat/completions", b"", {"Content-Type": "application/json"}),
            request("POST", "/s/empty/v1/chat/completions", None, {"Content-Type": "application/json"}),
        ):
            c.send(data)
            r = c.response("POST")
            assert (r.status, r.framing) == (400, "length")
            assert r.json()["error"]["message"].startswith("request body is not valid JSON")
        for data in (
            b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        ):
            c.send(data)
            r = c.response()
            assert (r.status, r.framing) == (404, "length")
        c.send(chat("empty"))
        ok_call(c.response("POST"))
    recs = front.calls("empty")
    assert [(r.status_code, r.outcome) for r in recs] == [(400, CallOutcome.REJECTED)] * 2 + [
        (200, CallOutcome.OK)
    ]
    assert len(front.calls()) == 3


# -- 8, 9: a client gone mid-stream, a slow reader ----------------------------------------------------


def test_client_gone_mid_stream_is_recorded_aborted(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(chat("gone", stream=True, x_chunks=400, x_delay=0.02))
        c.read_until(piece(1, 8).encode())  # the head and two chunks: then the client leaves
    [rec] = front.calls("gone", at_least=1)
    assert rec.outcome is CallOutcome.ABORTED and rec.stream and rec.status_code == 200
    assert rec.error == "client disconnected"
    assert rec.events is not None and 2 <= len(rec.events) < 400
    assert healthz_time(front.port) < 1.0
    with RawClient(front.port) as c:
        c.send(chat("after-gone"))
        ok_call(c.response("POST"))
    assert [r.outcome for r in front.calls("after-gone")] == [CallOutcome.OK]


def test_slow_reader_gets_every_byte_while_others_are_served(front: Front) -> None:
    chunks, size = 120, 32 * 1024  # ~4 MB of events
    got: list[RawResponse] = []
    c = RawClient(front.port, timeout=10, rcvbuf=16 * 1024)
    c.recv_size, c.pause = 8192, 0.002

    def read() -> None:
        got.append(c.response("POST"))

    with c:
        c.send(chat("slow", stream=True, x_chunks=chunks, x_size=size))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while c.received < 1024 * 1024 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.received >= 1024 * 1024 and reader.is_alive()  # the stream is mid-way
        waits = [healthz_time(front.port) for _ in range(3)]
        assert max(waits) < 1.0, waits
        reader.join(20)
        assert not reader.is_alive()
    [r] = got
    assert (r.status, r.framing) == (200, "chunked")
    assert r.body == stream_bytes(chunks, size)  # intact and in order
    [rec] = front.calls("slow")
    assert rec.outcome is CallOutcome.OK and rec.stream
    assert rec.response["choices"][0]["message"]["content"] == "".join(piece(i, size) for i in range(chunks))


# -- 10, 11: response headers and framing, Connection: close --------------------------------------------


def _relayed_headers(r: RawResponse) -> None:
    """The upstream's own header arrives, its hop-by-hop ones do not; one ``Date``, at most one ``Server``."""
    assert r.header("x-upstream-thing") == "kept"
    assert "keep-alive" not in r.names  # the upstream sent one
    date = r.header("date")
    assert date is not None and date.endswith(" GMT")
    assert abs(email.utils.parsedate_to_datetime(date).timestamp() - time.time()) < 60
    assert len(r.values("server")) <= 1  # its value is the server's own business


def test_response_headers_and_framing(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(chat("hdr"))
        r = c.response("POST")
        ok_call(r)
        _relayed_headers(r)
        assert r.header("content-length") == str(len(r.body)) and r.header("transfer-encoding") is None
        assert r.header("content-type") == "application/json; charset=utf-8"  # the upstream's
        assert r.header("connection") is None  # HTTP/1.1 keep-alive goes without saying
        c.send(chat("hdr", stream=True))
        r = c.response("POST")
        assert (r.status, r.framing) == (200, "chunked") and r.body == stream_bytes(3, 8)
        _relayed_headers(r)
        assert r.header("transfer-encoding") == "chunked" and r.header("content-length") is None
        assert r.header("content-type") == "text/event-stream" and r.header("connection") is None
        c.send(request("GET", "/healthz"))  # the proxy's own answers carry a Date too
        r = c.response()
        assert r.header("date") is not None and len(r.values("server")) <= 1
    assert [r.outcome for r in front.calls("hdr")] == [CallOutcome.OK] * 2


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_connection_close_from_the_client(front: Front, stream: bool) -> None:
    with RawClient(front.port) as c:
        c.send(post_json("/s/close/v1/chat/completions", {**CHAT, "stream": stream}, {"Connection": "close"}))
        r = c.response("POST")
        assert r.status == 200 and r.header("connection") == "close"
        if stream:
            assert r.framing == "chunked" and r.body == stream_bytes(3, 8)
        else:
            assert r.framing == "length" and r.json() == ANSWER
        assert c.closed()
    assert [(r.stream, r.outcome) for r in front.calls("close")] == [(stream, CallOutcome.OK)]


# -- 12: graceful stop ------------------------------------------------------------------------------------


def test_stop_lets_a_call_in_flight_finish(front: Front) -> None:
    got: list[RawResponse] = []
    c = RawClient(front.port, timeout=10)

    def call() -> None:
        c.send(chat("stop", x_hold=1.0))
        got.append(c.response("POST"))

    with c:
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        deadline = time.monotonic() + 5
        while front.fake.seen < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert front.fake.seen == 1  # in flight: the upstream holds it
        front.proxy.stop()
        caller.join(10)
        [r] = got
        ok_call(r)
        assert c.closed()
    with pytest.raises(ConnectionRefusedError):
        RawClient(front.port, timeout=2)
    assert [(r.outcome, r.status_code) for r in stored_calls(front.config.db, "stop")] == [
        (CallOutcome.OK, 200)
    ]


def test_sigterm_on_serve_lets_a_stream_in_flight_finish(tmp_path: Path) -> None:
    from factories import free_port, serve_process

    fake = FrontUpstream()
    up = upstream(fake)
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    port = free_port()
    args = ("--mode", "passthrough", "--spool", str(tmp_path / "serve.spool"))
    proc = serve_process(port, up.url + "/v1", db, *args, stderr=subprocess.PIPE)
    try:
        with RawClient(port, timeout=10) as c:
            c.send(chat("term", stream=True, x_chunks=20, x_delay=0.05))
            c.read_until(piece(0, 8).encode())
            proc.send_signal(signal.SIGTERM)
            r = c.response("POST")
            assert (r.status, r.framing) == (200, "chunked") and r.body == stream_bytes(20, 8)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        up.stop()
    assert "Traceback" not in err, err
    assert [(r.stream, r.outcome) for r in stored_calls(db, "term")] == [(True, CallOutcome.OK)]


# -- 13: many real clients at once ------------------------------------------------------------------------


def test_fifty_openai_clients_five_calls_each(front: Front) -> None:
    import openai

    async def client(k: int) -> list[str | None]:
        base = f"http://127.0.0.1:{front.port}/s/sdk-{k}/v1"
        async with openai.AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0, timeout=30) as sdk:
            out = []
            for _ in range(5):
                answer = await sdk.chat.completions.create(
                    model="front-model", messages=[{"role": "user", "content": "hi"}]
                )
                out.append(answer.choices[0].message.content)
            return out

    async def main() -> list[list[str | None]]:
        return await asyncio.gather(*(client(k) for k in range(50)))

    answers = asyncio.run(asyncio.wait_for(main(), 60))
    assert answers == [["hello from upstream"] * 5] * 50
    recs = front.calls()
    assert len(recs) == 250 and {r.outcome for r in recs} == {CallOutcome.OK}
    per_session: dict[str | None, int] = {}
    for r in recs:
        per_session[r.session_id] = per_session.get(r.session_id, 0) + 1
    assert per_session == {f"sdk-{k}": 5 for k in range(50)}
    assert {r.harness for r in recs} == {"openai-python"}


# -- 14, 15: odd paths, idle connections ------------------------------------------------------------------


# (the request target; the status; the path recorded; the path and query the upstream was sent)
ODD_PATHS = [
    ("/s/odd/v1/chat%2Fcompletions", 200, "/v1/chat/completions", "/v1/chat/completions"),
    ("/s/odd/v1/%63hat/completions", 200, "/v1/chat/completions", "/v1/chat/completions"),
    ("/s/o%64d/v1/chat/completions", 200, "/v1/chat/completions", "/v1/chat/completions"),
    ("/s/odd/v1//chat/completions", 404, "/v1//chat/completions", "/v1//chat/completions"),
    ("/s/odd/v1/chat/completions/", 404, "/v1/chat/completions/", "/v1/chat/completions/"),
    ("/s/odd/v1/./chat/completions", 200, "/v1/./chat/completions", "/v1/chat/completions"),
    ("/s/odd/v1/x/../chat/completions", 200, "/v1/x/../chat/completions", "/v1/chat/completions"),
    (
        "/s/odd/v1/chat/completions?a=1&b=%20",
        200,
        "/v1/chat/completions?a=1&b= ",
        "/v1/chat/completions?a=1&b=+",
    ),
    (
        "/s/odd/v1/chat/completions?q=%C3%A9&r=a+b&s",
        200,
        "/v1/chat/completions?q=\u00e9&r=a b&s",
        "/v1/chat/completions?q=%C3%A9&r=a+b&s",
    ),
    (  # reserved characters stay encoded
        "/s/odd/v1/chat/completions?q=a%2Bb&r=a%26b%3Dc",
        200,
        "/v1/chat/completions?q=a%2Bb&r=a%26b%3Dc",
        "/v1/chat/completions?q=a%2Bb&r=a%26b%3Dc",
    ),
    (  # a credential in the query is not recorded
        "/s/odd/v1/chat/completions?key=sk-secret&x=1",
        200,
        "/v1/chat/completions?key=REDACTED&x=1",
        "/v1/chat/completions?key=sk-secret&x=1",
    ),
    ("/s/odd/v1/chat/completions?", 200, "/v1/chat/completions", "/v1/chat/completions"),
    ("/s/odd/v1/chat/completions#frag", 200, "/v1/chat/completions", "/v1/chat/completions"),
    ("http://127.0.0.1/s/odd/v1/chat/completions", 200, "/v1/chat/completions", "/v1/chat/completions"),
]


def test_percent_encoded_and_odd_paths(front: Front) -> None:
    """Today: the path is matched decoded (``%2F`` is a slash); the recorded path keeps dot segments
    and a doubled slash as sent but its query decoded; the upstream gets the path with dot segments
    resolved and the query quoted again. A route the upstream lacks is its own 404, relayed."""
    with RawClient(front.port) as c:
        for target, status, _, _ in ODD_PATHS:
            c.send(post_json(target, CHAT))
            r = c.response("POST")
            if status == 200:
                ok_call(r)
            else:  # the upstream's (aiohttp's) 404, as it sent it
                assert (r.status, r.framing, r.body) == (404, "length", b"404: Not Found"), target
    recs = front.calls("odd")
    assert [(r.path, r.status_code) for r in recs] == [(path, status) for _, status, path, _ in ODD_PATHS]
    assert [r.outcome for r in recs] == [
        CallOutcome.OK if status == 200 else CallOutcome.UPSTREAM_ERROR for _, status, _, _ in ODD_PATHS
    ]
    assert front.fake.targets == [sent for _, _, _, sent in ODD_PATHS]


def test_idle_keep_alive_connection_stays_open(front: Front) -> None:
    with RawClient(front.port) as c:
        c.send(chat("idle"))
        ok_call(c.response("POST"))
        assert not c.closed(2.5)  # idle, and not closed by the server
        c.send(chat("idle"))
        ok_call(c.response("POST"))
    assert [r.outcome for r in front.calls("idle")] == [CallOutcome.OK] * 2


def test_websocket_upgrade_mid_connection_is_426_and_the_connection_goes_on(front: Front) -> None:
    upgrade = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    with RawClient(front.port) as c:
        c.send(chat("ws"))
        ok_call(c.response("POST"))
        c.send(request("GET", "/s/ws/v1/responses", None, upgrade))
        r = c.response()
        assert (r.version, r.status, r.framing) == ("HTTP/1.1", 426, "length")
        assert "WebSocket" in r.json()["error"]["message"] and r.header("upgrade") is None
        c.send(chat("ws"))
        ok_call(c.response("POST"))
    recs = front.calls("ws")
    assert [(r.method, r.status_code, r.outcome) for r in recs] == [
        ("POST", 200, CallOutcome.OK),
        ("GET", 426, CallOutcome.REJECTED),
        ("POST", 200, CallOutcome.OK),
    ]


@pytest.mark.parametrize("step", [0, 13], ids=["one-write", "13-byte-writes"])
def test_pipeline_of_requests_of_every_kind(front: Front, step: int) -> None:
    """In one write, or cut anywhere: calls, a HEAD, a gzip body, a chunked body, an HTTP/1.0 keep-alive request, a
    route of the proxy's own, a 413 and a 404, each answered in order and whole."""
    body = json.dumps({**CHAT, "n": 9}).encode()
    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    te = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    reqs: list[tuple[str, bytes, int]] = [
        ("POST", chat("all", n=1), 200),
        ("HEAD", request("HEAD", "/s/all/v1/models"), 200),
        ("POST", request("POST", "/s/all/v1/chat/completions", gzip.compress(body), gz), 200),
        ("GET", request("GET", "/metrics"), 200),
        ("POST", request("POST", "/s/all/v1/chat/completions", chunked(body[:9], body[9:]), te), 200),
        (
            "POST",
            post_json("/s/all/v1/chat/completions", CHAT, {"Connection": "keep-alive"}, version="HTTP/1.0"),
            200,
        ),
        ("POST", chat("all", pad="x" * (LIMIT + 1)), 413),
        ("GET", request("GET", "/s/all/nowhere"), 404),
        ("POST", chat("all", n=2), 200),
    ]
    with RawClient(front.port) as c:
        c.trickle(b"".join(data for _, data, _ in reqs), step or 1 << 20)
        answers = [c.response(method) for method, _, _ in reqs]
        assert [r.status for r in answers] == [status for _, _, status in reqs]
        for r in (answers[0], answers[2], answers[4], answers[8]):
            ok_call(r)
        assert answers[5].version == "HTTP/1.0" and answers[5].json() == ANSWER
        assert answers[1].body == b"" and b"# TYPE" in answers[3].body
        assert not c.closed(0.2)
    recs = front.calls("all")
    assert [(r.method, r.path, r.status_code, r.outcome) for r in recs] == [
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
        ("HEAD", "/v1/models", 200, CallOutcome.OK),
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
        ("POST", "/v1/chat/completions", 413, CallOutcome.REJECTED),
        ("POST", "/v1/chat/completions", 200, CallOutcome.OK),
    ]
    assert [r.request.get("n") for r in recs if r.request] == [1, 9, 9, None, 2]
