"""``Selection``, the one value every reader of samples hands to ``pipeline.iter_samples``
(issue 36): every ``export`` option that chooses samples lands in it, it checks itself, it is
frozen and hashable, and ``iter_samples`` gives the same samples from it as from keywords."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.errors import UsageError
from orchard_rec.exporters.base import ExportStats
from orchard_rec.pipeline import Reconstruction, SampleFilter, iter_samples, select_batches
from orchard_rec.policy import Staleness
from orchard_rec.reconstruct import credit_policy
from orchard_rec.records import Outcome
from orchard_rec.selection import Selection
from orchard_rec.trainers.slime import rollout_selection
from tests.factories import two_session_store

runner = CliRunner()
export_cli = importlib.import_module(
    "orchard_rec.cli.export"
)  # the package re-exports the command as ``export``

EXPORT_ARGS = [
    "--session", "alpha", "--session", "beta",
    "--since", "2024-01-02T03:04:05",
    "--harness", "codex",
    "--on-mismatch", "realign",
    "--credit", "last-turn",
    "--aborted", "keep",
    "--group-by", "task",
    "--pass-rate", "0.25:0.75",
    "--select", "bar:2:0.25:0.75:2",
    "--filter", "nonzero-std", "--filter", "pass-rate",
    "--seed", "7",
    "--status", "completed", "--status", "truncated",
    "--min-reward", "0.5",
    "--reward-key", "score",
    "--no-auxiliary",
    "--require-teacher",
    "--policy-version", "12", "--max-staleness", "2", "--min-policy-version", "9",
    "--stale", "mask",
]  # fmt: skip

EXPECTED = Selection(
    sessions=("alpha", "beta"),
    since=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp(),
    harness="codex",
    on_mismatch="realign",
    credit="last-turn",
    aborted="keep",
    group_by="task",
    pass_rate=(0.25, 0.75),
    select=(2, 0.25, 0.75, 2),
    filters=("nonzero-std", "pass-rate"),
    seed=7,
    statuses=("completed", "truncated"),
    min_reward=0.5,
    reward_key="score",
    auxiliary=False,
    require_teacher=True,
    staleness=Staleness(12, 2, 9),
    stale="mask",
)

NOT_FROM_EXPORT = {"pass_threshold", "image_token"}
"""Selection fields no ``export`` option sets (the viewer sets ``image_token``)."""

EXPORT_OPTION_FIELD = {
    "session": "sessions",
    "status": "statuses",
    "policy_version": "staleness",
    "max_staleness": "staleness",
    "min_policy_version": "staleness",
}
"""``export`` parameters whose Selection field has another name."""

EXPORT_NOT_SELECTION = {
    "fmt", "out_arg", "db", "tokenizer", "rollout_size", "processor", "list_formats",
    "storage_options", "engine", "ray_address", "force",
}  # fmt: skip
"""``export`` parameters that say where and how to write, not which samples."""


def _capture_export(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``export``'s writer replaced by one that keeps its keywords; the session count stubbed
    (the selection names sessions no database here holds)."""
    seen: list[dict[str, Any]] = []

    def fake_export(db: str, fmt: str, out: Path, **kw: Any) -> ExportStats:
        seen.append(kw)
        return ExportStats(samples=1, tokens=2, files=[out])

    monkeypatch.setattr("orchard_rec.exporters.pipeline.export", fake_export)
    monkeypatch.setattr(export_cli, "_select_sessions", lambda db, selection: 2)
    return seen


def test_every_export_option_that_selects_lands_in_the_selection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen = _capture_export(monkeypatch)
    db = f"sqlite:///{tmp_path / 'o.db'}"
    r = runner.invoke(app, ["export", "--db", db, "--out", str(tmp_path / "s.jsonl"), *EXPORT_ARGS])
    assert r.exit_code == 0, r.output
    [kw] = seen
    assert kw["selection"] == EXPECTED
    # one object: nothing of the selection travels beside it
    assert not {f.name for f in dataclasses.fields(Selection)} & set(kw)
    # every field an export option can set was set to something other than its default
    default = Selection()
    changed = {
        f.name for f in dataclasses.fields(Selection) if getattr(EXPECTED, f.name) != getattr(default, f.name)
    }
    assert changed == {f.name for f in dataclasses.fields(Selection)} - NOT_FROM_EXPORT


def test_every_export_parameter_is_a_selection_field_or_says_where_to_write() -> None:
    fields = {f.name for f in dataclasses.fields(Selection)}
    for name in inspect.signature(export_cli.export).parameters:
        if name in EXPORT_NOT_SELECTION:
            continue
        assert EXPORT_OPTION_FIELD.get(name, name) in fields, f"export --{name}: not in Selection"


def test_export_defaults_make_the_default_selection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _capture_export(monkeypatch)
    db = f"sqlite:///{tmp_path / 'o.db'}"
    r = runner.invoke(app, ["export", "--db", db, "--out", str(tmp_path / "s.jsonl")])
    assert r.exit_code == 0, r.output
    # the CLI's defaults (split, assistant) are what iter_samples assumes without them
    assert seen[0]["selection"] == Selection(on_mismatch="split", credit="assistant")


