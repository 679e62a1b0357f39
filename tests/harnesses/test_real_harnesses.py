"""The real harness CLIs through the proxy (token mode) against the fake vLLM upstream.

Each runs once, non-interactively, in a private home, on a task that makes it call its
shell tool (write a marker file) and then answer. Asserted: exit 0, the tool really ran,
every call is recorded in the one session, the outcome (exit status, duration) is
recorded, and the session reconstructs with invariants 1-4 into one sample with the
harness's recommended mismatch policy. The CLIs are installed (pinned) from the npm
registry into the cache folder on first use; the test run does it before the first test (tests/prereqs.py).
"""

from __future__ import annotations

import pytest
from factories import MARKER_TASK, check_invariants, check_plain_url_run, check_steps, run_marker_task

from orchard_rec.harnesses import CLAUDE_CODE, CODEX, OPENCLAW, install
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("harness", [CODEX, CLAUDE_CODE, OPENCLAW], ids=lambda h: h.name)
def test_real_harness_completes_a_tool_task_through_the_proxy(
    harness, upstream, proxy_factory, sqlite_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    install(harness)
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    sid = f"{harness.name}-run"
    res = run_marker_task(harness, proxy, sid, tmp_path)
    assert (res.workdir / "marker.txt").read_text().strip() == "orchard"  # the tool really ran
    store = proxy.store()
    calls = store.calls(sid)
    assert store.count_calls() == len(calls) >= 2  # every call of the run is in this one session
    assert all(c.outcome is CallOutcome.OK and c.harness == harness.name and c.harness_session for c in calls)
    assert store.session(sid).harness == harness.name  # type: ignore[union-attr]
    assert [c.seq for c in calls] == list(range(1, len(calls) + 1))
    outcome = store.session(sid).outcome  # type: ignore[union-attr]
    assert (
        outcome.status == "completed"
        and outcome.metadata["exit_code"] == 0
        and outcome.metadata["duration_s"] > 0
    )
    for policy in ("split", harness.on_mismatch):
        check_invariants(calls, reconstruct_session(calls, on_mismatch=policy))
    [sample] = reconstruct_session(calls, on_mismatch=harness.on_mismatch)  # the run is one sample
    check_steps(store, sid)
    assert len(sample.turns) == len(calls)
    if harness.on_mismatch == "split":  # (3): its prompts extend each other exactly
        assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
    # again with the plain base URL: the harness's own session id names one new session
    other = check_plain_url_run(harness, proxy, store, sid, tmp_path)
    assert other[0].session_id.startswith(f"h-{harness.name}-")  # type: ignore[union-attr]


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("harness", [CODEX, CLAUDE_CODE, OPENCLAW], ids=lambda h: h.name)
def test_orchard_rec_run_starts_a_proxy_and_prints_the_session(harness, upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from orchard_rec.cli import app
    from orchard_rec.storage import Store

    install(harness)
    db = f"sqlite:///{tmp_path / 'run.db'}"
    r = CliRunner().invoke(
        app,
        [
            "run",
            harness.name,
            "--upstream",
            upstream.url,
            "--db",
            db,
            "--session",
            "cli-run",
            "--model",
            "fake-model",
            "--workdir",
            str(tmp_path / "w"),
            "--",
            MARKER_TASK,
        ],
    )
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1] == "cli-run"
    store = Store(db)
    assert len(store.calls("cli-run")) >= 2
    assert store.session("cli-run").harness == harness.name  # type: ignore[union-attr]
    assert store.session("cli-run").outcome.metadata["harness"] == harness.name  # type: ignore[union-attr]


def test_harness_config_snippets() -> None:
    from typer.testing import CliRunner

    from orchard_rec.cli import app

    out = (
        CliRunner()
        .invoke(app, ["harness", "config", "codex", "--base-url", "http://127.0.0.1:8100", "--session", "s1"])
        .output
    )
    assert 'base_url = "http://127.0.0.1:8100/s/s1/v1"' in out and 'wire_api = "responses"' in out
    out = CliRunner().invoke(app, ["harness", "config", "claude-code", "--session", "s1"]).output
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:8100/s/s1\n" in out
    out = CliRunner().invoke(app, ["harness", "config", "openclaw", "--session", "s1"]).output
    assert '"baseUrl": "http://127.0.0.1:8100/s/s1/v1"' in out and '"api": "openai-completions"' in out
    r = CliRunner().invoke(app, ["harness", "config", "nope"])
    assert r.exit_code != 0 and "unknown harness 'nope'" in r.output


@pytest.mark.harness
@pytest.mark.slow
def test_codex_through_tito_is_one_exact_sample(
    upstream_factory, proxy_factory, sqlite_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    install(CODEX)
    up = upstream_factory(drift=True)
    proxy = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo")
    res = run_marker_task(CODEX, proxy, "codex-tito", tmp_path)
    assert (res.workdir / "marker.txt").read_text().strip() == "orchard"
    calls = proxy.store().calls("codex-tito")
    assert len(calls) >= 2 and [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * (
        len(calls) - 1
    )
    assert all(
        c.upstream_request["prompt"] == list(c.prompt_ids) for c in calls
    )  # ids, not text, went upstream
    [sample] = reconstruct_session(calls)
    assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
    check_invariants(calls, [sample])
