"""The viewer's SQL on SQLite and PostgreSQL (no browser): filters by outcome metadata, model
and error; task groups and their selection."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import MultiDict

from orchard_rec.ui import open_store
from orchard_rec.ui.data import SessionFilter, list_sessions
from orchard_rec.ui.groups import group_list, group_view

from . import rldata


def _ids(store: Any, **q: Any) -> list[str]:
    md: MultiDict[str] = MultiDict()
    for k, v in q.items():
        for x in v if isinstance(v, list) else [v]:
            md.add(k, x)
    md.add("sort", "id")
    md.add("order", "asc")
    return [r.id for r in list_sessions(store, SessionFilter.from_query(md)).rows]


def test_filters_by_outcome_metadata_model_and_error(db_url: str) -> None:
    rldata.build(db_url)
    store = open_store(db_url)
    try:
        assert _ids(store, meta="task=fix-bug") == [f"fix-bug-{k}" for k in range(4)]
        # a list holding the value matches; numbers compare as their text; several are ANDed
        assert _ids(store, meta="tags=hard") == ["add-test-1", "fix-bug-1", "refactor-1"]
        assert _ids(store, meta=["tags=hard", "task=refactor"]) == ["refactor-1"]
        assert _ids(store, meta="tries=2") == ["add-test-2", "fix-bug-2"]
        assert _ids(store, meta="tags") == ["add-test-1", "fix-bug-1", "refactor-1"]  # present
        assert _ids(store, meta="task=nope") == []
        assert _ids(store, meta="task") == sorted(
            f"{t}-{k}" for t, a in rldata.TASKS.items() for k in range(len(a))
        )
        assert _ids(store, errors="1") == ["bad-request"]
        assert _ids(store, model="other-model") == ["bad-request"]
        assert _ids(store, model="qwen-tiny", meta="task=refactor") == ["refactor-0", "refactor-1"]
        assert list_sessions(store, SessionFilter(), with_harnesses=True).models == [
            "other-model",
            "qwen-tiny",
        ]
    finally:
        store.close()


def test_groups_and_their_selection(db_url: str) -> None:
    rldata.build(db_url)
    store = open_store(db_url)
    try:
        groups = group_list(store, "task")
        assert [(g["value"], g["attempts"], g["passed"]) for g in groups] == [
            ("fix-bug", 4, 2),
            ("add-test", 3, 0),
            ("refactor", 2, 2),
        ]
        assert [g["value"] for g in group_list(store, "tries")] == ["0", "1", "2", "3"]
        g = group_view(store, "task", "refactor", select_=(1, 0.0, 1.0), filters=["positive-only"])
        assert g.pass_rate == 1.0 and g.mean == pytest.approx(0.75)
        assert [a.kept for a in g.attempts] == [True, False]
        g = group_view(store, "task", "fix-bug", filters=["no-aborted"])
        assert all(a.kept for a in g.attempts) and g.dropped_by is None
    finally:
        store.close()


SEARCHES = {
    "zanzibar1": ["add-test-1", "fix-bug-1", "refactor-1"],  # a word of a tool result
    "src fix-bug-0.py": ["fix-bug-0", "fix-bug-2"],  # a tool call's arguments
    "Summary modules": ["compacted"],  # a user message, all words
    "Hello there": ["streamed"],  # a streamed answer
    "too large": ["bad-request"],  # an upstream's error body
    "careful coding": sorted(
        [f"{t}-{k}" for t, a in rldata.TASKS.items() for k in range(len(a))] + ["compacted"]
    ),
    "SECRET": [],  # a request field outside the conversation is not indexed
    "nonexistentword": [],
}


def test_search_inside_conversations(db_url: str) -> None:
    rldata.build(db_url)
    store = open_store(db_url)
    try:
        for q, expect in SEARCHES.items():
            assert _ids(store, q=q) == expect, q
        assert _ids(store, q="fix-bug-3") == ["fix-bug-3"]  # ids still match as before
    finally:
        store.close()


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_the_migration_indexes_what_was_recorded_before(db_url: str) -> None:
    from orchard_rec.storage import Store, migrate

    migrate.upgrade(db_url, "0008")
    rldata.build(db_url, upgrade=False)  # written without the index
    migrate.upgrade(db_url)
    migrate.check(db_url)
    store = open_store(db_url)
    try:
        for q, expect in SEARCHES.items():
            assert _ids(store, q=q) == expect, q
    finally:
        store.close()
    # and the writer keeps it up to date after the upgrade
    w = Store(db_url)
    w.write_batch(rldata.attempt_calls("later", 7, 0.0))
    w.close()
    store = open_store(db_url)
    try:
        assert _ids(store, q="zanzibar7") == ["later-7"]
    finally:
        store.close()
