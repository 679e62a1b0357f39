"""The proxy's own server for its calls (``proxy.front``): which requests it takes, how it hands a
connection to aiohttp's server (at a request's first byte, or rebuilt when pipelined behind
another), its answers' framing, a body over the limit, and ``ORCHARD_FRONT=aiohttp``.

Raw sockets over loopback, so that nothing client-side frames or fixes what is sent."""

from __future__ import annotations

import json
import socket
import time

import pytest

from orchard_rec.records import CallOutcome

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _post(path: str, body: bytes = CHAT, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def _get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


class Reader:
    """Answers read off one socket, framed by Content-Length or chunked encoding."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("closed")
        self.buf += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        status = int(self._line().split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while line := self._line():
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._line(), 16):
                body += self._take(size)
                self._line()
            self._line()
        else:
            body = self._take(int(headers.get("content-length", "0")))
        return status, headers, body

    def closed(self) -> bool:
        try:
            self._more()
        except (EOFError, ConnectionResetError):
            return True
        return False


def _connect(proxy) -> tuple[socket.socket, Reader]:  # type: ignore[no-untyped-def]
    s = socket.create_connection(("127.0.0.1", proxy.server.port), timeout=10)
    return s, Reader(s)


def _front(proxy) -> dict:  # type: ignore[no-untyped-def,type-arg]
    s, r = _connect(proxy)
    with s:
        s.sendall(_get("/healthz", "Connection: close\r\n"))
        status, _, body = r.answer()
    assert status == 200
    return dict(json.loads(body)["front"])


def test_calls_are_taken_by_the_front_and_recorded(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url)
    s, r = _connect(proxy)
    with s:
        for i in range(3):  # one keep-alive connection, three calls
            s.sendall(_post(f"/s/front-{i}/v1/chat/completions"))
            status, headers, body = r.answer()
            assert status == 200 and json.loads(body)["choices"]
            assert headers["content-length"] == str(len(body))
            assert "date" in headers and "server" in headers
            assert headers["content-type"].startswith("application/json")
        s.sendall(_post("/v1/chat/completions", json.dumps({**json.loads(CHAT), "stream": True}).encode()))
        status, headers, body = r.answer()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        assert body.endswith(b"data: [DONE]\n\n")
    front = _front(proxy)
    assert front["server"] == "lean" and front["calls"] == 4
    proxy.flush()
    assert proxy.store().count_calls() == 4


def test_a_connection_goes_to_aiohttp_at_its_first_request_the_front_does_not_take(
    upstream, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url)
    s, r = _connect(proxy)
    with s:
        s.sendall(_post("/v1/chat/completions"))
        assert r.answer()[0] == 200
        s.sendall(_get("/healthz"))  # aiohttp's from here on, on the same connection
        status, _, body = r.answer()
        assert status == 200 and json.loads(body)["status"] in ("ok", "degraded")
        s.sendall(_post("/v1/chat/completions"))  # still answered (by aiohttp's server now)
        assert r.answer()[0] == 200
        s.sendall(_get("/nowhere"))
        status, _, body = r.answer()
        assert status == 404 and b"error" in body
    front = _front(proxy)
    assert front["calls"] == 1 and front["handed_over"] >= 1
    proxy.flush()
    assert proxy.store().count_calls() == 2


def test_pipelined_requests_are_answered_in_order(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """A request for aiohttp pipelined in the same read behind a call: its start is not known,
    so it is handed over rebuilt (a chunked body re-framed), after the call's answer."""
    proxy = proxy_factory(upstream.url, sqlite_url)
    outcome = b'{"reward": 1.0, "create": true}'
    chunked = (
        b"POST /sessions/piped/outcome HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%b\r\n0\r\n\r\n" % (len(outcome), outcome)
    )
    s, r = _connect(proxy)
    with s:
        s.sendall(
            _post("/s/piped/v1/chat/completions") + chunked + _get("/healthz") + _post("/v1/chat/completions")
        )
        status, _, body = r.answer()
        assert status == 200 and json.loads(body)["choices"]
        status, _, body = r.answer()
        assert status == 200 and json.loads(body)["outcome"]["reward"] == 1.0
        assert r.answer()[0] == 200
        assert r.answer()[0] == 200
    proxy.flush()
    assert proxy.store().count_calls() == 2


def test_two_calls_pipelined_in_one_read(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url)
    s, r = _connect(proxy)
    with s:
        s.sendall(_post("/s/p1/v1/chat/completions") + _post("/s/p2/v1/chat/completions"))
        assert [r.answer()[0] for _ in range(2)] == [200, 200]
    assert _front(proxy)["calls"] == 2


def test_malformed_requests_get_a_400_and_the_proxy_serves_on(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url)
    for bad in (b"GARBAGE\r\n\r\n", b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n"):
        s, r = _connect(proxy)
        with s:
            s.sendall(bad)
            assert r.answer()[0] == 400
    big = "X-Big: " + "a" * 9000 + "\r\n"  # over aiohttp's 8190 bytes a field: its 400, on a call route too
    for bad in (_post("/v1/chat/completions", extra=big), _post("/v1/chat/completions?" + "q" * 9000)):
        s, r = _connect(proxy)
        with s:
            s.sendall(bad)
            assert r.answer()[0] == 400
    for behind in (b"NOT HTTP AT ALL\r\n\r\n", _post("/v1/chat/completions", extra=big)):
        s, r = _connect(proxy)  # a bad request pipelined behind a call: answered 400 after the call
        with s:
            s.sendall(_post("/v1/chat/completions") + behind)
            assert r.answer()[0] == 200
            assert r.answer()[0] == 400
            assert r.closed()
    s, r = _connect(proxy)
    with s:
        s.sendall(_post("/v1/chat/completions"))
        assert r.answer()[0] == 200


def test_a_body_over_the_limit_is_refused_in_the_dialect_and_the_rest_dropped(
    upstream, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, max_body_bytes=64 * 1024)
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 300_000}]}).encode()
    s, r = _connect(proxy)
    with s:
        s.sendall(_post("/v1/messages", big))  # the whole body is sent before anything is read
        status, _, body = r.answer()
        assert status == 413 and json.loads(body)["type"] == "error"  # Anthropic's shape
        s.sendall(_post("/v1/chat/completions"))  # the rest was read and dropped: the connection goes on
        assert r.answer()[0] == 200
    proxy.flush()
    assert sorted(rec.outcome for rec in proxy.store().calls()) == sorted(
        [CallOutcome.REJECTED, CallOutcome.OK]
    )


