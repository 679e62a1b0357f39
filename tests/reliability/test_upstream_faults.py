"""Upstream faults: the client gets the kind of failure the upstream gave (status, a dialect
error, or a cut stream), never a proxy traceback, and the call is recorded with its error.
Each test runs against the proxy in this process and against ``serve --workers 2`` (``served_factory``)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.records import CallOutcome

from .faulty import FaultyUpstream

pytestmark = [pytest.mark.slow, pytest.mark.network]  # timeouts, hangs and slow streams by design


@pytest.fixture
def faulty():  # type: ignore[no-untyped-def]
    fake = FaultyUpstream()
    srv = BackgroundServer(fake.app()).start()
    yield fake, srv.url + "/v1"
    srv.stop()


async def _call(
    url: str, model: str, stream: bool = True, timeout: float = 20
) -> tuple[int, bytes, list[float], str | None]:
    stamps: list[float] = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
        try:
            async with http.post(
                url, json={"model": model, "messages": [{"role": "user", "content": "x"}], "stream": stream}
            ) as r:
                data = b""
                async for chunk in r.content.iter_any():
                    stamps.append(time.monotonic() - t0)
                    data += chunk
                return r.status, data, stamps, None
        except aiohttp.ClientPayloadError as exc:
            return -1, b"", stamps, type(exc).__name__


def test_upstream_5xx_is_relayed_and_recorded(faulty, served_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = served_factory(faulty[1], sqlite_url, mode="passthrough")
    status, body, _, _ = asyncio.run(_call(f"{proxy.url}/s/f/v1/chat/completions", "fault-500", stream=False))
    assert status == 500 and b"engine crashed" in body
    proxy.flush()
    [rec] = proxy.store().calls("f")
    assert rec.outcome is CallOutcome.UPSTREAM_ERROR and rec.status_code == 500


@pytest.mark.parametrize("mode", ["passthrough", "token"])
def test_reset_mid_stream_cuts_the_clients_stream(faulty, served_factory, sqlite_url, mode) -> None:  # type: ignore[no-untyped-def]
    proxy = served_factory(faulty[1], sqlite_url, mode=mode)
    _status, body, _, err = asyncio.run(_call(f"{proxy.url}/s/r/v1/chat/completions", "fault-reset"))
    assert err == "ClientPayloadError" or not body.endswith(
        b"[DONE]\n\n"
    )  # a cut stream, as from the upstream
    proxy.flush()
    [rec] = proxy.store().calls("r")
    assert rec.outcome is CallOutcome.FAILED and "upstream stream broke" in (rec.error or "")
    assert len(rec.events or []) == 2  # what arrived before the reset is kept


@pytest.mark.parametrize("mode", ["passthrough", "token"])
def test_malformed_sse_is_relayed_without_crashing(faulty, served_factory, sqlite_url, mode) -> None:  # type: ignore[no-untyped-def]
    proxy = served_factory(faulty[1], sqlite_url, mode=mode)
    status, body, _, _ = asyncio.run(_call(f"{proxy.url}/s/m/v1/chat/completions", "fault-malformed"))
    assert status == 200 and body.endswith(b"data: [DONE]\n\n") and b"not json" in body
    proxy.flush()
    [rec] = proxy.store().calls("m")
    assert rec.outcome is CallOutcome.OK and rec.events[0][1] == "{not json at all"


def test_slow_stream_is_forwarded_chunk_by_chunk(faulty, served_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = served_factory(faulty[1], sqlite_url, mode="passthrough")
    status, body, stamps, _ = asyncio.run(_call(f"{proxy.url}/v1/chat/completions", "fault-slow"))
    assert status == 200 and body.count(b"tok") == 5
    assert stamps[0] < 0.15 and stamps[-1] > 0.8  # the first chunk came at once, not with the rest


def test_read_timeouts_before_and_during_the_stream(faulty, served_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    _fake, url = faulty
    proxy = served_factory(url, sqlite_url, mode="passthrough", read_timeout=0.5)
    status, body, _, _ = asyncio.run(_call(f"{proxy.url}/s/t/v1/chat/completions", "fault-hang"))
    assert status == 504 and b"timed out" in body and b'"error"' in body
    status, body, _, err = asyncio.run(_call(f"{proxy.url}/s/t/v1/chat/completions", "fault-hang-midstream"))
    assert err == "ClientPayloadError" or (body.count(b"tok") == 1 and not body.endswith(b"[DONE]\n\n"))
    proxy.flush()
    a, b = proxy.store().calls("t")
    assert a.outcome is CallOutcome.FAILED and a.status_code == 504
    assert b.outcome is CallOutcome.FAILED and "Timeout" in (b.error or "")


def test_client_gone_before_the_upstream_answers_cancels_it(faulty, served_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    fake, url = faulty
    proxy = served_factory(url, sqlite_url, mode="passthrough")

    async def leave_early() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await _call(f"{proxy.url}/s/g/v1/chat/completions", "fault-hang", timeout=0.3)

    asyncio.run(leave_early())
    proxy.flush()
    [rec] = proxy.store().calls("g")
    assert rec.outcome is CallOutcome.ABORTED and rec.first_byte_at is None
    deadline = time.time() + 5
    while fake.cancelled == 0 and time.time() < deadline:
        time.sleep(0.02)
    assert fake.cancelled == 1
