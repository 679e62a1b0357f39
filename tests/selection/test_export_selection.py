"""Recipe selection in ``export``: BAR, dynamic-sampling filters, reward keys, on SDK-recorded
sessions (tests/conftest.py ``recorded_db``: tasks t0 = sess-0/3 rewards 1/1, t1 = sess-1/4
rewards 0/0, t2 = sess-2/5 rewards 1/0)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.exporters import read_jsonl
from orchard_rec.records import Outcome
from orchard_rec.storage import Store

pytestmark = (
    pytest.mark.slow
)  # the session-scoped recorded_db fixture records sessions through a real proxy (~70 s on a loaded machine)

runner = CliRunner()


def _export(db: str, out: Path, *args: str) -> tuple[list, str]:  # type: ignore[type-arg]
    r = runner.invoke(app, ["export", "--db", db, "--out", str(out), "--group-by", "task", *args])
    assert r.exit_code == 0, r.output
    return list(read_jsonl(out)), r.output


def test_bar_chooses_n_attempts_per_group(recorded_db: str, tmp_path: Path) -> None:
    rows, _ = _export(recorded_db, tmp_path / "a.jsonl", "--select", "bar:1:1:1")
    by_group = {}
    for s in rows:
        by_group.setdefault(s.group_index, set()).add(s.session_id)
    assert by_group == {0: {"sess-0"}, 1: {"sess-1"}, 2: {"sess-2"}}
    rows, out = _export(recorded_db, tmp_path / "b.jsonl", "--select", "bar:2:0.5:0.5")
    assert {s.session_id for s in rows} == {f"sess-{k}" for k in range(6)}
    assert "BAR relaxed 2, window 1" in out
    # a stride of 1: the window is tried on the first attempt, then the first two (the fork's
    # n_samples_per_prompt_stride); t2 = sess-2 (1), sess-5 (0) meets 1:1 only with both
    rows, out = _export(recorded_db, tmp_path / "c.jsonl", "--select", "bar:2:0.5:0.5:1")
    assert {s.session_id for s in rows} == {f"sess-{k}" for k in range(6)}
    assert "BAR relaxed 2, window 1" in out


def test_filters_drop_groups_and_mark_samples(recorded_db: str, tmp_path: Path) -> None:
    rows, out = _export(recorded_db, tmp_path / "f.jsonl", "--filter", "nonzero-std")
    assert {s.session_id for s in rows} == {"sess-2", "sess-5"}
    assert {s.group_index for s in rows} == {0}
    assert "1 of 3 groups kept" in out and "nonzero-std dropped 2" in out
    rows, out = _export(
        recorded_db, tmp_path / "p.jsonl", "--filter", "nonzero-std", "--filter", "positive-only"
    )
    for s in rows:
        if s.session_id == "sess-5":
            assert s.metadata["remove_sample"] is True and sum(s.loss_mask) == 0
        else:
            assert "remove_sample" not in s.metadata and sum(s.loss_mask) > 0
    assert "samples marked remove_sample" in out
    # the Orchard-SWE recipe's filter: no-aborted, nonzero-std, then at least one positive
    rows, out = _export(
        recorded_db,
        tmp_path / "h.jsonl",
        "--filter",
        "no-aborted",
        "--filter",
        "nonzero-std",
        "--filter",
        "has-positive",
    )
    assert {s.session_id for s in rows} == {"sess-2", "sess-5"} and "1 of 3 groups kept" in out


def test_reward_key_picks_process_reward(recorded_db: str, tmp_path: Path) -> None:
    db_file = tmp_path / "o.db"
    shutil.copy(recorded_db.removeprefix("sqlite:///"), db_file)
    db = f"sqlite:///{db_file}"
    store = Store(db)
    s0 = store.session("sess-0")
    assert s0 is not None and s0.outcome is not None
    meta = {**s0.outcome.metadata, "process_reward": {"total": 7.5}, "grade": 0.25}
    store.set_outcome("sess-0", Outcome(reward=s0.outcome.reward, status="completed", metadata=meta))
    store.close()
    rows, _ = _export(db, tmp_path / "r.jsonl", "--session", "sess-0", "--reward-key", "process")
    assert rows and all(s.reward == 7.5 for s in rows)
    rows, _ = _export(db, tmp_path / "g.jsonl", "--session", "sess-0", "--reward-key", "grade")
    assert all(s.reward == 0.25 for s in rows)


def test_selection_usage_errors(recorded_db: str, tmp_path: Path) -> None:
    out = str(tmp_path / "x.jsonl")
    for args, msg in [
        (["--select", "bar:2:0.5"], "--select takes bar:N:LO:HI"),
        (["--select", "bar:0:0:1", "--group-by", "task"], "N >= 1"),
        (["--filter", "nope", "--group-by", "task"], "is not a filter"),
        (["--filter", "nonzero-std"], "need --group-by"),
        (["--select", "bar:2:0:1:0", "--group-by", "task"], "STRIDE >= 1"),
        (["--processor", "demo"], "--processor is for --format slime"),
    ]:
        r = runner.invoke(app, ["export", "--db", recorded_db, "--out", out, *args])
        assert r.exit_code == 2 and msg in r.output, (args, r.output)


def test_slime_and_sft_read_back_the_selection(recorded_db: str, tmp_path: Path) -> None:
    import torch

    from orchard_rec.exporters.contracts import SlimeSample

    r = runner.invoke(
        app,
        [
            "export",
            "--db",
            recorded_db,
            "--format",
            "slime",
            "--out",
            str(tmp_path / "r.pt"),
            "--group-by",
            "task",
            "--filter",
            "nonzero-std",
            "--filter",
            "positive-only",
        ],
    )
    assert r.exit_code == 0, r.output
    loaded = [SlimeSample.from_dict(d) for d in torch.load(tmp_path / "r.pt", weights_only=False)["samples"]]
    assert {s.session_id for s in loaded} == {"sess-2", "sess-5"}
    for s in loaded:
        assert s.remove_sample == (s.session_id == "sess-5")
        assert (sum(s.loss_mask or []) == 0) == (s.session_id == "sess-5")
