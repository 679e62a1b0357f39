"""The CLI, through Typer's CliRunner (the library functions are tested directly elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import call
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.storage import Store, migrate

runner = CliRunner()


def test_db_upgrade_and_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    r = runner.invoke(app, ["db", "current", "--db", url])
    assert r.exit_code == 0 and r.output.startswith("empty")
    r = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["db", "current", "--db", url])
    assert r.output.startswith(migrate.head())


def test_sessions_and_calls(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = Store(url)
    store.upgrade()
    store.write_batch([call("alpha", prompt_ids=[1, 2], completion_ids=[3]), call("alpha"), call("beta")])
    r = runner.invoke(app, ["sessions", "--db", url, "--json"])
    assert r.exit_code == 0
    assert {(s["id"], s["calls"]) for s in json.loads(r.output)} == {("alpha", 2), ("beta", 1)}
    r = runner.invoke(app, ["calls", "alpha", "--db", url, "--json"])
    rows = json.loads(r.output)
    assert (
        [c["seq"] for c in rows] == [1, 2]
        and rows[0]["prompt_tokens"] == 2
        and rows[0]["completion_tokens"] == 1
    )
    r = runner.invoke(app, ["calls", "nope", "--db", url])
    assert r.exit_code == 1 and "no session" in r.output
    r = runner.invoke(app, ["sessions", "--db", url])
    assert "alpha" in r.output and "beta" in r.output


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_env_vars_configure_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    r = runner.invoke(app, ["db", "upgrade"], env={"ORCHARD_DB": url})
    assert r.exit_code == 0 and (tmp_path / "env.db").exists()


@pytest.mark.slow  # demo upstream + proxy + the scripted agent + every export: ~30 s on a loaded machine
def test_demo_runs_the_whole_loop(tmp_path: Path) -> None:
    r = runner.invoke(app, ["demo", "--workdir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "marker.txt = 'orchard'" in r.output
    recs = Store(f"sqlite:///{tmp_path / 'orchard.db'}").calls("demo")
    assert len(recs) == 5 and [r.seq for r in recs] == [1, 2, 3, 4, 5]
    assert (
        "into 1 sample(s)" in r.output
        and (tmp_path / "samples.jsonl").exists()
        and (tmp_path / "rollout_0.pt").exists()
    )
    [row] = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert row["tokens"] == list(recs[-1].prompt_ids) + list(recs[-1].completion_ids) and row["reward"] == 1.0
