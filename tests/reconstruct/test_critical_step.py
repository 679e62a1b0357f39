"""critical-step credit: train before the mistake the run never recovers from."""

from __future__ import annotations

from factories import call

from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.reconstruct.credit import CriticalStepCredit, critical_step
from orchard_rec.records import Outcome

EOT = 9


def _four_turns():  # type: ignore[no-untyped-def]
    p1 = [101]
    p2 = p1 + [201, EOT, 301]
    p3 = p2 + [202, EOT, 302]
    p4 = p3 + [203, EOT, 303]
    lp = [-0.1, -0.1]
    return [
        call("s", prompt_ids=p, completion_ids=[c, EOT], logprobs=lp)
        for p, c in ((p1, 201), (p2, 202), (p3, 203), (p4, 204))
    ]


def test_critical_step_rule() -> None:
    assert critical_step([0.2, 0.5, 0.1, 0.3]) == 2  # falls below 0.5 at step 2, never back
    assert critical_step([0.2, 0.5, 0.1, 0.6]) is None  # recovers
    assert critical_step([0.5, 0.1, 0.6, 0.2, 0.1]) == 3  # the first dip recovers; the second does not
    assert critical_step([-0.1, -0.2]) == 0  # below the baseline from the start
    assert critical_step([]) is None


def test_masks_turns_from_the_critical_step() -> None:
    [s] = reconstruct_session(
        _four_turns(), credit=CriticalStepCredit(), outcome=Outcome(step_values=(0.2, 0.5, 0.1, 0.3))
    )
    # response: 201 9 | 301 | 202 9 | 302 | 203 9 | 303 | 204 9  -> turns 0,1 trained; 2,3 not
    assert s.loss_mask == [1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    assert s.metadata["critical_step"] == 2


def test_resolved_runs_train_everything_and_unvalued_failures_nothing() -> None:
    [s] = reconstruct_session(
        _four_turns(),
        credit=CriticalStepCredit(),
        outcome=Outcome(reward=0.0, step_values=(0.2, 0.5, 0.1, 0.3), metadata={"resolved": True}),
    )
    assert s.loss_mask == [1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1]
    [s] = reconstruct_session(_four_turns(), credit=CriticalStepCredit(), outcome=Outcome(reward=1.0))
    assert sum(s.loss_mask) == 8
    [s] = reconstruct_session(_four_turns(), credit=CriticalStepCredit(), outcome=Outcome(reward=0.0))
    assert sum(s.loss_mask) == 0 and s.metadata["credit"] == "critical-step:no-step-values"


def test_the_cli_accepts_critical_step_credit(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """export, show, ui and train sft take ``--credit critical-step`` (issue 41 item 6)."""
    import orjson
    from typer.testing import CliRunner

    from orchard_rec.cli import app
    from orchard_rec.storage import Store

    url = f"sqlite:///{tmp_path / 'rec.db'}"
    store = Store(url)
    store.upgrade()
    store.write_batch(_four_turns())
    store.set_outcome("s", Outcome(reward=0.0, status="completed", step_values=(0.2, 0.5, 0.1, 0.3)))
    store.close()
    runner = CliRunner()
    out = tmp_path / "o.jsonl"
    r = runner.invoke(
        app, ["export", "--db", url, "--format", "jsonl", "--out", str(out), "--credit", "critical-step"]
    )
    assert r.exit_code == 0, r.output
    row = orjson.loads(out.read_text().splitlines()[0])
    assert row["metadata"]["critical_step"] == 2
    r = runner.invoke(app, ["show", "s", "--db", url, "--credit", "critical-step"])
    assert r.exit_code == 0, r.output
    for cmd in (["ui"], ["train", "sft"]):  # parsing only: a bad choice fails before anything runs
        bad = runner.invoke(app, [*cmd, "--db", url, "--credit", "nope"])
        good = runner.invoke(app, [*cmd, "--db", str(tmp_path / "missing.db"), "--credit", "critical-step"])
        assert "--credit" in bad.output and "--credit" not in good.output, good.output
