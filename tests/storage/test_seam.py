"""``Store`` is the record seam's sink and source (``storage.seam``); mypy checks the signatures
(``seam._store_is_both``), this checks it at run time on a real SQLite store, and that a reader
typed ``RecordSource`` reads what a writer typed ``RecordSink`` wrote."""

from __future__ import annotations

from pathlib import Path

from orchard_rec.records import Outcome
from orchard_rec.storage import RecordSink, RecordSource, Store
from orchard_rec.storage.outcome import OutcomeChange
from tests.factories import call


def _write(sink: RecordSink) -> None:
    assert sink.write_batch([call("s1", seq=0)]) == 1
    sink.update_outcome("s1", OutcomeChange(set={"reward": 1.0}))


def _read(source: RecordSource) -> tuple[int, Outcome | None]:
    summary = source.session("s1")
    return len(source.calls("s1")), None if summary is None else summary.outcome


def test_the_store_is_a_record_sink_and_source(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'o.db'}")
    try:
        store.upgrade()
        assert isinstance(store, RecordSink) and isinstance(store, RecordSource)
        _write(store)
        n, outcome = _read(store)
        assert n == 1 and outcome is not None and outcome.reward == 1.0
    finally:
        store.close()
