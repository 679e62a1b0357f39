"""The proxy's lean upstream HTTP/1.1 client (``orchard_rec.proxy.upclient``): its failures.

Each failure surfaces as aiohttp's own exception class, as the contract says (HELPERS.md,
session 16), so the proxy's error handling stays what it was with aiohttp's client: the read
timeout counts only the time the reader waits; a refused or silent connect, a close before the
head, a body cut or broken midway and an unparsable answer each have their class; an idempotent
request a reused connection drops is sent once more, a POST never; TLS verifies the upstream.
The upstreams are the test's own raw ``asyncio`` servers on loopback (``rawup.py``).
"""

from __future__ import annotations

import asyncio
import functools
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
import trustme

from orchard_rec.proxy.upclient import UpstreamClient

from .rawup import (
    Conn,
    RawUpstream,
    answer,
    chunked,
    collect,
    counts,
    free_port,
    get,
    redirect,
    run,
    serve_forever,
    upstream_and_client,
    within,
)

pytestmark = pytest.mark.network

upstream = functools.partial(upstream_and_client, UpstreamClient)
"""``upstream(handler, **client options)``: a raw upstream and a client to it (``async with``)."""


# -- read timeout ---------------------------------------------------------------------------------

TIMEOUT = 0.3


def test_no_head_within_the_read_timeout_is_a_socket_timeout() -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        await conn.wait_eof()  # silent

    async def main() -> None:
        async with upstream(handler, read_timeout=TIMEOUT) as (up, client):
            started = time.monotonic()
            with pytest.raises(aiohttp.SocketTimeoutError):
                await within(client.request("GET", up.url))
            assert TIMEOUT * 0.8 <= time.monotonic() - started < TIMEOUT + 0.6

    run(main)


@pytest.mark.parametrize("reader", ["read", "iter_any"])
def test_silence_mid_body_is_a_socket_timeout(reader: str) -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler, read_timeout=TIMEOUT) as (up, client):
            resp = await within(client.request("GET", up.url))
            started = time.monotonic()
            with pytest.raises(aiohttp.SocketTimeoutError):
                await within(resp.read() if reader == "read" else collect(resp))
            assert TIMEOUT * 0.8 <= time.monotonic() - started < TIMEOUT + 0.6
            resp.close()

    run(main)


async def _trickle(conn: Conn, gaps: list[float], end: bool = True) -> None:
    """A chunked stream: one chunk after each gap, then the end (or silence)."""
    await conn.request()
    conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i, gap in enumerate(gaps):
        await asyncio.sleep(gap)
        conn.send(chunked(b"chunk %d;" % i))
        await conn.drain()
    if end:
        conn.send(b"0\r\n\r\n")
    await conn.wait_eof()


def test_a_stream_that_trickles_longer_than_the_read_timeout_is_not_cut() -> None:
    async def main() -> None:
        async with upstream(lambda c: _trickle(c, [0.1] * 7), read_timeout=TIMEOUT) as (up, client):
            resp = await within(client.request("GET", up.url))
            body = b"".join(await within(collect(resp), 2.0))
            assert body == b"".join(b"chunk %d;" % i for i in range(7))

    run(main)


def test_time_the_reader_is_busy_does_not_count_toward_the_read_timeout() -> None:
    async def main() -> None:
        # the second chunk comes 0.5 s after the first; the reader is busy for 0.45 s of it
        async with upstream(lambda c: _trickle(c, [0, 0.5]), read_timeout=TIMEOUT) as (up, client):
            resp = await within(client.request("GET", up.url))
            chunks: list[bytes] = []
            async for chunk in resp.content.iter_any():
                if not chunks:
                    await asyncio.sleep(0.45)  # handing the chunk on to a slow client
                chunks.append(chunk)
            assert b"".join(chunks) == b"chunk 0;chunk 1;"

    run(main)


def test_silence_after_the_reader_was_busy_still_times_out_in_full() -> None:
    async def main() -> None:
        async with upstream(lambda c: _trickle(c, [0], end=False), read_timeout=TIMEOUT) as (up, client):
            resp = await within(client.request("GET", up.url))
            it = resp.content.iter_any().__aiter__()
            assert await within(it.__anext__()) == b"chunk 0;"
            await asyncio.sleep(0.4)  # busy
            waiting = time.monotonic()
            with pytest.raises(aiohttp.SocketTimeoutError):
                await within(it.__anext__())
            assert TIMEOUT * 0.8 <= time.monotonic() - waiting < TIMEOUT + 0.6
            resp.close()

    run(main)


