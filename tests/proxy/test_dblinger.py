"""The database thread's linger under ``process`` durability (``DatabaseThread._next_linger``):
longer while calls keep coming, back to ``ORCHARD_DB_LINGER_S`` when they thin out."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_rec.proxy.recorder import Recorder
from orchard_rec.storage import Store


def _recorder(tmp_path: Path) -> tuple[Recorder, Store]:
    store = Store(f"sqlite:///{tmp_path / 'l.db'}")
    rec = Recorder(store, spool=tmp_path / "l.spool", durability="process", writer="process")
    rec._linger_max_s = max(rec.knobs.db_linger_max_s, rec.db_linger_s)  # as ``_db_loop`` sets it
    return rec, store


def test_full_batches_double_the_linger_up_to_the_maximum_and_a_small_one_resets_it(
    tmp_path: Path,
) -> None:
    rec, store = _recorder(tmp_path)
    assert (rec.db_linger_s, rec._linger_max_s) == (0.01, 0.05)
    full = rec._FULL_BATCH
    linger = rec.db_linger_s
    seen = []
    for _ in range(4):
        linger = rec._next_linger(linger, full)
        seen.append(linger)
    assert seen == [0.02, 0.04, 0.05, 0.05]
    assert rec._next_linger(0.05, full - 1) == 0.01  # calls thinned out: stored as soon as before
    assert rec._next_linger(0.01, 1) == 0.01
    # big calls: the queue does not hold 50 ms of them (``batch_bytes`` 32 MiB by default)
    assert rec._next_linger(0.01, full, rec.batch_bytes // 4 - 1) == 0.02
    assert rec._next_linger(0.04, full, rec.batch_bytes // 4) == 0.01
    store.close()


def test_the_maximum_is_a_knob_and_never_below_the_linger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHARD_DB_LINGER_MAX_S", "0")  # no growth
    rec, store = _recorder(tmp_path)
    assert rec._next_linger(0.01, 100) == 0.01
    store.close()
    monkeypatch.setenv("ORCHARD_DB_LINGER_S", "0.002")
    monkeypatch.setenv("ORCHARD_DB_LINGER_MAX_S", "0.007")
    rec, store = _recorder(tmp_path)
    assert [rec._next_linger(x, 20) for x in (0.002, 0.004, 0.007)] == [0.004, 0.007, 0.007]
    store.close()


def test_a_call_a_client_waits_on_ends_the_linger_and_others_do_not() -> None:
    import threading
    import time

    from orchard_rec.proxy.dbthread import STOP
    from orchard_rec.proxy.handoff import Handoff

    q = Handoff()
    q.poll = 0.01
    q._asleep = False  # the database thread is at work on a batch (``get`` returned one)

    def took(put: object, linger: float) -> float:
        t = threading.Timer(0.05, q.put_nowait, (put,))
        t.start()
        t0 = time.monotonic()
        q.linger(linger)
        t.join()
        return time.monotonic() - t0

    assert took(([], 0, 1, [], 0, None, 0.0), 0.3) >= 0.3  # a plain call joins the batch later
    assert took(([], 1, 2, [lambda: None], 0, None, 0.0), 2.0) < 1.0  # ``committed``: at once
    assert took(STOP, 2.0) < 1.0
    assert q.qsize() == 3
