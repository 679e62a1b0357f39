"""``orchard-rec steps`` and ``orchard-rec reward`` on sessions recorded through the proxy by the
real openai / anthropic SDK agents (chat, Responses, Messages)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import copy_db
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.records import Outcome
from orchard_rec.storage import Store

pytestmark = (
    pytest.mark.slow
)  # the session-scoped recorded_db fixture records sessions through a real proxy (~70 s on a loaded machine)

runner = CliRunner()
COMMANDS = ["echo one", "echo two", "echo three"]  # what tests/e2e/agents.py asks for, in order


def test_steps_equal_what_each_sdk_agent_did(recorded_db: str) -> None:
    for sid in ("sess-0", "sess-1", "sess-2"):  # chat, responses, messages
        r = runner.invoke(app, ["steps", sid, "--json", "--db", recorded_db])
        assert r.exit_code == 0, r.output
        got = json.loads(r.output)
        assert [s["command"] for s in got] == COMMANDS, (sid, got)
        assert [s["output"] for s in got] == [f"ran {c}: ok" for c in COMMANDS]
        assert all(s["kind"] == "shell" and not s["failed"] for s in got)
        assert [s["turn"] for s in got] == [0, 1, 3]  # turn 2 answers the first user turn
    r = runner.invoke(app, ["steps", "sess-0", "--db", recorded_db])
    assert r.exit_code == 0 and "echo three" in r.output
    r = runner.invoke(app, ["steps", "nosuch", "--db", recorded_db])
    assert r.exit_code == 1 and "no session 'nosuch'" in r.output


def test_reward_stores_components_and_step_values(recorded_db: str, tmp_path: Path) -> None:
    db = copy_db(recorded_db, tmp_path)
    store = Store(db)
    gold = {"task": "t0", "resolved": True, "patch": "diff --git a/a.py b/a.py\n"}
    store.set_outcome("sess-0", Outcome(reward=1.0, status="completed", metadata=gold))
    store.close()
    r = runner.invoke(app, ["reward", "--rules", "swe", "--session", "sess-0", "--dry-run", "--db", db])
    assert r.exit_code == 0, r.output
    assert Store(db).session("sess-0").outcome.metadata.get("process_reward") is None  # type: ignore[union-attr]
    r = runner.invoke(app, ["reward", "--rules", "swe", "--session", "sess-0", "--db", db])
    assert r.exit_code == 0, r.output
    out = Store(db).session("sess-0").outcome  # type: ignore[union-attr]
    assert out is not None and out.reward == 1.0 and out.metadata["task"] == "t0"
    pr = out.metadata["process_reward"]
    # resolved (f2p = p2p = 1), nothing localized, no read, no failures, no repeats
    assert pr["rules"] == "swe" and abs(pr["total"] - 10 * (1.0 + 0.5 + 0.2)) < 1e-9
    assert pr["components"]["integrity_gate"] == 1.0
    n_calls = len(Store(db).calls("sess-0"))
    assert out.step_values is not None and len(out.step_values) == n_calls == 5  # one per model call
    assert abs(out.step_values[-1] - pr["total"]) < 1e-9


def test_reward_usage_errors(recorded_db: str) -> None:
    r = runner.invoke(app, ["reward", "--rules", "nope", "--db", recorded_db, "--dry-run"])
    assert r.exit_code == 2 and "unknown rule set" in r.output
    r = runner.invoke(app, ["reward", "--weights", "{bad", "--db", recorded_db, "--dry-run"])
    assert r.exit_code == 2 and "--weights is not JSON" in r.output
    r = runner.invoke(app, ["reward", "--weights", '{"nope": 1}', "--db", recorded_db, "--dry-run"])
    assert r.exit_code == 2 and "unknown reward term" in r.output
