"""Issue 37, items 2 and 3 at the storage layer, SQLite and PostgreSQL: an outcome change merges
into what is stored, clearing is explicit, an empty change and non-finite numbers are refused,
and a bad row already stored is read (one warning naming the session), not a crash.

On main before the fix: ``set_outcome`` replaced the whole outcome, ``nan`` was stored as
``null`` and every later read of the session raised ``TypeError: float() argument must be ...
'NoneType'`` (``_summary``), on both databases.
"""

from __future__ import annotations

import logging

import pytest
from factories import call
from sqlalchemy import text

from orchard_rec.records import Outcome
from orchard_rec.storage import Store
from orchard_rec.storage.outcome import InvalidOutcome, OutcomeChange, change_from_json


@pytest.fixture
def store(db_url: str):  # type: ignore[no-untyped-def]
    s = Store(db_url)
    s.upgrade()
    s.write_batch([call("run", prompt_ids=[1], completion_ids=[2])])
    yield s
    s.close()


def test_fields_merge_and_clearing_is_explicit(store: Store) -> None:
    store.update_outcome("run", OutcomeChange({"status": "completed", "metadata": {"task": "t1"}}))
    merged = store.update_outcome("run", OutcomeChange({"reward": 0.3}))
    assert merged == Outcome(reward=0.3, status="completed", metadata={"task": "t1"})
    store.update_outcome("run", OutcomeChange({"metadata": {"reviewer": "bob"}}))
    o = store.session("run").outcome  # type: ignore[union-attr]
    assert o == Outcome(reward=0.3, status="completed", metadata={"task": "t1", "reviewer": "bob"})
    store.update_outcome("run", OutcomeChange(clear=frozenset({"reward", "metadata.reviewer"})))
    assert store.session("run").outcome == Outcome(status="completed", metadata={"task": "t1"})  # type: ignore[union-attr]
    store.update_outcome("run", OutcomeChange({"step_values": (0.5, 1)}, frozenset({"all"})))
    assert store.session("run").outcome == Outcome(step_values=(0.5, 1.0))  # type: ignore[union-attr]


def test_http_body_null_clears(store: Store) -> None:
    store.update_outcome("run", change_from_json({"reward": 1, "metadata": {"task": "t1", "n": 2}}))
    store.update_outcome("run", change_from_json({"status": "failed", "metadata": {"n": None}}))
    assert store.session("run").outcome == Outcome(reward=1, status="failed", metadata={"task": "t1"})  # type: ignore[union-attr]
    store.update_outcome("run", change_from_json({"reward": None}))
    assert store.session("run").outcome.reward is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"create": True},
        {"metadata": {}},
        {"reward": float("nan")},
        {"reward": float("inf")},
        {"reward": {"tests": float("nan")}},
        {"reward": True},
        {"step_values": [1, float("nan"), 2]},
        {"step_values": "1,2"},
        {"status": "great"},
        {"metadata": [1]},
        {"rewards": 1},
    ],
)
def test_refused_changes_store_nothing(store: Store, body: dict) -> None:  # type: ignore[type-arg]
    store.update_outcome("run", OutcomeChange({"reward": 1}))
    with pytest.raises(InvalidOutcome):
        store.update_outcome("run", change_from_json(body))
    assert store.session("run").outcome == Outcome(reward=1)  # type: ignore[union-attr]


def test_set_outcome_refuses_non_finite(store: Store) -> None:
    with pytest.raises(InvalidOutcome):
        store.set_outcome("run", Outcome(reward=1, step_values=(1.0, float("nan"))))
    assert store.session("run").outcome is None  # type: ignore[union-attr]


def test_a_bad_row_already_stored_is_read_with_one_warning(
    store: Store, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What main stored for ``--step-values 1,nan,2`` and ``--reward-json '{"a": NaN}'``."""
    store.write_batch([call("good", prompt_ids=[1], completion_ids=[2])])
    store.update_outcome("good", OutcomeChange({"reward": 1}))
    store.update_outcome("run", OutcomeChange({"reward": 1}))
    with store.engine.begin() as con:
        con.execute(
            text(
                "UPDATE sessions SET step_values = :s, reward = :r WHERE id = 'run'"
                if store.dialect == "sqlite"
                else "UPDATE sessions SET step_values = CAST(:s AS json), reward = CAST(:r AS json) WHERE id = 'run'"
            ),
            {"s": "[1.0, null, 2.0]", "r": '{"a": null, "b": 1}'},
        )
    with caplog.at_level(logging.WARNING):
        sessions = {s.id: s for s in store.sessions()}
        store.sessions()
    assert sessions["run"].outcome == Outcome(reward={"b": 1})
    assert sessions["good"].outcome == Outcome(reward=1)
    warnings = [r.getMessage() for r in caplog.records if "stored outcome" in r.getMessage()]
    assert len(warnings) <= 1 and all("'run'" in w for w in warnings)
    # a later change repairs the row
    store.update_outcome("run", OutcomeChange({"status": "completed"}))
    with store.engine.connect() as con:
        steps = con.execute(text("SELECT step_values FROM sessions WHERE id = 'run'")).scalar()
    assert steps in (None, "null")