def test_it_checks_itself_and_names_the_option() -> None:
    with pytest.raises(UsageError, match="--aborted is keep or drop"):
        Selection(aborted="maybe")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="--stale is drop or mask"):
        Selection(stale="hide")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="--pass-rate needs --group-by"):
        Selection(pass_rate=(0.2, 0.8))
    for bad in ({"select": (2, 0.0, 1.0)}, {"filters": ["nonzero-std"]}):
        with pytest.raises(UsageError, match="--select and --filter need --group-by"):
            Selection(**bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="--pass-rate needs --group-by"):
        Selection(group_by="task", pass_rate=(0.2, 0.8)).replace(group_by=None)
    with pytest.raises(TypeError):
        Selection.of(session=["a"])  # not a field: a mistake, as an unknown keyword is


def test_it_is_frozen_hashable_and_stores_tuples() -> None:
    sel = Selection(sessions=["a", "b"], statuses=["completed"], group_by="t", filters=["nonzero-std"])
    assert sel.sessions == ("a", "b") and sel.statuses == ("completed",) and sel.filters == ("nonzero-std",)
    assert hash(sel) == hash(
        Selection(sessions=("a", "b"), statuses=("completed",), group_by="t", filters=("nonzero-std",))
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        sel.sessions = ("c",)  # type: ignore[misc]
    assert Selection(staleness=Staleness()).staleness is None  # no bound: nothing is stale
    assert Selection(staleness=Staleness(minimum=3)).staleness == Staleness(minimum=3)


def test_of_and_take_split_keywords() -> None:
    base = Selection(sessions=["a"])
    assert Selection.of() == Selection()
    assert Selection.of(base) is base
    assert Selection.of(base, harness="codex") == Selection(sessions=("a",), harness="codex")
    sel, rest = Selection.take(base, {"group_by": "task", "tokenizer": "tok", "on_session": print})
    assert sel == Selection(sessions=("a",), group_by="task") and rest == {
        "tokenizer": "tok",
        "on_session": print,
    }


def test_recorded_is_json_safe() -> None:
    sel = Selection(
        sessions=["a"],
        credit=credit_policy("last-turn"),
        on_mismatch="realign",
        group_by="task",
        select=(2, 0.0, 1.0),
        staleness=Staleness(5, 1),
    )
    rec = sel.recorded()
    assert orjson.loads(orjson.dumps(rec)) == rec
    assert rec["sessions"] == ["a"] and rec["credit"] == "last-turn" and rec["on_mismatch"] == "realign"
    assert rec["staleness"] == {"current": 5, "max_staleness": 1, "minimum": None}
    assert "since" not in rec  # unset fields are left out


def _store(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = two_session_store(f"sqlite:///{tmp_path / 's.db'}")
    store.set_outcome("alpha", Outcome(reward=1.0, metadata={"task": "t"}))
    store.set_outcome("beta", Outcome(reward=0.0, metadata={"task": "t"}))
    return store


def _rows(samples: Any) -> list[tuple[Any, ...]]:
    return [(s.session_id, s.index, s.group_index, s.tokens, s.loss_mask, s.reward) for s in samples]


def test_iter_samples_takes_a_selection_or_its_keywords(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        by_object = _rows(iter_samples(store, Selection(sessions=["beta"], group_by="task")))
        by_keywords = _rows(iter_samples(store, sessions=["beta"], group_by="task"))
        assert by_object == by_keywords == [("beta", 0, 0, [5, 6], [1], 0.0)]
        # keywords on top of a selection replace its fields
        both = _rows(iter_samples(store, Selection(sessions=["beta"]), sessions=["alpha"], min_reward=0.5))
        assert [r[0] for r in both] == ["alpha"]
        assert _rows(iter_samples(store, Selection(min_reward=2.0))) == []
    finally:
        store.close()


def test_the_stages_compose_into_iter_samples(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        sel = Selection(group_by="task", statuses=["completed"])
        rebuild, keep = Reconstruction(sel), SampleFilter(sel)
        staged = []
        for group_index, rows in select_batches(store, sel):
            for summary, calls in rows:
                staged += [
                    (summary.id, group_index, s.tokens) for s in rebuild(summary, calls) if keep(s, summary)
                ]
        assert staged == [(s.session_id, s.group_index, s.tokens) for s in iter_samples(store, sel)]
        assert [sid for sid, _, _ in staged] == ["alpha", "beta"]
    finally:
        store.close()


def test_the_slime_rollout_builds_its_selection_from_args() -> None:
    args = SimpleNamespace(
        orchard_group_by="task",
        orchard_on_mismatch="realign",
        orchard_credit="last-turn",
        orchard_aborted="keep",
        orchard_policy_version="12",
        orchard_max_staleness=2,
        orchard_min_policy_version=None,
        orchard_stale="mask",
    )
    assert rollout_selection(args) == Selection(
        group_by="task",
        on_mismatch="realign",
        credit="last-turn",
        aborted="keep",
        staleness=Staleness(12, 2),
        stale="mask",
    )
    assert rollout_selection(SimpleNamespace()) == Selection(group_by="session", credit="assistant")
