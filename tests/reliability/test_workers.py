"""``serve --workers N`` (issue 39, item 3): N processes on one port, each with its own spool.

Real processes over loopback: ``orchard-rec serve --workers 2`` in a subprocess, clients opening a
new connection per call (the kernel's ``SO_REUSEPORT`` hash then spreads them over both workers),
one SQLite database written by both (WAL, ``busy_timeout``). Calls spread over both workers and
say which took them; tito sessions whose turns land on either stay one branch and one sample;
``kill -9`` of one worker under load loses no answered call and stores none twice (the parent
starts it again, the new one replays its spool); SIGTERM of the parent drains a stream in flight;
spools of earlier runs that no worker owns are replayed at start. The tito and kill -9 tests run on
PostgreSQL too (the throwaway cluster of ``tests/pg.py``); the trainer's policy version reaches
every worker.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from factories import free_port, serve_process
from prometheus_client.parser import text_string_to_metric_families

from orchard_rec.proxy.workers import orphan_spools, spool_paths, workers_count
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome, CallRecord, Dialect
from orchard_rec.storage.spool import Spool
from orchard_rec.storage.store import Store


def _workers(parent: subprocess.Popen[bytes]) -> list[int]:
    """The parent's child processes (its workers), by pid."""
    with open(f"/proc/{parent.pid}/task/{parent.pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _spool_of(pid: int) -> Path | None:
    """The spool file a worker holds open (``SPOOL.w<k>``); None before it opened it (starting)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if re.search(r"\.w\d+$", target):
                return Path(target)
    return None


def _answering(port: int) -> int:
    """The pid of the worker that answered a ``/healthz`` on a new connection (0: none did)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers={"Connection": "close"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(json.loads(r.read())["worker"]["pid"])
    except OSError:
        return 0


def _wait(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _post(url: str, body: dict[str, Any], timeout: float = 30) -> bytes:
    """One call on a connection of its own (``Connection: close``): a new hash, any worker."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return bytes(r.read())


def _stop(parent: subprocess.Popen[bytes]) -> int:
    parent.send_signal(signal.SIGTERM)
    return parent.wait(60)


def _record(call_id: str) -> CallRecord:
    return CallRecord(
        call_id=call_id,
        session_id="earlier-run",
        dialect=Dialect.CHAT,
        method="POST",
        path="/v1/chat/completions",
        stream=False,
        status_code=200,
        outcome=CallOutcome.OK,
        received_at=time.time(),
        first_byte_at=None,
        done_at=time.time(),
        request={"messages": [{"role": "user", "content": call_id}]},
    )


def test_worker_spools_are_named_apart_and_earlier_ones_found(tmp_path: Path) -> None:
    base = tmp_path / "o.db.spool"
    assert spool_paths(base, 1) == [base]
    assert spool_paths(base, 2) == [tmp_path / "o.db.spool.w0", tmp_path / "o.db.spool.w1"]
    for name, text in [("o.db.spool", b"x\n"), ("o.db.spool.w1", b"x\n"), ("o.db.spool.w3", b"x\n")]:
        (tmp_path / name).write_bytes(text)
    (tmp_path / "o.db.spool.w2").write_bytes(b"")  # empty: nothing to replay
    (tmp_path / "o.db.spool.w1.rejected").write_bytes(b"x\n")  # not a spool
    assert orphan_spools(base, 2) == [base, tmp_path / "o.db.spool.w3"]
    assert orphan_spools(base, 1) == [tmp_path / "o.db.spool.w1", tmp_path / "o.db.spool.w3"]
    assert orphan_spools(base, 4) == [base]
    assert workers_count("3") == 3 and workers_count("auto") >= 1
    with pytest.raises(ValueError):
        workers_count("0")


def test_a_spool_does_not_take_a_worker_spools_segments(tmp_path: Path) -> None:
    """``PATH.1`` is a segment of ``PATH``; ``PATH.w0.1`` is one of ``PATH.w0``, not of ``PATH``."""
    base = tmp_path / "s.spool"
    worker = Spool(base.with_name("s.spool.w0"), segment_bytes=1, preallocate=0)
    worker.append([_record("a")])
    worker.append([_record("b")])  # past segment_bytes: a second segment, s.spool.w0.1
    worker.close()
    assert (tmp_path / "s.spool.w0.1").is_file()
    own = Spool(base)
    try:
        assert own.depth == 0
    finally:
        own.close()
    again = Spool(base.with_name("s.spool.w0"))
    try:
        assert [r.call_id for r in again.records()] == ["a", "b"]
    finally:
        again.close()


def test_workers_zero_is_a_usage_error() -> None:
    out = subprocess.run(
        [
            "python",
            "-m",
            "orchard_rec.cli",
            "serve",
            "--upstream",
            "http://127.0.0.1:9/v1",
            "--workers",
            "zero",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--workers zero" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_two_workers_share_tito_sessions_exactly_and_replay_earlier_spools(
    upstream_factory, tmp_path, request, database
) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(drift=True)  # re-rendering the model's text would re-tokenize it differently
    db = (
        f"sqlite:///{tmp_path / 'o.db'}"
        if database == "sqlite"
        else request.getfixturevalue("pg").new_database()
    )
    base = tmp_path / "o.db.spool"
    for path, cid in [(base, "single-run"), (tmp_path / "o.db.spool.w3", "four-workers")]:
        sp = Spool(path)  # what earlier runs left: one with a single process, one with four workers
        sp.append([_record(cid)])
        sp.close()
    port = free_port()
    parent = serve_process(
        port, up.url, db, "--workers", "2", "--mode", "tito", "--tokenizer", "demo", "--spool", str(base)
    )
    try:
        sessions = {f"tw-{i}": [{"role": "user", "content": f"task {i}: list the files"}] for i in range(4)}
        for turn in range(6):
            for sid, messages in sessions.items():
                out = json.loads(
                    _post(
                        f"http://127.0.0.1:{port}/s/{sid}/v1/chat/completions",
                        {"model": "m", "messages": messages},
                    )
                )
                messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
                messages.append({"role": "user", "content": f"and now step {turn}"})
        for _ in range(4):  # whichever worker answers the scrape: both workers' figures, labelled
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
            assert fams["orchard_workers_answered"].samples[0].value == 2
            calls = [x for x in fams["orchard_calls"].samples if x.name == "orchard_calls_total"]
            assert {x.labels["worker"] for x in calls} == {"0", "1"}
            assert sum(x.value for x in calls) == 24
    finally:
        assert _stop(parent) == 0
    store = Store(db)
    try:
        assert {c.call_id for c in store.calls("earlier-run")} == {"single-run", "four-workers"}
        took = set()
        for sid in sessions:
            calls = store.calls(sid)
            assert len(calls) == 6 and all(c.outcome is CallOutcome.OK for c in calls)
            workers = [c.metadata["worker"]["index"] for c in calls]
            took |= set(workers)
            assert [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * 5, (sid, workers)
            assert len({c.metadata["tito"]["branch"] for c in calls}) == 1
            [sample] = reconstruct_session(calls)  # one sample, whichever worker took each turn
            assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
        assert took == {0, 1}
    finally:
        store.close()
    assert not (tmp_path / "o.db.spool.w3").read_bytes().strip(b"\0")


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_kill_9_of_a_worker_under_load_loses_no_answered_call(
    upstream, tmp_path, monkeypatch, request, database
) -> None:  # type: ignore[no-untyped-def]
    """Calls spread over both workers; kill -9 of one under load: every answered call stored, none
    twice, on SQLite (one file, two writers) and on PostgreSQL (the throwaway cluster)."""
    monkeypatch.setenv("ORCHARD_FAULT_WRITE_DELAY_S", "0.05")  # the database behind: lines wait in the spools
    monkeypatch.setenv("ORCHARD_SPOOL_KEEP_MB", "0")  # acknowledged lines cut at once: what stays is pending
    if database == "sqlite":
        db = f"sqlite:///{tmp_path / 'o.db'}"
    else:
        db = request.getfixturevalue("pg").new_database()
    port = free_port()
    with open(tmp_path / "serve.log", "wb") as log:
        # no --spool: the default's (beside a SQLite file; .orchard-spool/ in the working folder)
        parent = serve_process(port, upstream.url, db, "--workers", "2", stderr=log, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}/s/{{}}/v1/chat/completions"
    answered: list[str] = []
    failed: list[str] = []
    stop = threading.Event()

    def client(c: int) -> None:
        k = 0
        while not stop.is_set():
            text = f"client {c} call {k}"
            k += 1
            stream = k % 2 == 0
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
            try:
                data = _post(url.format(f"load-{c}"), body)
            except (OSError, http.client.HTTPException):  # in flight on the killed worker
                failed.append(text)
                continue
            if not stream or data.endswith(b"data: [DONE]\n\n"):
                answered.append(text)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    try:
        for t in threads:
            t.start()
        _wait(lambda: len(answered) >= 40)
        first = _workers(parent)
        assert len(first) == 2
        _wait(lambda: _answering(port) == first[0])  # it serves (not starting still): calls on it
        _wait(lambda: _spool_of(first[0]) is not None)
        spool = _spool_of(first[0])
        assert spool is not None
        os.kill(first[0], signal.SIGKILL)  # under load: calls in flight on it, lines in its spool
        left = [orjson.loads(x)["call_id"] for x in spool.read_bytes().split(b"\n") if x.endswith(b"}")]
        _wait(lambda: len(_workers(parent)) == 2 and first[0] not in _workers(parent))  # started again
        [fresh] = set(_workers(parent)) - set(first)
        _wait(lambda: _answering(port) == fresh)  # and listening: its spool replayed meanwhile
        n = len(answered)
        _wait(lambda: len(answered) >= n + 40)  # both serve again
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert _stop(parent) == 0
    # only what was in flight on the killed worker, or queued on its socket while it was torn down
    assert len(failed) <= 2 * len(threads)
    store = Store(db)
    try:
        calls = store.calls()
        texts = [c.request["messages"][0]["content"] for c in calls if c.outcome is CallOutcome.OK]
        assert len({c.call_id for c in calls}) == len(calls)
        assert len(texts) == len(set(texts)), "a call recorded twice"
        missing = set(answered) - set(texts)
        assert not missing, f"{len(missing)} of {len(answered)} answered calls not stored"
        assert {c.metadata["worker"]["index"] for c in calls} == {0, 1}
        assert left and set(left) <= {c.call_id for c in calls}  # what its spool held: replayed
    finally:
        store.close()
    said = (tmp_path / "serve.log").read_text()
    assert "replayed" in said and "ended (exit code -9)" in said and "Traceback" not in said


@pytest.mark.slow
def test_sigterm_of_the_parent_drains_a_stream_in_flight(upstream_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(chunk_delay=0.15)  # a stream of ~15 chunks: ~2 s
    db = f"sqlite:///{tmp_path / 'o.db'}"
    port = free_port()
    parent = serve_process(port, up.url, db, "--workers", "2")
    got: list[bytes] = []
    body = {"model": "m", "messages": [{"role": "user", "content": "a long one"}], "stream": True}
    t = threading.Thread(
        target=lambda: got.append(_post(f"http://127.0.0.1:{port}/s/drain/v1/chat/completions", body))
    )
    t.start()
    _wait(lambda: up.fake.log)  # the stream has started
    time.sleep(0.3)
    parent.send_signal(signal.SIGTERM)
    t.join(30)
    assert parent.wait(60) == 0
    assert got and got[0].endswith(b"data: [DONE]\n\n")
    store = Store(db)
    try:
        [call] = store.calls("drain")
        assert call.outcome is CallOutcome.OK and call.stream
    finally:
        store.close()


def _write_many(db: str, who: int, known_new: bool) -> None:
    store = Store(db)
    try:
        for b in range(30):
            batch = [_record(f"w{who}-{b}-{k}") for k in range(4)]
            store.write_batch(batch, known_new=known_new and b % 2 == 0)
            store.write_batch(batch[:2])  # a replay of stored calls: read first, nothing new
    finally:
        store.close()


def test_sqlite_takes_writes_from_several_processes_at_once(tmp_path: Path) -> None:
    """Workers share one SQLite file: WAL and the 30 s busy timeout make each writer wait for the
    other's transaction; none fails (a replay's batch reads before it writes) and nothing is lost."""
    import multiprocessing

    db = f"sqlite:///{tmp_path / 'o.db'}"
    Store(db).upgrade()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_many, args=(db, w, w % 2 == 0)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    store = Store(db)
    try:
        calls = store.calls("earlier-run")
        assert len(calls) == 4 * 30 * 4 == len({c.call_id for c in calls})
        assert [c.seq for c in calls] == list(range(1, len(calls) + 1))
    finally:
        store.close()


@pytest.mark.slow  # a served process: ~3 s
def test_the_trainers_policy_version_reaches_every_worker(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``POST /v1/orchard/policy`` lands on one worker, which passes it on: every call, on either
    worker, is fenced with it."""
    db = f"sqlite:///{tmp_path / 'o.db'}"
    port = free_port()
    with open(tmp_path / "serve.log", "wb") as log:
        parent = serve_process(
            port,
            upstream.url,
            db,
            "--workers",
            "2",
            "--policy-refresh",
            "0",
            "--spool",
            str(tmp_path / "s"),
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        said = json.loads(_post(f"{base}/v1/orchard/policy", {"version": "v3"}))
        assert said["version"] == "v3" and said["workers"] == {"told": 2, "of": 2}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(12):
            _post(f"{base}/s/fenced/v1/chat/completions", body)
        for _ in range(8):  # whichever worker answers
            req = urllib.request.Request(f"{base}/v1/orchard/policy", headers={"Connection": "close"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert json.loads(r.read())["version"] == "v3"
    finally:
        assert _stop(parent) == 0
    store = Store(db)
    try:
        calls = store.calls("fenced")
        assert len(calls) == 12 and {c.metadata["worker"]["index"] for c in calls} == {0, 1}
        assert all(c.policy_versions == (("v3", 0, len(c.completion_ids or ())),) for c in calls)
    finally:
        store.close()
