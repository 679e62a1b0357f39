"""``process`` durability (the default): written before the last byte, fsync'd within the interval.

- With ``--fsync-interval`` 0.05 s and calls flowing in bursts and gaps, the background fsync runs
  (counted), far fewer times than there are calls, and the age of the oldest write not yet fsync'd
  (as the spool measures it when each fsync returns, and sampled between bursts) never exceeds
  50 ms while the disk's fsyncs take under ~a third of it; ``/metrics`` and ``/healthz`` agree.
- The spool primitives: ``append_lines(sync=False)`` leaves the lines unsynced until ``sync``;
  acknowledged lines kept (``keep_bytes``) are replayed once after a restart, never stored twice.
- ``--durability wal`` (the earlier name) still starts, as ``machine``, with one deprecation line.

The first runs with one process and with ``--workers 2`` (each worker's spool keeps the bound).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import aiohttp
import orjson
import pytest
from factories import free_port, serve_process

from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.storage import Store
from orchard_rec.storage.spool import Spool

INTERVAL = 0.05


def _metric(text: str, name: str, worker: int | None = None) -> float:
    """A sample of ``/metrics`` (with ``--workers``: worker ``worker``'s)."""
    label = "" if worker is None else f'{{worker="{worker}"}}'
    return float(next(ln for ln in text.splitlines() if ln.startswith(name + label + " ")).split()[1])


def _each_worker(base: str, n: int) -> dict[int | None, dict]:  # type: ignore[type-arg]
    """``/healthz`` of each of ``n`` workers (None: the one process), asked on new connections
    until every worker has answered one."""
    seen: dict[int | None, dict] = {}  # type: ignore[type-arg]
    deadline = time.monotonic() + 30
    while len(seen) < n:
        assert time.monotonic() < deadline, seen.keys()
        h = _health(base)
        seen[h["worker"]["index"] if "worker" in h else None] = h
    return seen


@pytest.mark.slow  # ~6 s: 2.5 s of calls through a served process
def test_unsynced_writes_are_fsynced_within_the_interval(upstream, tmp_path, workers) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'w.db'}"
    port = free_port()  # a process of its own, as served (its threads alone share its interpreter)
    proc = serve_process(
        port,
        upstream.url,
        db,
        "--spool",
        str(tmp_path / "w.spool"),
        "--fsync-interval",
        str(INTERVAL),
        "--workers",
        str(workers),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        assert _health(base)["durability"] == "process"  # the default
        ages: list[float] = []

        async def main() -> int:
            sent = 0
            async with aiohttp.ClientSession() as http:

                async def one(i: int) -> None:
                    body = {
                        "model": "m",
                        "messages": [{"role": "user", "content": f"w {i}"}],
                        "stream": i % 3 == 0,
                    }
                    async with http.post(f"{base}/s/win-{i % 4}/v1/chat/completions", json=body) as r:
                        await r.read()
                        assert r.status == 200

                t_end = time.monotonic() + 2.5
                while time.monotonic() < t_end:
                    burst = 1 + sent % 8  # bursts of 1..8 calls, then a gap of 0..120 ms
                    await asyncio.gather(*(one(sent + k) for k in range(burst)))
                    sent += burst
                    async with http.get(f"{base}/healthz") as r:  # sampled between bursts
                        ages.append((await r.json())["spool_sync"]["unsynced_age_s"])
                    await asyncio.sleep((sent % 5) * 0.03)
            return sent

        sent = asyncio.run(main())
        time.sleep(4 * INTERVAL)
        syncs = {k: h["spool_sync"] for k, h in _each_worker(base, workers).items()}
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            metrics = r.read().decode()
    finally:
        proc.terminate()
        proc.wait(30)
    # ran, and not once per call: 2.5 s of calls, one fsync per quarter interval at most (each worker)
    fsyncs = sum(s["fsyncs"] for s in syncs.values())
    assert 2.5 / INTERVAL / 4 <= fsyncs < min(sent, workers * (2.5 / (INTERVAL / 4) + 10)), (syncs, sent)
    bounds = [_within_the_interval(sync, metrics, worker) for worker, sync in syncs.items()]
    assert max(ages) <= max(bounds), (syncs, max(ages))  # sampled from whichever worker answered
    assert len(Store(db).calls()) == sent


def _within_the_interval(sync: dict, metrics: str, worker: int | None) -> float:  # type: ignore[type-arg]
    """One process's fsync figures checked against the interval; the bound that held."""
    assert sync["fsync_interval_s"] == INTERVAL and sync["unsynced_age_s"] == 0  # all on disk by now
    # The proxy's part: an fsync starts a quarter of the interval after the oldest write it covers,
    # or when the one in flight returns, so a write waits at most that lag + one fsync: within the
    # interval while the device's fsyncs take under ~a third of it and the fsync thread is woken on
    # time. On a loaded shared box neither always holds: a shared ext4 journal under other
    # processes' writes took 45-170 ms at times here, and a runnable thread can wait for a core;
    # /healthz says which (slowest_fsync_s, max_sync_late_s), and the bound is then lag + that fsync.
    slowest, late = sync["slowest_fsync_s"], sync["max_sync_late_s"]
    lag = max(INTERVAL / 4, slowest) + late + 0.005
    assert sync["max_sync_lag_s"] <= lag, sync
    fast = slowest <= INTERVAL / 3 and late <= 0.01
    bound = INTERVAL if fast else lag + slowest
    assert sync["max_unsynced_age_s"] <= bound, sync
    assert _metric(metrics, "orchard_spool_fsyncs_total", worker) == sync["fsyncs"]
    assert _metric(metrics, "orchard_spool_unsynced_max_age_seconds", worker) == sync["max_unsynced_age_s"]
    assert _metric(metrics, "orchard_spool_fsync_interval_seconds", worker) == INTERVAL
    return bound


def _health(base: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _line(k: int) -> bytes:
    return orjson.dumps({"_v": 0, "k": k})


def test_unsynced_appends_wait_for_sync_and_kept_lines_replay_once(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "s.spool", preallocate=0, keep_bytes=1 << 20)
    assert sp.append_lines([_line(0), _line(1)], sync=False) == 2
    assert sp.fsyncs == 0 and sp.synced == 0 and sp.unsynced_since is not None
    assert sp.sync() and sp.fsyncs == 1 and sp.synced == 2 and sp.unsynced_age == 0
    assert not sp.sync()  # nothing new: no fsync
    sp.ack(2)  # all acknowledged: the lines stay (no truncation per batch) but are not pending
    assert sp.lines()[0] == [] and (tmp_path / "s.spool").stat().st_size > 0
    sp.append_lines([_line(2)], sync=False)
    assert [i for i, _ in sp.lines()[0]] == [2]
    sp.sync()
    # a crash here: the restarted spool replays every line it holds (the acknowledged ones are
    # skipped by the idempotent write); a clean close would have cut the acknowledged ones
    sp._segments[0].f.close()
    again = Spool(tmp_path / "s.spool", preallocate=0, keep_bytes=1 << 20)
    assert [orjson.loads(line)["k"] for _, line in again.lines()[0]] == [0, 1, 2]
    again.close()


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_the_earlier_name_wal_still_serves_as_machine(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert ProxyConfig(upstream=upstream.url, durability="wal").durability == "machine"
    port = free_port()
    proc = serve_process(
        port,
        upstream.url,
        f"sqlite:///{tmp_path / 'w.db'}",
        "--spool",
        str(tmp_path / "w.spool"),
        "--durability",
        "wal",
        stderr=open(tmp_path / "err.txt", "wb"),
    )
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            health = json.loads(r.read())
        assert health["durability"] == "machine" and health["spool_sync"]["fsync_interval_s"] == 0
    finally:
        proc.terminate()
        proc.wait(30)
    err = (tmp_path / "err.txt").read_text()
    assert "warning: --durability wal is now called machine" in err
    assert "Traceback" not in err
