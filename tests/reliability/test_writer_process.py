"""The database writer in a child process (``--db-writer process``, under ``wal``).

- What it stores equals what the writer thread stores from the same calls (every dialect, stream
  and not, token mode and tito), read back through ``Store``.
- A child that dies (killed while idle, or in the middle of a write) loses nothing: the spool keeps
  the batch, the proxy replays it and starts another child.
- A call whose record cannot be built in the child is set aside by the replay, as in-thread.
- The child dies with the proxy (``kill -9``), and the next start replays what was spooled.

Real ``Store`` on SQLite, real spool, real child processes; the proxy end to end over loopback.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from factories import (
    check_stored_as_written,
    free_port,
    growing_body,
    growing_capture,
    post_json,
    rejected_ids,
    serve_process,
    wait_for,
)

from orchard_rec.proxy import BackgroundServer, ProxyConfig, capline
from orchard_rec.proxy.app import RECORDER, build_app, cache_stats
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.records import CallRecord
from orchard_rec.storage import Store


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _workers(pid: int, n: int) -> list[int]:
    """The processes that serve: the one, or the N workers of ``--workers N``."""
    return [pid] if n == 1 else _children(pid)


def _health(port: int) -> dict:  # type: ignore[type-arg]
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _session(upstream_url: str, db: str, tmp: Path, dialect: str, mode: str) -> list[CallRecord]:
    """Six calls of one growing session through a wal proxy with its own store (so: the writer
    process); the records the writer thread would have built from the same calls."""
    kw: dict[str, Any] = {"tokenizer": "demo"} if mode == "tito" else {}
    cfg = ProxyConfig(
        upstream=upstream_url, db=db, mode=mode, spool=str(tmp / "w.spool"), db_writer="process", **kw
    )
    assert cfg.durability == "process"  # the default
    with BackgroundServer(lambda: build_app(cfg)) as proxy:
        rec = proxy.app[RECORDER]
        spool_batch, spool_one = rec._spool_batch, rec._spool_one
        caps: list[Any] = []

        def keep(batch: Any, *args: Any, **kw: Any) -> None:
            caps.extend(capline.snapshot(c) for c in batch)  # as the lines have them
            spool_batch(batch, *args, **kw)

        def keep_one(cap: Any, size: int) -> None:  # a call written inline, handed on as its line
            caps.append(capline.snapshot(cap))
            spool_one(cap, size)

        rec._spool_batch = keep
        rec._spool_one = keep_one
        wait_for(lambda: rec.proc is not None and rec.proc.ready())  # else the first batches go in-thread
        for t in range(6):
            path, body, headers = growing_body(dialect, t, stream=t % 4 >= 2)
            post_json(f"{proxy.url}/s/wp-{dialect}/{path}", body, headers)
            assert rec.flush()
        assert rec.proc is not None and rec.proc.started == 1
        assert rec.healthy and rec.spool_depth == 0 and rec.written == 6
        caches = cache_stats(proxy.app)  # the child's own, as its last batch reported them
        assert caches["state"]["entries"] == 1 and caches["state"]["hits"] == 5
        assert "writer_requests" in caches and "spool_bases" in caches
        assert ("tito" in caches) == (mode == "tito")
    ids = IdParser()
    return [c.to_record(ids) for c in caps]


@pytest.mark.parametrize(
    ("dialect", "mode"),
    [
        ("chat", "token"),
        pytest.param("responses", "token", marks=pytest.mark.slow),
        pytest.param("messages", "token", marks=pytest.mark.slow),
        pytest.param("completions", "token", marks=pytest.mark.slow),
        pytest.param("chat", "tito", marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_the_writer_process_stores_what_the_thread_would(upstream, tmp_path, dialect, mode) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'proc.db'}"
    live = _session(upstream.url, db, tmp_path, dialect, mode)
    store = Store(db)
    check_stored_as_written(store, f"wp-{dialect}", live, tmp_path / "thread.db")
    store.close()


def _store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'w.db'}")
    store.upgrade()
    return store


def _recorder(tmp_path: Path, store: Store) -> Recorder:
    rec = Recorder(store, spool=tmp_path / "k.spool", durability="wal", retry_s=0.05, writer="process")
    rec.start()
    wait_for(lambda: rec.proc is not None and rec.proc.ready())
    return rec


def _submit(rec: Recorder, *caps: Any) -> None:
    for cap in caps:
        rec.begin()
        rec.submit(cap)


@pytest.mark.slow  # starts writer processes: 3-8 s (issue 37: the fast tier stays under a minute)
def test_a_writer_process_killed_idle_or_mid_write_loses_nothing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = _store(tmp_path)
    rec = _recorder(tmp_path, store)
    assert rec.proc is not None
    a, b, c, d, e = (growing_capture("s", k) for k in range(5))
    _submit(rec, a)
    wait_for(lambda: rec.written == 1 and rec.spool_depth == 0)
    first = rec.proc.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)  # idle: the next batch finds it gone
    wait_for(lambda: not _alive(first))
    _submit(rec, b)
    wait_for(lambda: rec.written == 2 and rec.spool_depth == 0 and rec.healthy)
    assert rec.proc.started == 2  # b was replayed here; a new child started
    wait_for(lambda: rec.proc is not None and rec.proc.ready())
    _submit(rec, c)
    wait_for(lambda: rec.written == 3 and rec.spool_depth == 0 and rec.healthy)
    rec.close()
    # in the middle of a write: the child sleeps before it writes (it reads the variable at start)
    monkeypatch.setenv("ORCHARD_FAULT_WRITE_DELAY_S", "2")
    rec = _recorder(tmp_path, store)
    assert rec.proc is not None
    _submit(rec, d)
    time.sleep(0.5)
    assert rec.written == 0 and rec.spool_depth == 1
    pid = rec.proc.pid
    assert pid is not None
    monkeypatch.setenv("ORCHARD_FAULT_WRITE_DELAY_S", "0")  # for the next child
    rec.fault_write_delay = 0  # and the replay here
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: rec.spool_depth == 0 and rec.healthy)
    assert rec.write_errors >= 1
    wait_for(lambda: rec.proc is not None and rec.proc.ready())
    _submit(rec, e)
    wait_for(lambda: rec.written == 2 and rec.spool_depth == 0 and rec.healthy)
    assert rec.proc.started == 2
    rec.close()
    assert [r.call_id for r in store.calls("s")] == [x.call_id for x in (a, b, c, d, e)]
    store.close()


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_a_record_the_writer_process_cannot_build_is_set_aside_by_the_replay(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = _store(tmp_path)
    rec = _recorder(tmp_path, store)
    a, b, c = growing_capture("s", 0), growing_capture("s", 1, broken=True), growing_capture("s", 2)
    _submit(rec, a, b)
    wait_for(lambda: rec.spool_depth == 0 and rec.healthy)
    _submit(rec, c)
    wait_for(lambda: rec.spool_depth == 0 and rec.healthy and rec.written >= 2)
    rec.close()
    assert [r.call_id for r in store.calls("s")] == [a.call_id, c.call_id]
    assert rejected_ids(tmp_path / "k.spool.rejected") == {b.call_id}
    store.close()


@pytest.mark.slow  # starts writer processes: 3-8 s (issue 37: the fast tier stays under a minute)
def test_the_writer_process_dies_with_the_proxy_and_a_restart_replays(upstream, tmp_path, workers) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the proxy (with ``--workers 2``: of the parent and its workers, each of which
    has a writer process of its own): the writer processes die too; a restart replays."""
    port = free_port()
    db = f"sqlite:///{tmp_path / 'k9.db'}"
    spool = tmp_path / "k9.spool"
    served = ("--spool", str(spool), "--workers", str(workers))
    proc = serve_process(port, upstream.url, db, *served, "--db-writer", "process")
    procs = _workers(proc.pid, workers)
    try:
        wait_for(lambda: all(len(_children(p)) == 1 for p in procs))
        kids = [k for p in procs for k in _children(p)]  # the writer processes, one a proxy process
        for t in range(3):
            path, body, headers = growing_body("chat", t, stream=False)
            post_json(f"http://127.0.0.1:{port}/s/k9/{path}", body, headers)
    finally:
        os.kill(proc.pid, signal.SIGSTOP)  # it would start its workers again
        for p in procs:
            os.kill(p, signal.SIGKILL)
        proc.kill()
        proc.wait()
    wait_for(lambda: not any(_alive(k) for k in kids))
    again = serve_process(port, upstream.url, db, *served, "--db-writer", "thread")
    try:
        store = Store(db)
        wait_for(lambda: len(store.calls("k9")) == 3)  # every answered call: stored, or replayed now
        assert not [k for p in _workers(again.pid, workers) for k in _children(p)]  # the thread, as asked
        store.close()
    finally:
        again.terminate()
        again.wait(30)