# -- failures as aiohttp's classes ----------------------------------------------------------------

OTHER_FAILURES = (
    aiohttp.ClientConnectorError,
    aiohttp.ClientConnectorCertificateError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
    aiohttp.SocketTimeoutError,
)


def test_a_refused_connection_is_a_connector_error_worded_as_aiohttp() -> None:
    async def main() -> None:
        port = free_port()
        client = UpstreamClient(connect_timeout=1.0, read_timeout=1.0)
        try:
            with pytest.raises(aiohttp.ClientConnectorError) as caught:
                await within(client.request("GET", f"http://127.0.0.1:{port}/v1/models"))
        finally:
            await within(client.close())
        assert re.fullmatch(
            rf"Cannot connect to host 127\.0\.0\.1:{port} ssl:default \[.+\]", str(caught.value)
        )

    run(main)


def test_a_connect_that_gets_no_answer_is_a_connection_timeout() -> None:
    async def main() -> None:
        with socket.socket() as lsock:  # a listener whose accept queue is full: SYNs go unanswered
            lsock.bind(("127.0.0.1", 0))
            lsock.listen(0)
            port = lsock.getsockname()[1]
            fillers = [socket.socket() for _ in range(3)]
            for f in fillers:
                f.setblocking(False)
                f.connect_ex(("127.0.0.1", port))
            await asyncio.sleep(0.05)
            client = UpstreamClient(connect_timeout=0.2, read_timeout=1.0)
            try:
                started = time.monotonic()
                with pytest.raises(aiohttp.ConnectionTimeoutError):
                    await within(client.request("GET", f"http://127.0.0.1:{port}/"))
                assert time.monotonic() - started < 1.0
            finally:
                await within(client.close())
                for f in fillers:
                    f.close()

    run(main)


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("sent", [b"", b"HTTP/1.1 200 OK\r\nContent-Len"], ids=["nothing", "half-a-head"])
def test_a_close_before_the_whole_head_is_server_disconnected(method: str, sent: bytes) -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(sent)
        conn.close()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await within(client.request(method, up.url, data=b"x" if method == "POST" else None))

    run(main)


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
BROKEN_BODIES = {  # (the head and a first part, what follows a moment later, then close?)
    "short-length": (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n01234", b"56789", True),
    "cut-mid-chunk": (CHUNKED + b"5\r\nhello\r\n", b"a\r\nhello", True),
    "no-last-chunk": (CHUNKED + b"5\r\nhello\r\n", b"5\r\nworld\r\n", True),
    "bad-chunk-size": (CHUNKED + b"5\r\nhello\r\n", b"zz\r\nabc\r\n", False),
    "bad-chunk-end": (CHUNKED + b"5\r\nhello\r\n", b"3\r\nabcXY", False),
    "bad-gzip": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\n",
        b"not gzip!!",
        False,
    ),
}


@pytest.mark.parametrize("case", list(BROKEN_BODIES))
@pytest.mark.parametrize("reader", ["read", "iter_any"])
def test_a_body_closed_or_broken_midway_is_a_payload_error(case: str, reader: str) -> None:
    first, then, then_close = BROKEN_BODIES[case]

    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(first)
        await conn.drain()
        await asyncio.sleep(0.05)
        conn.send(then)
        await conn.drain()
        if then_close:
            conn.close()
        else:
            await conn.wait_eof()  # open and silent: the client must not wait for more

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp = await within(client.request("GET", up.url))
            with pytest.raises(aiohttp.ClientPayloadError):
                await within(resp.read() if reader == "read" else collect(resp), 0.9)
            resp.close()

    run(main)


@pytest.mark.parametrize(
    "wire",
    [
        b"FOO BAR BAZ\r\n\r\n",
        b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: twelve\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nNo colon here\r\nContent-Length: 0\r\n\r\n",
    ],
    ids=["not-http", "bad-status", "bad-length", "bad-header-line"],
)
def test_an_unparsable_answer_is_another_client_error(wire: bytes) -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(wire)
        await conn.wait_eof()  # the connection stays open: this is not a disconnect

    async def main() -> None:
        async with upstream(handler) as (up, client):
            with pytest.raises(aiohttp.ClientError) as caught:
                resp = await within(client.request("GET", up.url), 0.9)
                await within(resp.read(), 0.9)
            assert not isinstance(caught.value, OTHER_FAILURES), repr(caught.value)

    run(main)


