"""Load: 500 concurrent streaming sessions with bounded memory; explicit back-pressure."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest
from factories import free_port, metric_sum, serve_process

from orchard_rec.storage import Store

pytestmark = [pytest.mark.slow, pytest.mark.network]  # 500 concurrent streaming sessions

SESSIONS = 500
SECONDS = float(os.environ.get("ORCHARD_LOAD_SECONDS", "60"))


def _rss_peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_500_concurrent_streaming_sessions_bounded_memory(upstream_factory, tmp_path, workers) -> None:  # type: ignore[no-untyped-def]
    """With ``--workers 2`` (a third of the time: the suite's) each worker's memory is bounded."""
    up = upstream_factory(chunk_delay=0.002)
    db = f"sqlite:///{tmp_path / 'load.db'}"
    port = free_port()
    proc = serve_process(port, up.url, db, "--mode", "token", "--workers", str(workers))
    pids = (
        [proc.pid]
        if workers == 1
        else [int(x) for x in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    )
    seconds = SECONDS if workers == 1 else SECONDS / 3
    base = f"http://127.0.0.1:{port}"
    try:
        sent = ok = 0
        rss: list[float] = []

        async def session(i: int, http: aiohttp.ClientSession, stop: float) -> None:
            nonlocal sent, ok
            turn = 0
            while time.monotonic() < stop:
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"session {i} turn {turn}"}],
                    "stream": True,
                }
                sent += 1
                async with http.post(f"{base}/s/load-{i}/v1/chat/completions", json=body) as r:
                    data = await r.read()
                    ok += r.status == 200 and data.endswith(b"data: [DONE]\n\n")
                turn += 1

        async def sampler(stop: float) -> None:
            while time.monotonic() < stop:
                rss.append(max(_rss_peak_mb(p) for p in pids))
                await asyncio.sleep(1.0)

        async def main() -> None:
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(
                connector=conn, timeout=aiohttp.ClientTimeout(total=120)
            ) as http:
                stop = time.monotonic() + seconds
                await asyncio.gather(sampler(stop), *(session(i, http, stop) for i in range(SESSIONS)))

        asyncio.run(main())
        deadline = time.time() + 60
        while time.time() < deadline:
            if metric_sum(port, "orchard_writer_queue_depth") == 0:
                break
            time.sleep(0.2)
        peak = max(_rss_peak_mb(p) for p in pids)  # of a worker (each is a whole proxy)
        print(
            f"\nload: {SESSIONS} sessions x {seconds:.0f}s, {workers} worker(s): sent {sent}, ok {ok}, peak RSS {peak:.0f} MB, samples {rss[:3]}..{rss[-3:]}"
        )
        assert ok == sent > SESSIONS
        assert peak < 600, f"peak RSS {peak:.0f} MB"
        half = rss[len(rss) // 2]
        assert rss[-1] - half < 0.25 * half + 50  # no steady growth over the second half
        assert Store(db).count_calls() == sent
    finally:
        proc.terminate()
        proc.wait(60)


def test_back_pressure_answers_429_in_the_callers_dialect(
    upstream_factory, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(chunk_delay=0.05)
    proxy = proxy_factory(up.url, sqlite_url, mode="passthrough", max_inflight=4)

    async def main() -> list[tuple[int, dict | None]]:  # type: ignore[type-arg]
        async with aiohttp.ClientSession() as http:

            async def one(i: int) -> tuple[int, dict | None]:  # type: ignore[type-arg]
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"long story {i}"}],
                    "stream": True,
                }
                async with http.post(f"{proxy.url}/s/bp/v1/chat/completions", json=body) as r:
                    data = await r.read()
                    return r.status, (json.loads(data) if r.status != 200 else None)

            return await asyncio.gather(*(one(i) for i in range(16)))

    results = asyncio.run(main())
    codes = [c for c, _ in results]
    assert codes.count(200) >= 4 and codes.count(429) >= 1 and set(codes) <= {200, 429}
    assert all(b["error"]["type"] == "rate_limit_error" for c, b in results if c == 429)
    proxy.flush()
    recs = proxy.store().calls("bp")
    assert len(recs) == 16 and sum(r.status_code == 429 for r in recs) == codes.count(429)