def test_a_writer_process_that_cannot_start_leaves_the_writing_to_the_thread(
    tmp_path, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    store = _store(tmp_path)
    rec = Recorder(store, spool=tmp_path / "n.spool", durability="wal", retry_s=0.05, writer="process")
    rec.start()
    caps = [growing_capture("s", k) for k in range(3)]
    _submit(rec, *caps)
    wait_for(lambda: rec.written == 3 and rec.spool_depth == 0 and rec.healthy)
    assert rec.writer_state == "starting"
    rec.close()
    assert [r.call_id for r in store.calls("s")] == [c.call_id for c in caps]
    assert "cannot start the database writer process" in caplog.text
    store.close()


@pytest.mark.parametrize(
    ("choice", "durability", "workers", "cores", "expected"),
    [
        ("auto", "process", 1, 2, "process"),
        ("auto", "machine", 1, 8, "process"),
        ("auto", "async", 1, 8, "thread"),  # async records after the answer, always in-thread
        ("auto", "process", 2, 8, "thread"),  # the workers spread the work over the cores already
        ("auto", "process", 1, 1, "thread"),  # one core: a second process only adds its own CPU
        ("thread", "process", 1, 8, "thread"),
        ("process", "process", 2, 1, "process"),  # what is asked for is what runs
    ],
)
def test_db_writer_auto_picks_the_process_beside_one_event_loop_on_two_cores(
    monkeypatch, choice, durability, workers, cores, expected
) -> None:  # type: ignore[no-untyped-def]
    import importlib

    cli_serve = importlib.import_module("orchard_rec.cli.serve")

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    assert cli_serve._db_writer(choice, durability, workers) == expected


@pytest.mark.slow  # a served proxy: ~2 s
def test_serve_runs_the_writer_process_by_default_on_this_machine(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``serve`` with no ``--db-writer``: the writer process where the machine has 2 cores or more
    (its child, ``/healthz`` ``db_writer``), and the call it records is stored."""
    port = free_port()
    db = f"sqlite:///{tmp_path / 'auto.db'}"
    proc = serve_process(port, upstream.url, db, "--spool", str(tmp_path / "auto.spool"))
    try:
        many = len(os.sched_getaffinity(0)) >= 2
        wait_for(lambda: (_health(port)["db_writer"] == "process") == many)
        assert len(_children(proc.pid)) == (1 if many else 0)
        path, body, headers = growing_body("chat", 0, stream=False)
        post_json(f"http://127.0.0.1:{port}/s/auto/{path}", body, headers)
        store = Store(db)
        wait_for(lambda: len(store.calls("auto")) == 1)
        store.close()
    finally:
        proc.terminate()
        proc.wait(30)