def test_a_slow_body_and_a_head_in_pieces(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url)
    data = _post("/v1/chat/completions")
    s, r = _connect(proxy)
    with s:
        for i in range(0, len(data), 7):
            s.sendall(data[i : i + 7])
            time.sleep(0.001)
        assert r.answer()[0] == 200


def test_orchard_front_aiohttp_serves_every_request_on_aiohttp(
    upstream, proxy_factory, sqlite_url, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ORCHARD_FRONT", "aiohttp")
    proxy = proxy_factory(upstream.url, sqlite_url)
    s, r = _connect(proxy)
    with s:
        s.sendall(_post("/v1/chat/completions"))
        assert r.answer()[0] == 200
    assert _front(proxy) == {"server": "aiohttp"}
    proxy.flush()
    assert proxy.store().count_calls() == 1


@pytest.mark.parametrize(
    "path", ["/v1/chat%2Fcompletions", "/v1/../v1/chat/completions", "/v1//chat/completions"]
)
def test_paths_aiohttp_would_decode_or_normalise_are_its_own(
    upstream, proxy_factory, sqlite_url, path
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url)
    s, r = _connect(proxy)
    with s:
        s.sendall(_post(path, extra="Connection: close\r\n"))
        assert r.answer()[0] < 500
    assert _front(proxy)["calls"] == 0
