"""Faults inside the recorder's own threads: nothing a call or the disk does may stop a writer.

- A record that cannot be serialized (an integer past 64 bits, a lone surrogate: orjson refuses
  both) is logged and set aside (``SPOOL.rejected``, written by the standard library's ``json``),
  under ``async`` and ``wal`` alike; the calls around it are stored and the writer keeps going.
- The database thread (``wal``) and the replays survive a spool operation that raises (``ack``,
  reading the spool): the spool keeps what was not acknowledged and a later replay stores it.

Real ``Store`` on SQLite and a real spool on disk; faults are injected by wrapping one method.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from factories import call

from orchard_rec.proxy.recorder import Recorder
from orchard_rec.records import CallRecord
from orchard_rec.storage import Store


def _wait(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class Flaky:
    """Wraps a real ``Store``: its next ``fail`` writes raise, as a lost connection would."""

    def __init__(self, store: Store) -> None:
        self.fail = 0
        self._write = store.write_batch
        store.write_batch = self.write_batch  # type: ignore[method-assign]

    def write_batch(self, records: Any, *, known_new: bool = False) -> int:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return self._write(records, known_new=known_new)


def _store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    store.upgrade()
    return store


POISONS = [
    pytest.param({"big": 10**30}, id="int-past-64-bits"),
    pytest.param({"text": "\ud800"}, id="lone-surrogate"),
]


@pytest.mark.parametrize("meta", POISONS)
def test_async_a_record_the_spool_cannot_serialize_is_set_aside(tmp_path, caplog, meta) -> None:  # type: ignore[no-untyped-def]
    """The database is down, so the batch goes to the spool, where one record cannot be written
    as JSON: that record is set aside and logged, the others are spooled, the writer lives on and
    the replay stores them once the database is back."""
    store = _store(tmp_path)
    flaky = Flaky(store)
    spool = tmp_path / "a.spool"
    rec = Recorder(store, spool=spool, durability="async", retry_s=0.05, linger_s=0)
    rec.start()
    flaky.fail = 1
    poison = call("s", metadata=meta)
    rec.submit(poison)
    assert rec.flush(5)
    good = [call("s") for _ in range(3)]
    for r in good:
        rec.submit(r)
    assert rec.flush(5), "the writer thread died"
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    assert rec._thread is not None and rec._thread.is_alive()
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {r.call_id for r in good}
    assert "could not write the record of call " + poison.call_id in caplog.text
    aside = [json.loads(line) for line in (tmp_path / "a.spool.rejected").read_text().splitlines()]
    assert [a["call_id"] for a in aside] == [poison.call_id]
    store.close()


@pytest.mark.parametrize("meta", POISONS)
def test_wal_a_record_line_that_cannot_be_serialized_is_set_aside(tmp_path, caplog, meta) -> None:  # type: ignore[no-untyped-def]
    """Under wal a ``CallRecord`` submitted as one is spooled as a record line: one that cannot be
    serialized is set aside, the rest of its batch is spooled and stored, nobody waits forever."""
    store = _store(tmp_path)
    rec = Recorder(store, spool=tmp_path / "w.spool", durability="wal", retry_s=0.05)
    rec.start()
    poison = call("s", metadata=meta)
    good = call("s")
    rec.submit(poison)
    rec.submit(good)
    assert rec.flush(5), "the writer thread died"
    later = call("s")
    rec.submit(later)
    assert rec.flush(5), "the writer thread died"
    assert rec._thread is not None and rec._thread.is_alive()
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {good.call_id, later.call_id}
    assert "could not write the record of call " + poison.call_id in caplog.text
    aside = (tmp_path / "w.spool.rejected").read_text().splitlines()
    assert [json.loads(a)["call_id"] for a in aside] == [poison.call_id]
    store.close()


def test_wal_an_ack_that_raises_does_not_stop_the_database_thread(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """``Spool.ack`` fails once (an I/O error truncating the file): the database thread logs it,
    the spool keeps the batch (a replay acknowledges it later), and later calls are stored."""
    store = _store(tmp_path)
    rec = Recorder(store, spool=tmp_path / "k.spool", durability="wal", retry_s=0.05)
    rec.start()
    assert rec.spool is not None
    ack = rec.spool.ack
    fails = [1]

    def broken(upto: int) -> None:
        if fails[0]:
            fails[0] -= 1
            raise OSError(5, "Input/output error")
        ack(upto)

    rec.spool.ack = broken  # type: ignore[method-assign]
    first, second = call("s"), call("s")
    rec.submit(first)
    assert rec.flush(5)
    rec.submit(second, committed=True)
    assert rec.flush(5), "the database thread died"
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    assert rec._db_thread is not None and rec._db_thread.is_alive()
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {first.call_id, second.call_id}
    assert "Input/output error" in caplog.text
    store.close()


@pytest.mark.parametrize("durability", ["async", "wal"])
def test_a_replay_that_raises_is_retried_not_fatal(tmp_path, caplog, durability) -> None:  # type: ignore[no-untyped-def]
    """Reading the spool fails once during a replay: the thread that replays logs it and tries
    again ``retry_s`` later; everything spooled is stored."""
    store = _store(tmp_path)
    flaky = Flaky(store)
    rec = Recorder(store, spool=tmp_path / "r.spool", durability=durability, retry_s=0.05, linger_s=0)
    rec.start()
    assert rec.spool is not None
    lines = rec.spool.lines
    fails = [1]

    def broken() -> Any:
        if fails[0]:
            fails[0] -= 1
            raise OSError(5, "Input/output error")
        return lines()

    rec.spool.lines = broken  # type: ignore[method-assign]
    flaky.fail = 1
    records: list[CallRecord] = [call("s"), call("s")]
    for r in records:
        rec.submit(r)
        assert rec.flush(5)
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    assert not fails[0], "no replay ran"
    later = call("s")
    rec.submit(later)
    assert rec.flush(5), "the thread that replays died"
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {r.call_id for r in [*records, later]}
    assert "Input/output error" in caplog.text
    store.close()


@pytest.mark.parametrize("meta", POISONS)
def test_without_a_spool_a_record_the_database_refuses_does_not_stall_the_writer(
    tmp_path, caplog, meta
) -> None:  # type: ignore[no-untyped-def]
    """No spool: a failed write is retried in memory until the database takes it. A record that
    cannot be serialized never will be; it is logged and dropped from the retry, the others stored."""
    store = _store(tmp_path)
    rec = Recorder(store, durability="async", retry_s=0.05, linger_s=0)
    rec.start()
    poison, good = call("s", metadata=meta), call("s")
    rec.submit(poison)
    rec.submit(good)
    assert rec.flush(5), "the writer is stuck retrying a record the database cannot take"
    later = call("s")
    rec.submit(later)
    assert rec.flush(5)
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {good.call_id, later.call_id}
    assert "could not write the record of call " + poison.call_id in caplog.text
    store.close()
