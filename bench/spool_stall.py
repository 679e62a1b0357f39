"""How long a large call's spool line stalls the proxy's event loop under ``process`` durability.

    python bench/spool_stall.py [--mb 1,4,16] [--rounds 5]

For each request size, one call (a chat body of that many MB of text, token mode, the fake
upstream) through an in-process proxy, its line written on the event loop
(``ORCHARD_SPOOL_INLINE_MB`` above the size) or by the spool thread (the default for a call of
1 MiB or more), alternated; a probe task on the proxy's loop sleeps 0.5 ms at a time and records
how late it wakes. Prints the probe's longest lateness during the call (median of rounds), and
the raw ``write(2)`` time of a line that size into the page cache. The request's own parse and
answer run on the loop in both variants; the difference is the line's encoding and write.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import free_port, wait_http  # noqa: E402

from orchard_rec.proxy.app import build_app  # noqa: E402
from orchard_rec.proxy.config import ProxyConfig  # noqa: E402
from orchard_rec.proxy.server import BackgroundServer, tune_interpreter  # noqa: E402


async def _probe(stop: asyncio.Event, out: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.0005)
        out.append(time.perf_counter() - t - 0.0005)


def one(upstream: str, work: Path, mb: float, inline: bool, k: int) -> float:
    os.environ["ORCHARD_SPOOL_INLINE_MB"] = str(mb * 4 + 1 if inline else 1)
    cfg = ProxyConfig(upstream=upstream, db=f"sqlite:///{work}/s{k}.db", spool=str(work / f"s{k}.spool"))
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * int(mb * (1 << 20))}]}
    with BackgroundServer(lambda: build_app(cfg)) as proxy:
        loop = proxy._loop  # the proxy's own event loop (its thread)
        lags: list[float] = []

        async def call() -> None:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{proxy.url}/s/big/v1/chat/completions", json=body) as r:
                    await r.read()
                    assert r.status == 200

        asyncio.run(call())  # warm-up (a first call of a session is whole either way)
        stop_box: list[asyncio.Event] = []
        tasks: list[asyncio.Task[None]] = []

        async def start() -> None:
            stop_box.append(asyncio.Event())
            tasks.append(asyncio.ensure_future(_probe(stop_box[0], lags)))

        asyncio.run_coroutine_threadsafe(start(), loop).result()
        time.sleep(0.05)
        lags.clear()
        asyncio.run(call())
        loop.call_soon_threadsafe(stop_box[0].set)
        time.sleep(0.01)
    return max(lags)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tune_interpreter()  # as ``serve`` runs (0.5 ms GIL switch interval, the collector tuned)
    port = free_port()
    up = subprocess.Popen([sys.executable, str(HERE / "fakeupstream.py"), "--port", str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models")
        work = Path(tempfile.mkdtemp(prefix="orchard-stall-"))
        print(
            "| request MB | raw write(2) ms | loop's longest stall, line on the loop ms | by the spool thread ms |"
        )
        print("|---|---|---|---|")
        k = 0
        for mb in (float(x) for x in args.mb.split(",")):
            res: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.rounds):
                for inline in (True, False):
                    k += 1
                    res[inline].append(one(f"http://127.0.0.1:{port}/v1", work, mb, inline, k))
            fd = os.open(work / "raw", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            data = b"x" * int(mb * (1 << 20))
            raws = []
            for i in range(args.rounds):
                t = time.perf_counter()
                os.pwrite(fd, data, i * len(data))
                raws.append(time.perf_counter() - t)
            os.close(fd)
            med = {v: statistics.median(x) * 1e3 for v, x in res.items()}
            print(f"| {mb:g} | {statistics.median(raws) * 1e3:.2f} | {med[True]:.2f} | {med[False]:.2f} |")
    finally:
        up.terminate()


if __name__ == "__main__":
    main()