# -- one retry on a reused connection ---------------------------------------------------------


def _drop_second(how: str, every: bool = False) -> Callable[[Conn], Awaitable[None]]:
    """Conn 0 answers its first request, then drops the second unanswered (every conn if ``every``)."""

    async def handler(conn: Conn) -> None:
        if conn.index == 0 or every:
            if conn.index == 0:
                await conn.request()
                conn.send(answer(body=b"first"))
            if await conn.request() is None:
                return
            conn.reset() if how == "reset" else conn.close()
            return
        await serve_forever(conn, answer(body=b"retried"))

    return handler


@pytest.mark.parametrize(
    ("method", "how"),
    [
        ("GET", "fin"),
        ("GET", "reset"),
        ("HEAD", "fin"),
        ("PUT", "fin"),
        ("DELETE", "fin"),
        ("OPTIONS", "fin"),
        ("TRACE", "fin"),
    ],
)
def test_an_idempotent_request_a_reused_connection_drops_is_sent_once_more(method: str, how: str) -> None:
    data = b"same body" if method == "PUT" else None

    async def main() -> None:
        async with upstream(_drop_second(how)) as (up, client):
            await get(client, up.url)
            resp, body = await get(client, up.url + "/again", method, data=data)
            assert resp.status == 200 and body == (b"" if method == "HEAD" else b"retried")
            assert len(up.conns) == 2 and counts(client)[:2] == (2, 1)
            first, retry = up.conns[0].requests[1], up.conns[1].requests[0]
            assert first.raw == retry.raw  # the same bytes, body and all
            assert (retry.method, retry.target, retry.body) == (method, "/again", data or b"")

    run(main)


def test_the_retry_happens_once() -> None:
    async def main() -> None:
        async with upstream(_drop_second("fin", every=True)) as (up, client):
            await get(client, up.url)
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await within(client.request("GET", up.url))
            assert len(up.conns) == 2

    run(main)


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_post_a_reused_connection_drops_is_not_sent_again(method: str) -> None:
    async def main() -> None:
        async with upstream(_drop_second("fin")) as (up, client):
            await get(client, up.url)
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await within(client.request(method, up.url, data=b'{"once": true}'))
            await asyncio.sleep(0.05)
            assert len(up.conns) == 1 and counts(client)[0] == 1

    run(main)


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _server_tls(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(ctx)
    return ctx


def test_tls_with_a_context_that_trusts_the_upstream(ca: trustme.CA) -> None:
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)

    async def main() -> None:
        async with RawUpstream(
            lambda c: serve_forever(c, answer(body=b"secret")), ssl_context=_server_tls(ca, "127.0.0.1")
        ) as up:
            client = UpstreamClient(connect_timeout=1.0, read_timeout=1.0, ssl_context=trusting)
            try:
                assert up.url.startswith("https://")
                assert (await get(client, up.url + "/a"))[1] == b"secret"
                assert (await get(client, up.url + "/b"))[1] == b"secret"
                assert len(up.conns) == 1 and counts(client) == (1, 1, 1)
                assert up.requests[0].values("host") == [f"127.0.0.1:{up.port}"]
                redirect(up.port, 443)
                assert (await get(client, "https://127.0.0.1/c"))[1] == b"secret"
                assert up.requests[-1].values("host") == ["127.0.0.1"]
            finally:
                await within(client.close())

    run(main)


@pytest.mark.parametrize("case", ["untrusted-ca", "wrong-name"])
def test_a_certificate_that_fails_verification_is_a_certificate_error(ca: trustme.CA, case: str) -> None:
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    names = ("127.0.0.1",) if case == "untrusted-ca" else ("other.test",)
    context = None if case == "untrusted-ca" else trusting

    async def main() -> None:
        async with RawUpstream(
            lambda c: serve_forever(c, answer()), ssl_context=_server_tls(ca, *names)
        ) as up:
            client = UpstreamClient(connect_timeout=1.0, read_timeout=1.0, ssl_context=context)
            try:
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await within(client.request("GET", up.url))
            finally:
                await within(client.close())
            assert up.requests == []

    run(main)
