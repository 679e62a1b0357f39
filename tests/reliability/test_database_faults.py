"""Database faults and process death: the proxy keeps serving, nothing recorded is lost.

- PostgreSQL stopped for 30 s: calls keep succeeding, records go to the spool, /healthz
  says degraded and /metrics shows the spool depth; when it returns the spool is replayed,
  each call exactly once.
- SQLite locked by another writer: responses are not held up; the records land after.
- kill -9 under load with the default durability (``process``: the spool line written, not yet
  fsync'd, before the last byte): every call whose response the client fully received is in the
  database after a restart (replayed from the spool), none twice.

Each runs against one proxy process and against ``serve --workers 2`` (``served_factory``,
``workers``): there the outage fills both workers' spools and each replays its own, and kill -9
takes the parent and both workers at once.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import urllib.request

import aiohttp
import pytest
from factories import free_port, kill_all, metric_sum, serve_process
from pg import PgCluster

from orchard_rec.records import CallOutcome
from orchard_rec.storage import Store


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def _chat(base: str, sid: str, text: str, stream: bool = False) -> int:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
    ).encode()
    req = urllib.request.Request(
        f"{base}/s/{sid}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        return r.status


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_down_for_30s_spools_then_replays_exactly_once(
    upstream, served_factory, workers, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    outage = 30 if workers == 1 else 10  # two workers: the same path twice, shorter (suite time)
    cluster = PgCluster(durable=True).start()
    try:
        db = cluster.new_database()
        proxy = served_factory(upstream.url, db, mode="token", spool=str(tmp_path / "p.spool"))
        port = int(proxy.url.rsplit(":", 1)[1])
        for i in range(5):
            assert _chat(proxy.url, "pg", f"before {i}") == 200
        proxy.flush()
        cluster.stop("immediate")
        t_down = time.monotonic()
        sent = 0
        while time.monotonic() - t_down < outage:
            assert _chat(proxy.url, "pg", f"during {sent}", stream=sent % 2 == 1) == 200
            sent += 1
            time.sleep(0.5)
        proxy.flush()
        status, health = _get(proxy.url + "/healthz")
        assert status == 200 and json.loads(health)["status"] == "degraded"
        assert metric_sum(port, "orchard_spool_depth") == sent  # over the workers
        cluster.restart()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and metric_sum(port, "orchard_spool_depth"):
            time.sleep(0.2)
        assert json.loads(_get(proxy.url + "/healthz")[1])["status"] == "ok"
        assert metric_sum(port, "orchard_spool_depth") == 0
        recs = Store(db).calls("pg")
        texts = [r.request["messages"][0]["content"] for r in recs]
        expected = {f"before {i}" for i in range(5)} | {f"during {i}" for i in range(sent)}
        assert set(texts) == expected, sorted(expected - set(texts))
        assert len(recs) == 5 + sent and len(set(texts)) == len(texts)  # every call, exactly once
        assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
        assert all(r.outcome is CallOutcome.OK and r.completion_ids for r in recs)
    finally:
        cluster.cleanup()


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_sqlite_locked_does_not_hold_responses(upstream, served_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "lock.db"
    proxy = served_factory(upstream.url, f"sqlite:///{path}", mode="passthrough")
    assert _chat(proxy.url, "lk", "warm") == 200
    proxy.flush()
    locker = sqlite3.connect(path, timeout=1)
    locker.execute("BEGIN EXCLUSIVE")
    t = time.monotonic()
    for i in range(10):
        assert _chat(proxy.url, "lk", f"locked {i}") == 200
    assert time.monotonic() - t < 5  # answered while the database was locked
    time.sleep(1.0)
    locker.rollback()
    locker.close()
    proxy.flush()
    assert len(Store(f"sqlite:///{path}").calls("lk")) == 11


@pytest.mark.slow
def test_kill_9_under_load_loses_no_completed_call_by_default(upstream, tmp_path, workers) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'k.db'}"
    spool = tmp_path / "k.spool"
    port = free_port()
    served = ("--spool", str(spool), "--workers", str(workers))  # no --durability: the default
    proc = serve_process(port, upstream.url, db, *served)
    base = f"http://127.0.0.1:{port}"
    assert json.loads(_get(base + "/healthz")[1])["durability"] == "process"  # the default
    completed: set[str] = set()
    attempted = 0

    async def worker(w: int, http: aiohttp.ClientSession, stop: float) -> None:
        nonlocal attempted
        k = 0
        while time.monotonic() < stop:
            text = f"w{w} call {k}"
            k += 1
            attempted += 1
            try:
                body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": k % 2 == 0}
                async with http.post(f"{base}/s/kill-{w}/v1/chat/completions", json=body) as r:
                    data = await r.read()
                    if r.status == 200 and (not body["stream"] or data.endswith(b"data: [DONE]\n\n")):
                        completed.add(text)
            except (TimeoutError, aiohttp.ClientError):
                return

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            stop = time.monotonic() + 60
            tasks = [asyncio.create_task(worker(w, http, stop)) for w in range(16)]
            t0 = time.monotonic()
            while len(completed) < 200 and time.monotonic() - t0 < 20:  # a busy machine is slower
                await asyncio.sleep(0.1)
            kill_all(proc.pid)  # mid-load, no goodbye
            await asyncio.gather(*tasks)

    asyncio.run(main())
    proc.wait(10)
    assert len(completed) > 100
    restarted = serve_process(port, upstream.url, db, *served)  # replays the spool(s) at start-up
    try:
        deadline = time.monotonic() + 20
        while metric_sum(port, "orchard_spool_depth") and time.monotonic() < deadline:
            time.sleep(0.1)
        store = Store(db)
        recorded = {r.request["messages"][0]["content"] for r in store.calls() if r.outcome is CallOutcome.OK}
        missing = completed - recorded
        assert not missing, f"{len(missing)} of {len(completed)} completed calls lost"
        ids = [r.call_id for r in store.calls()]
        assert len(ids) == len(set(ids))
        texts = [r.request["messages"][0]["content"] for r in store.calls()]
        assert len(texts) == len(set(texts)), "a call recorded twice"  # each request text is unique
    finally:
        restarted.terminate()
        restarted.wait(30)
