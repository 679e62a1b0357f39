"""The proxy's lean upstream HTTP/1.1 client (``orchard_rec.proxy.upclient``) against its contract:
bodies, streaming, the pool, and the request on the wire (failures: ``test_upclient_failures.py``).

Every upstream here is the test's own: a raw ``asyncio`` server on loopback (``rawup.py``) that
writes exact bytes, so framing, pauses and closes are chosen per test. Checked is only the contract
the proxy relies on (HELPERS.md, session 16): bodies by Content-Length, chunked or until close,
decoded from gzip/deflate, streamed as they arrive with bounded buffering; keep-alive pooling and
its counters; and the request's bytes as the upstream receives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import hashlib
import os
import zlib
from typing import Any

import pytest
import yarl
from multidict import CIMultiDictProxy

from orchard_rec.proxy.upclient import UpstreamClient

from .rawup import (
    Conn,
    RawUpstream,
    answer,
    chunked,
    collect,
    counts,
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


# -- bodies -------------------------------------------------------------------------------------


def test_a_content_length_body_and_the_status_line() -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(b"HTTP/1.1 201 Very Fine\r\nContent-Length: 11\r\n\r\nhello world")
        await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp, body = await get(client, up.url + "/x")
            assert (resp.status, resp.reason, body) == (201, "Very Fine", b"hello world")

    run(main)


def test_request_returns_once_the_head_is_in_before_the_body() -> None:
    returned = asyncio.Event()

    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
        await conn.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(returned.wait(), 1.0)  # without it the test fails below
        conn.send(b"body")
        await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp = await within(client.request("GET", up.url), 0.9)
            assert resp.status == 200 and not returned.is_set()
            returned.set()
            assert await within(resp.read()) == b"body"
            resp.release()

    run(main)


def test_a_chunked_body_with_extensions_and_trailers_then_the_connection_is_reused() -> None:
    body = b'5;name=value\r\nhello\r\n1\r\n \r\n5;a;b="q"\r\nworld\r\n0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n'

    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
        await serve_forever(conn, answer(body=b"second"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url))[1] == b"hello world"
            assert (await get(client, up.url))[1] == b"second"  # the trailers were consumed
            assert len(up.conns) == 1 and counts(client) == (1, 1, 1)

    run(main)


def test_head_and_body_written_one_byte_at_a_time() -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked(b"abc", b"defg")
        + b"0\r\n\r\n"
    )

    async def handler(conn: Conn) -> None:
        await conn.request()
        for i in range(len(wire)):
            conn.send(wire[i : i + 1])
            await conn.drain()
            await asyncio.sleep(0.002)
        await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp, body = await get(client, up.url)
            assert (resp.status, resp.headers["X-A"], body) == (200, "1", b"abcdefg")

    run(main)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",  # no length at all
    ],
    ids=["connection-close", "http-1.0", "no-length"],
)
def test_a_body_without_length_runs_until_the_server_closes(head: bytes) -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(head + b"part one, ")
        await conn.drain()
        await asyncio.sleep(0.05)
        conn.send(b"part two")
        conn.close()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url))[1] == b"part one, part two"
            assert (await get(client, up.url))[1] == b"part one, part two"
            assert len(up.conns) == 2 and counts(client) == (2, 0, 0)

    run(main)


@pytest.mark.parametrize(
    ("method", "head"),
    [
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"),
        ("HEAD", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
        ("GET", b"HTTP/1.1 204 No Content\r\n\r\n"),
        ("GET", b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'),
        ("GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 1000\r\n\r\n"),  # the entity's length
    ],
    ids=["head-length", "head-chunked", "204", "304", "304-length"],
)
def test_head_204_and_304_have_no_body_and_keep_the_connection(method: str, head: bytes) -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(head)
        await serve_forever(conn, answer(body=b"next"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url, method))[1] == b""
            assert (await get(client, up.url))[1] == b"next"
            assert len(up.conns) == 1 and counts(client) == (1, 1, 1)

    run(main)


def test_1xx_answers_are_skipped() -> None:
    wire = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )

    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(wire)
        await serve_forever(conn, answer(body=b"next"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp, body = await get(client, up.url, "POST", data=b"x")
            assert (resp.status, body) == (200, b"ok") and "Link" not in resp.headers
            assert (await get(client, up.url))[1] == b"next"

    run(main)


def test_repeated_headers_are_kept_in_order_and_looked_up_case_insensitively() -> None:
    wire = (
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-Mixed: one\r\nset-cookie: b=2\r\n"
        b"X-MIXED: two\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n"
    )

    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(wire)
        await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp, _ = await get(client, up.url)
            assert isinstance(resp.headers, CIMultiDictProxy)
            assert [(k.lower(), v) for k, v in resp.headers.items()] == [
                ("set-cookie", "a=1"),
                ("x-mixed", "one"),
                ("set-cookie", "b=2"),
                ("x-mixed", "two"),
                ("content-type", "text/plain"),
                ("content-length", "0"),
            ]
            assert resp.headers.getall("SET-COOKIE") == ["a=1", "b=2"]
            assert resp.headers["x-mixed"] == "one" and resp.headers.get("Content-type") == "text/plain"

    run(main)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"Content-Type: Application/JSON; charset=UTF-8\r\n", "application/json"),
        (b"Content-Type: text/event-stream\r\n", "text/event-stream"),
        (b"content-type: text/html;charset=utf-8\r\n", "text/html"),
        (b"", "application/octet-stream"),
    ],
)
def test_content_type_is_the_media_type_lower_cased(header: bytes, expected: str) -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(b"HTTP/1.1 200 OK\r\n" + header + b"Content-Length: 0\r\n\r\n")
        await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url))[0].content_type == expected

    run(main)


PLAIN = b"".join(b'{"i": %d, "text": "the quick brown fox"}\n' % i for i in range(6000)) + os.urandom(2000)


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("reader", ["read", "iter_any"])
def test_gzip_and_deflate_bodies_are_decoded(encoding: str, framing: str, reader: str) -> None:
    packed = gzip.compress(PLAIN) if encoding == "gzip" else _deflate(PLAIN)
    if framing == "length":
        wire = answer(body=packed, headers=(f"Content-Encoding: {encoding}",))
    else:
        thirds = [packed[: len(packed) // 3], packed[len(packed) // 3 : -7], packed[-7:]]
        head = f"HTTP/1.1 200 OK\r\nContent-Encoding: {encoding}\r\nTransfer-Encoding: chunked\r\n\r\n"
        wire = head.encode() + chunked(*thirds) + b"0\r\n\r\n"

    async def handler(conn: Conn) -> None:
        await serve_forever(conn, wire)

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp = await within(client.request("GET", up.url))
            body = await within(resp.read()) if reader == "read" else b"".join(await within(collect(resp)))
            resp.release()
            assert body == PLAIN
            assert (await get(client, up.url))[1] == PLAIN  # and the connection stayed in step
            assert counts(client) == (1, 1, 1)

    run(main)


@pytest.mark.parametrize("encoding", ["x-custom", "identity"])
def test_other_encodings_are_passed_as_sent(encoding: str) -> None:
    packed = gzip.compress(b"not for us to decode")

    async def handler(conn: Conn) -> None:
        await serve_forever(conn, answer(body=packed, headers=(f"Content-Encoding: {encoding}",)))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url))[1] == packed

    run(main)


def test_zstd_is_decoded_or_passed_as_sent_never_mangled() -> None:
    zstandard = pytest.importorskip("zstandard")
    packed = zstandard.ZstdCompressor().compress(PLAIN)

    async def handler(conn: Conn) -> None:
        await serve_forever(conn, answer(body=packed, headers=("Content-Encoding: zstd",)))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url))[1] in (PLAIN, packed)

    run(main)


# -- streaming and back pressure --------------------------------------------------------------


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_iter_any_yields_a_chunk_before_the_next_is_sent(encoding: str | None) -> None:
    got_first = asyncio.Event()
    parts = [b"data: first\n\n", b"data: second\n\n"]
    packer = zlib.compressobj(wbits=31) if encoding == "gzip" else None

    def pack(data: bytes, last: bool = False) -> bytes:
        if packer is None:
            return data
        return packer.compress(data) + packer.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)

    async def handler(conn: Conn) -> None:
        await conn.request()
        ce = f"Content-Encoding: {encoding}\r\n" if encoding else ""
        conn.send(f"HTTP/1.1 200 OK\r\n{ce}Transfer-Encoding: chunked\r\n\r\n".encode())
        conn.send(chunked(pack(parts[0])))
        await conn.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(got_first.wait(), 1.0)  # without it the test fails below
        conn.send(chunked(pack(parts[1], last=True)) + b"0\r\n\r\n")
        await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp = await within(client.request("GET", up.url))
            chunks: list[bytes] = []
            async for chunk in resp.content.iter_any():
                chunks.append(chunk)
                if b"".join(chunks) == parts[0]:
                    assert not got_first.is_set()
                    got_first.set()
            resp.release()
            assert got_first.is_set() and b"".join(chunks) == b"".join(parts)

    run(main)


def test_a_body_nobody_reads_stops_being_read_from_the_socket_then_resumes() -> None:
    """Unbounded reading would take all 12 MiB in well under 0.4 s; the kernel's buffers on both
    sides (the server's send buffer pinned at 64 KiB) hold about 1 MiB, the client's own 64 KiB more."""
    size, piece = 12 * 1024 * 1024, 64 * 1024
    payload = os.urandom(piece) * (size // piece)
    sent = [0]

    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        for i in range(0, size, piece):
            conn.send(payload[i : i + piece])
            await conn.drain()
            sent[0] = i + piece
        await conn.wait_eof()

    async def main() -> None:
        async with RawUpstream(handler, sndbuf=piece) as up:
            client = UpstreamClient(connect_timeout=1.0, read_timeout=1.0)
            try:
                resp = await within(client.request("GET", up.url))
                await asyncio.sleep(0.4)
                assert 64 * 1024 < sent[0] < 4 * 1024 * 1024, f"{sent[0]} bytes drained while nobody read"
                assert await within(resp.read()) == payload
                resp.release()
                assert sent[0] == size
            finally:
                await within(client.close())

    run(main)


# -- keep-alive and the pool ------------------------------------------------------------------


def test_three_sequential_requests_share_one_connection() -> None:
    async def handler(conn: Conn) -> None:
        await serve_forever(conn, answer(body=b"ok"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert counts(client) == (0, 0, 0)
            assert (await get(client, up.url))[1] == b"ok"
            assert counts(client) == (1, 0, 1)
            for _ in range(2):
                assert (await get(client, up.url))[1] == b"ok"
            assert len(up.conns) == 1 and len(up.requests) == 3
            assert counts(client) == (1, 2, 1)

    run(main)


def test_concurrent_requests_open_connections_and_all_return_to_the_pool() -> None:
    both = asyncio.Event()
    seen: list[Conn] = []

    async def handler(conn: Conn) -> None:
        seen.append(conn)
        await conn.request()
        if len(seen) == 2:
            both.set()
        await within(both.wait())  # each answers only once both requests are in
        conn.send(answer(body=b"ok"))
        await serve_forever(conn, answer(body=b"again"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            results = await within(asyncio.gather(get(client, up.url), get(client, up.url)))
            assert [body for _, body in results] == [b"ok", b"ok"]
            assert counts(client) == (2, 0, 2)
            assert (await get(client, up.url))[1] == b"again"
            assert counts(client) == (2, 1, 2)

    run(main)


def test_every_request_either_opens_a_connection_or_reuses_one() -> None:
    async def handler(conn: Conn) -> None:
        while (req := await conn.request()) is not None:
            await asyncio.sleep(0.01)
            conn.send(answer(body=req.target.encode()))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            for batch in range(2):
                paths = [f"/{batch}/{i}" for i in range(32)]
                results = await within(asyncio.gather(*(get(client, up.url + p) for p in paths)), 3.0)
                assert [body for _, body in results] == [p.encode() for p in paths]
            opened, reused, idle = counts(client)
            assert opened + reused == 64 and opened == len(up.conns) and 0 < idle <= opened
            assert sum(len(c.requests) for c in up.conns) == 64

    run(main)


def test_a_request_cancelled_before_its_answer_leaves_no_answer_to_the_next() -> None:
    async def handler(conn: Conn) -> None:
        while (req := await conn.request()) is not None:
            if req.target == "/slow":
                await asyncio.sleep(0.2)  # answered after the caller gave up
            conn.send(answer(body=req.target.encode()))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            await get(client, up.url + "/warm")  # a pooled connection for /slow to take
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.request("GET", up.url + "/slow"), 0.05)
            await asyncio.sleep(0.3)  # the late answer is on the wire now
            for path in ("/next", "/after"):
                assert (await get(client, up.url + path))[1] == path.encode()

    run(main)


@pytest.mark.parametrize(
    ("wire", "request_headers"),
    [
        (answer(body=b"bye", headers=("Connection: close",)), None),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nbye", None),
        (answer(body=b"bye"), {"Connection": "close"}),
    ],
    ids=["server-says-close", "server-http-1.0", "caller-says-close"],
)
def test_a_connection_either_side_wants_closed_is_not_reused(
    wire: bytes, request_headers: dict[str, str] | None
) -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(wire)
        await conn.wait_eof()  # the server keeps its side open: the client must close

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url, headers=request_headers))[1] == b"bye"
            assert counts(client)[2] == 0
            await within(up.conns[0].eof.wait())
            assert (await get(client, up.url, headers=request_headers))[1] == b"bye"
            assert len(up.conns) == 2 and counts(client) == (2, 0, 0)

    run(main)


def test_a_release_before_the_body_ends_closes_the_connection() -> None:
    async def handler(conn: Conn) -> None:
        if await conn.request() is None:
            return
        if conn.index == 0:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + b"x" * 1000)
            await conn.wait_eof()
        else:
            conn.send(answer(body=b"fresh"))
            await serve_forever(conn, answer(body=b"fresh"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            resp = await within(client.request("GET", up.url))
            async for chunk in resp.content.iter_any():
                assert chunk
                break
            resp.release()
            assert counts(client)[2] == 0
            await within(up.conns[0].eof.wait())
            assert (await get(client, up.url))[1] == b"fresh"
            assert len(up.conns) == 2 and counts(client) == (2, 0, 1)

    run(main)


def test_async_with_releases_to_the_pool_and_close_closes() -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(answer(body=b"ok"))
        if await conn.request() is not None:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234")  # the rest never comes
            await conn.wait_eof()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            async with await within(client.request("GET", up.url)) as resp:
                assert await within(resp.read()) == b"ok"
            assert counts(client) == (1, 0, 1)
            resp = await within(client.request("GET", up.url))
            resp.close()
            assert counts(client) == (1, 1, 0)
            await within(up.conns[0].eof.wait())
            assert len(up.conns) == 1

    run(main)


def test_a_pooled_connection_the_server_closed_is_not_written_to() -> None:
    async def handler(conn: Conn) -> None:
        await conn.request()
        conn.send(answer(body=b"ok"))
        if conn.index == 0:
            conn.half_close()  # FIN without Connection: close, then see what still arrives
            await conn.wait_eof()
        else:
            await serve_forever(conn, answer(body=b"ok"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url))[1] == b"ok"
            await asyncio.sleep(0.1)  # the FIN is in
            assert (await get(client, up.url, "POST", data=b"once"))[1] == b"ok"
            assert counts(client)[:2] == (2, 0)
            await within(client.close())
            await within(up.conns[0].eof.wait())
            assert up.conns[0].leftover == b"" and len(up.conns[0].requests) == 1
            assert [r.body for r in up.conns[1].requests] == [b"once"]

    run(main)


def test_close_closes_idle_connections() -> None:
    async def handler(conn: Conn) -> None:
        await serve_forever(conn, answer(body=b"ok"))

    async def main() -> None:
        async with upstream(handler) as (up, client):
            await get(client, up.url)
            assert counts(client)[2] == 1
            await within(client.close())
            await within(up.conns[0].eof.wait(), 1.0)
            assert counts(client)[2] == 0

    run(main)


def test_a_connection_idle_longer_than_keepalive_is_not_reused() -> None:
    """Whether it is closed on a timer or when next looked at is the client's choice; it is not
    reused after ``keepalive`` s, it is reused before, and it is closed by the next request."""

    async def handler(conn: Conn) -> None:
        await serve_forever(conn, answer(body=b"ok"))

    async def main() -> None:
        async with upstream(handler, keepalive=0.3) as (up, client):
            await get(client, up.url)
            await asyncio.sleep(0.05)
            await get(client, up.url)
            assert counts(client)[:2] == (1, 1)  # idle for less than keepalive: reused
            await asyncio.sleep(0.5)
            await get(client, up.url)
            assert len(up.conns) == 2 and counts(client)[:2] == (2, 1)
            await within(up.conns[0].eof.wait(), 1.0)

    run(main)


def test_an_idle_connection_is_closed_after_keepalive_without_another_request() -> None:
    """As aiohttp's pool does: nothing left open for a server that never closes its side."""

    async def handler(conn: Conn) -> None:
        await serve_forever(conn, answer(body=b"ok"))

    async def main() -> None:
        async with upstream(handler, keepalive=0.2) as (up, client):
            await get(client, up.url)
            assert counts(client)[2] == 1
            await within(up.conns[0].eof.wait(), 1.0)  # closed by the client, no request since
            assert counts(client)[2] == 0

    run(main)


# -- the request on the wire ------------------------------------------------------------------


async def _sent(method: str, path: str = "/", **kw: Any) -> tuple[RawUpstream, Any]:
    """Send one request to a fresh upstream; ``(upstream, the request as it arrived)``."""
    async with upstream(lambda c: serve_forever(c, answer(body=b"ok"))) as (up, client):
        await get(client, up.url + path, method, **kw)
    return up, up.requests[0]


def test_a_get_carries_host_first_the_callers_headers_and_accept() -> None:
    async def main() -> None:
        headers = {"Authorization": "Bearer sk-test", "X-Trace": "a, b", "User-Agent": "harness/1.0"}
        up, req = await _sent("GET", "/v1/models?limit=2", headers=headers)
        assert req.line == "GET /v1/models?limit=2 HTTP/1.1"
        assert req.headers[0][0].lower() == "host" and req.headers[0][1] == f"127.0.0.1:{up.port}"
        assert req.values("host") == [f"127.0.0.1:{up.port}"]
        callers = [(k.lower(), v) for k, v in req.headers if k.lower() in {h.lower() for h in headers}]
        assert callers == [(k.lower(), v) for k, v in headers.items()]
        assert req.values("accept") == ["*/*"]
        assert req.values("content-length") == [] and req.values("content-type") == [] and req.body == b""

    run(main)


def test_the_callers_accept_and_content_type_are_not_doubled() -> None:
    async def main() -> None:
        headers = {"accept": "text/event-stream", "content-type": "application/json"}
        _, req = await _sent("POST", headers=headers, data=b'{"a": 1}')
        assert req.values("Accept") == ["text/event-stream"]
        assert req.values("Content-Type") == ["application/json"]
        assert req.values("Content-Length") == ["8"] and req.body == b'{"a": 1}'

    run(main)


def test_a_body_without_content_type_is_sent_as_octet_stream() -> None:
    async def main() -> None:
        _, req = await _sent("POST", data=b"\x00\x01raw")
        assert req.values("content-type") == ["application/octet-stream"]
        assert req.values("content-length") == ["5"] and req.body == b"\x00\x01raw"

    run(main)


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_a_post_put_or_patch_without_data_says_content_length_0(method: str) -> None:
    async def main() -> None:
        _, req = await _sent(method)
        assert req.method == method and req.values("content-length") == ["0"] and req.body == b""

    run(main)


def test_head_without_data_has_no_content_length() -> None:
    async def main() -> None:
        _, req = await _sent("HEAD")
        assert req.method == "HEAD" and req.values("content-length") == []

    run(main)


@pytest.mark.parametrize("url", ["http://127.0.0.1/p", "http://127.0.0.1:80/p"])
def test_host_has_no_port_when_it_is_the_schemes_default(url: str) -> None:
    async def main() -> None:
        async with upstream(lambda c: serve_forever(c, answer(body=b"ok"))) as (up, client):
            redirect(up.port, 80)
            assert (await get(client, url))[1] == b"ok"
            req = up.requests[0]
            assert req.headers[0][0].lower() == "host" and req.values("host") == ["127.0.0.1"]

    run(main)


@pytest.mark.parametrize(
    "path",
    [
        "/a b/c d",
        "/v1/modèles/ü?q=ä ö&x=1",
        "/kept%20as%2Fis?x=%41%20",
        "/p?q=1#fragment",
        "",
        "/search?q=a+b&empty=&flag",
    ],
)
def test_the_path_and_query_are_quoted_as_yarl_quotes_them(path: str) -> None:
    async def main() -> None:
        up, req = await _sent("GET", path)
        assert req.target == yarl.URL(up.url + path).raw_path_qs

    run(main)


# -- size and TLS -------------------------------------------------------------------------------

BIG = os.urandom(4 * 1024 * 1024)


def test_4_mib_each_way() -> None:
    async def handler(conn: Conn) -> None:
        while (req := await conn.request()) is not None:
            if req.method == "POST":
                conn.send(answer(body=hashlib.sha256(req.body).hexdigest().encode()))
            elif req.target == "/chunked":
                pieces = [BIG[i : i + 100_000] for i in range(0, len(BIG), 100_000)]
                conn.send(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(*pieces) + b"0\r\n\r\n"
                )
            else:
                conn.send(answer(body=BIG))
            await conn.drain()

    async def main() -> None:
        async with upstream(handler) as (up, client):
            assert (await get(client, up.url, "POST", data=BIG))[1] == hashlib.sha256(
                BIG
            ).hexdigest().encode()
            assert up.requests[0].values("content-length") == [str(len(BIG))]
            assert (await get(client, up.url + "/length"))[1] == BIG
            resp = await within(client.request("GET", up.url + "/chunked"))
            assert b"".join(await within(collect(resp))) == BIG
            resp.release()
            assert len(up.conns) == 1 and counts(client) == (1, 2, 1)

    run(main)
