"""The real Gemini CLI (npm ``@google/gemini-cli``, pinned) through ``serve`` in token mode, offline.

Pointed at the proxy by ``GOOGLE_GEMINI_BASE_URL`` (plain http on loopback), it speaks Gemini's
``streamGenerateContent``; the proxy translates each call to chat completions for the demo
upstream and the answer back. Asserted, as for the other CLIs (``test_real_harnesses.py``): exit 0,
the shell tool really ran, every call recorded in the one session under the harness's name with its
outcome, the steps parsed from its traffic, and the run is one sample with exact ids (each prompt
extends the previous prompt and answer). Run again without a session in the URL, its calls are
grouped into one session of their own by their opening. The API key is stored nowhere.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from factories import check_invariants, check_plain_url_run, check_steps, run_marker_task

from orchard_rec.harnesses import GEMINI_CLI, install
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome


@pytest.mark.harness
@pytest.mark.slow
def test_gemini_cli_runs_through_serve_in_token_mode_as_one_exact_sample(
    upstream, proxy_factory, sqlite_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    install(GEMINI_CLI)
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    sid = "gemini-run"
    res = run_marker_task(GEMINI_CLI, proxy, sid, tmp_path)
    assert (res.workdir / "marker.txt").read_text().strip() == "orchard"  # the tool really ran
    store = proxy.store()
    calls = store.calls(sid)
    assert store.count_calls() == len(calls) >= 2
    assert all(
        c.outcome is CallOutcome.OK and c.harness == "gemini-cli" and c.dialect == "gemini" and c.stream
        for c in calls
    )
    assert all(c.model == "fake-model" and c.path.endswith(":streamGenerateContent?alt=sse") for c in calls)
    assert [c.seq for c in calls] == list(range(1, len(calls) + 1))
    assert all(b["model"] == "fake-model" and "messages" in b for _, b in upstream.fake.log)  # chat upstream
    outcome = store.session(sid).outcome  # type: ignore[union-attr]
    assert outcome.status == "completed" and outcome.metadata["exit_code"] == 0
    for a, b in itertools.pairwise(calls):  # exact ids: each prompt extends the previous prompt and answer
        head = list(a.prompt_ids) + list(a.completion_ids)
        assert list(b.prompt_ids)[: len(head)] == head
    [sample] = reconstruct_session(calls, on_mismatch=GEMINI_CLI.on_mismatch)  # one sample per run
    check_invariants(calls, [sample])
    assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
    assert len(sample.turns) == len(calls)
    check_steps(store, sid)
    # again with the plain base URL: one new session, named by the run's opening
    check_plain_url_run(GEMINI_CLI, proxy, store, sid, tmp_path)
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    for f in db.parent.glob(db.name + "*"):
        assert b"orchard-gemini-key" not in f.read_bytes()  # GEMINI_API_KEY, sent as x-goog-api-key


def test_gemini_cli_config_snippet() -> None:
    snippet = GEMINI_CLI.config_snippet("http://127.0.0.1:8100", "s1", "m")
    assert "GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8100/s/s1\n" in snippet and "-m m" in snippet
    assert '"selectedType": "gemini-api-key"' in snippet
