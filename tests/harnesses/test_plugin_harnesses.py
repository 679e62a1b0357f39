"""pi, opencode, hermes-agent and Kimi CLI, the real CLIs, through ``orchard-rec serve`` in
token mode against the demo vLLM-style upstream (which says a line of text before each tool
call, as chatty models do, so that history quirks show).

Each harness runs three times on the same task: once through ``orchard-rec run NAME --proxy``
under ``/s/tagged``, then twice with the plain base URL. Asserted per run: exit 0, the tool
really ran, every model call carries the harness's name (and its own session id where it sends
one), the run's calls land in one session (two same-prompt runs apart where the harness names
its session), no probe is recorded, every generation is exact, and the run reconstructs into
exactly one non-auxiliary sample under the harness's documented policy, side conversations
into their own samples flagged ``metadata.auxiliary``, which ``--no-auxiliary`` and the
trainer formats leave out.
"""

from __future__ import annotations

import json
import time

import pytest
from factories import MARKER_TASK, check_invariants, check_steps
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.exporters.pipeline import export
from orchard_rec.harnesses import HERMES, KIMI, OPENCODE, PI, Harness, install, is_probe, run_harness
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome, CallRecord

pytestmark = [pytest.mark.harness, pytest.mark.slow]


def _names_its_session(h: Harness) -> bool:
    return bool(h.session_headers or h.session_fields)


def _check_run(h: Harness, calls: list[CallRecord]) -> None:
    gen = [c for c in calls if c.dialect.is_generation]
    assert len(gen) >= 2 and all(c.outcome is CallOutcome.OK for c in gen)
    assert {c.harness for c in gen} == {h.name}
    if _names_its_session(h):  # its own session id on every call, one per run
        assert len({c.harness_session for c in gen}) == 1 and gen[0].harness_session
    samples = reconstruct_session(gen, on_mismatch=h.on_mismatch)  # type: ignore[arg-type]
    check_invariants(gen, samples)  # every generation verbatim, mask 1, logprobs aligned
    main = [s for s in samples if not s.metadata.get("auxiliary")]
    aux = [s for s in samples if s.metadata.get("auxiliary")]
    assert len(main) == 1  # the run is ONE sample
    aux_calls = {c.call_id for c in gen if c.metadata.get("auxiliary")}
    assert {t.call_id for s in aux for t in s.turns} == aux_calls
    assert len(main[0].turns) == len(gen) - len(aux_calls)
    if h is OPENCODE:  # its title generation, recognised and kept apart
        assert aux and all(s.metadata["auxiliary_kind"] == "title" for s in aux)
    else:
        assert not aux
    if h.on_mismatch == "split":  # its prompts extend each other exactly
        last = next(c for c in gen if c.call_id == main[0].turns[-1].call_id)
        assert main[0].tokens == list(last.prompt_ids) + list(last.completion_ids)  # type: ignore[arg-type]


@pytest.mark.parametrize("harness", [PI, OPENCODE, HERMES, KIMI], ids=lambda h: h.name)
def test_plugin_harness_runs_with_and_without_session_prefix(
    harness, upstream_factory, proxy_factory, sqlite_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    install(harness)
    up = upstream_factory(preamble=True)
    proxy = proxy_factory(up.url, sqlite_url, mode="token")
    r = CliRunner().invoke(
        app,
        [
            "run",
            harness.name,
            "--proxy",
            proxy.url,
            "--session",
            "tagged",
            "--model",
            "fake-model",
            "--workdir",
            str(tmp_path / "w0"),
            "--timeout",
            "240",
            "--",
            MARKER_TASK,
        ],
    )
    assert r.exit_code == 0, r.output[-3000:]
    assert r.output.strip().splitlines()[-1] == "tagged"
    assert (tmp_path / "w0" / "marker.txt").read_text().strip() == "orchard"
    windows = []
    for k in (1, 2):
        t0 = time.time()
        res = run_harness(
            harness,
            proxy.url,
            None,
            [MARKER_TASK],
            model="fake-model",
            workdir=tmp_path / f"w{k}",
            home=tmp_path / f"h{k}",
            timeout=240,
        )
        windows.append((t0, time.time()))
        assert res.exit_code == 0, res.stderr[-3000:]
        assert (res.workdir / "marker.txt").read_text().strip() == "orchard"
    proxy.flush()
    store = proxy.store()
    every = store.calls()
    assert not [
        c for c in every if is_probe(c.method, c.path.split("?")[0], c.headers)
    ]  # probes: never recorded
    tagged = store.calls("tagged")
    _check_run(harness, tagged)
    check_steps(store, "tagged")
    summary = store.session("tagged")
    assert summary is not None and summary.harness == harness.name  # what `sessions` shows
    assert summary.outcome is not None and summary.outcome.metadata["harness"] == harness.name
    sids = []
    for t0, t1 in windows:
        run = [c for c in every if c.session_id != "tagged" and t0 <= c.received_at <= t1]
        assert len({c.session_id for c in run}) == 1 and run[0].session_id  # one session per run
        sids.append(run[0].session_id)
        _check_run(harness, run)
        assert store.session(run[0].session_id).harness == harness.name  # type: ignore[union-attr]
    if _names_its_session(harness):  # same prompt, two runs, two sessions
        assert sids[0] != sids[1] and all(s.startswith(f"h-{harness.name}-") for s in sids)
    # exports: auxiliary samples kept and flagged in jsonl, left out with --no-auxiliary and by trainer formats
    out = tmp_path / "all.jsonl"
    export(sqlite_url, "jsonl", out, sessions=["tagged"], on_mismatch=harness.on_mismatch)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(1 for s in rows if not s["metadata"].get("auxiliary")) == 1
    assert sum(1 for s in rows if s["metadata"].get("auxiliary")) == (1 if harness is OPENCODE else 0)
    export(sqlite_url, "jsonl", out, sessions=["tagged"], on_mismatch=harness.on_mismatch, auxiliary=False)
    assert len(out.read_text().splitlines()) == 1
    stats = export(
        sqlite_url, "openrlhf", tmp_path / "o.jsonl", sessions=["tagged"], on_mismatch=harness.on_mismatch
    )
    assert stats.samples == 1
