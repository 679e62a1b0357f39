"""The upstream client's read timeout over a relayed stream, one timer per period (issues 39, 40).

Against a real loopback server whose stream trickles, hangs, or waits while the reader is busy:
a stream whose chunks each come within the timeout is never cut however long it lasts; one
whose upstream falls silent for the timeout fails with aiohttp's own ``SocketTimeoutError``
about the timeout after its last chunk; time the relay spends handing a chunk on (not waiting
on the client) does not count as the upstream's silence; no timeout configured arms no timer.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from orchard_rec.proxy.upclient import UpstreamClient

pytestmark = [pytest.mark.network, pytest.mark.slow]  # timing by design: ~0.5-1.5 s a test

TIMEOUT = 0.3


async def _stream(request: web.Request) -> web.StreamResponse:
    gaps = [float(x) for x in request.query["gaps"].split(",")]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for gap in gaps:
        await asyncio.sleep(gap)
        await resp.write(b'data: {"x":1}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _serve(handler: Any) -> tuple[web.AppRunner, int]:
    """A loopback aiohttp server answering ``GET /`` with ``handler``; its runner and port."""
    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def _relay(gaps: str, busy_after: int = -1, busy_for: float = 0.0) -> tuple[list[float], str | None]:
    """Read the stream as the relay does; ``(arrivals, the exception's name or None)``."""
    runner, port = await _serve(_stream)
    arrivals: list[float] = []
    client = UpstreamClient(read_timeout=TIMEOUT)
    try:
        async with await client.request("GET", f"http://127.0.0.1:{port}/?gaps={gaps}") as up:
            try:
                async for _chunk in up.content.iter_any():
                    arrivals.append(time.monotonic())
                    if len(arrivals) == busy_after:
                        await asyncio.sleep(busy_for)  # a slow client
            except (TimeoutError, aiohttp.ClientError) as exc:
                arrivals.append(time.monotonic())
                return arrivals, type(exc).__name__
    finally:
        await client.close()
        await runner.cleanup()
    return arrivals, None


def test_a_stream_that_trickles_longer_than_the_timeout_is_not_cut() -> None:
    arrivals, err = asyncio.run(_relay(",".join(["0.1"] * 8)))  # 0.8 s in all, 0.1 s apart
    assert err is None and len(arrivals) >= 2


def test_an_upstream_silent_for_the_timeout_fails_the_stream_as_aiohttp_would() -> None:
    arrivals, err = asyncio.run(_relay("0,0.05,0.05,1.4"))
    assert err == "SocketTimeoutError"
    silent = arrivals[-1] - arrivals[-2]
    assert TIMEOUT * 0.9 <= silent < TIMEOUT + 0.9  # about the timeout after the last chunk


def test_time_spent_handing_a_chunk_on_is_not_the_upstreams_silence() -> None:
    # the reader is busy 2.5 timeouts on its second chunk; the upstream's chunks keep their pace
    arrivals, err = asyncio.run(_relay(",".join(["0.1"] * 6), busy_after=2, busy_for=TIMEOUT * 2.5))
    assert err is None and len(arrivals) >= 2


def test_no_timeout_configured_sets_no_timer() -> None:
    async def go() -> None:
        async def hello(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(b"x")
            return resp

        runner, port = await _serve(hello)
        try:
            client = UpstreamClient(read_timeout=None)
            async with await client.request("GET", f"http://127.0.0.1:{port}/") as up:
                assert up._timer is None
                assert await up.read() == b"x"
            await client.close()
        finally:
            await runner.cleanup()

    asyncio.run(go())


def test_answers_leave_no_reference_cycles() -> None:
    """An answer and its parser are freed when the last reference goes (each refers to the other
    until the answer ends): no call leaves garbage for the collector, which would stop the event
    loop for ~17 ms every few thousand calls (bench/PROFILE.md round 15)."""

    async def go() -> int:
        async def hello(request: web.Request) -> web.StreamResponse:
            if request.query.get("stream"):
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                for _ in range(5):
                    await resp.write(b'data: {"x":1}\n\n')
                return resp
            return web.Response(body=b"x" * 100)

        runner, port = await _serve(hello)
        client = UpstreamClient(read_timeout=5.0)
        try:
            for _ in range(3):  # warm: connections, caches
                async with await client.request("GET", f"http://127.0.0.1:{port}/") as up:
                    await up.read()
            gc.collect()
            gc.disable()
            try:
                for i in range(200):
                    query = "?stream=1" if i % 4 == 0 else ""
                    async with await client.request("GET", f"http://127.0.0.1:{port}/{query}") as up:
                        if query:
                            async for _chunk in up.content.iter_any():
                                pass
                        else:
                            await up.read()
                return gc.collect()
            finally:
                gc.enable()
        finally:
            await client.close()
            await runner.cleanup()

    unreachable = asyncio.run(go())
    assert unreachable < 100, unreachable  # 200 answers: ~15 objects each when they were cycles
