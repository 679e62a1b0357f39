"""The viewer as an RL debugging tool, in a real headless Chromium over an RL-shaped database
(``rldata``): what was wrong (compare of the first call, pages past the end, compactions,
an upstream 400's error), task groups, filters by outcome metadata, live pages, per-call
details. Every page is checked for JavaScript errors by the ``page`` fixture."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from . import rldata
from .conftest import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.network]


@pytest.fixture(scope="module")
def rl_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = f"sqlite:///{tmp_path_factory.mktemp('rl') / 'rl.db'}"
    rldata.build(db)
    return db


def _json(url: str) -> Any:
    with urllib.request.urlopen(url) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_what_was_wrong(rl_db: str, ui_server: Any, page: Any) -> None:
    srv = ui_server(rl_db)
    # the first call's compare view names no "#None"
    p = page.goto(srv.url + "/s/fix-bug-0/compare/1")
    assert "None" not in p.inner_text("header") and "None" not in p.inner_text("main")
    assert "first call" in p.inner_text(".crumb")
    # a page past the end shows the last page, with rows
    p = page.goto(srv.url + "/?page=999&per_page=4")
    assert p.inner_text(".table-head .pageno") == "page 3 of 3"
    assert p.locator("[data-session-id]").count() == 4  # 12 sessions, 4 a page
    assert _json(srv.url + "/api/sessions?page=999&per_page=5")["page"] == 3
    # a compaction is labelled as a replaced history, not drift
    p = page.goto(srv.url + "/s/compacted/compare/2")
    verdict = p.inner_text(".compare .verdict")
    assert "replaces history" in verdict and "diverges" not in verdict
    assert p.locator("[data-history=replaced]").count() == 1
    # an ordinary extension stays one
    p = page.goto(srv.url + "/s/fix-bug-0/compare/2")
    assert "extends" in p.inner_text(".verdict") and p.locator("[data-history=replaced]").count() == 0
    # the Headers tab of an upstream 400 shows the upstream's error, not null
    p = page.goto(srv.url + "/s/bad-request")
    p.click('[data-call-seq="1"] .call-head')
    p.click('[data-call-seq="1"] .tabs button[data-tab="meta"]')
    p.wait_for_selector('[data-call-seq="1"] pre.json')
    meta = p.inner_text('[data-call-seq="1"] pre.json')
    assert '"error": null' not in meta and "max_tokens is too large" in meta and '"status": 400' in meta
    # an ok call's Headers tab has no error line at all
    p = page.goto(srv.url + "/s/fix-bug-0")
    p.click('[data-call-seq="1"] .call-head')
    p.click('[data-call-seq="1"] .tabs button[data-tab="meta"]')
    p.wait_for_selector('[data-call-seq="1"] pre.json')
    assert '"error"' not in p.inner_text('[data-call-seq="1"] pre.json')
    screenshot(p, "session-headers.png")


def _export_ids(db: str, tmp: Any, *args: str) -> list[str]:
    from typer.testing import CliRunner

    from orchard_rec.cli import app as cli_app

    out = tmp / "sel.jsonl"
    res = CliRunner().invoke(cli_app, ["export", "--format", "jsonl", "--db", db, "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    return sorted({json.loads(line)["session_id"] for line in out.read_text().splitlines()})


@pytest.mark.slow
def test_a_task_group_side_by_side(rl_db: str, ui_server: Any, page: Any, tmp_path: Any) -> None:
    import torch

    srv = ui_server(rl_db)
    p = page.goto(srv.url + "/")
    p.click("#nav-groups")
    p.wait_for_url("**/groups")
    groups = p.eval_on_selector_all("[data-group]", "els => els.map(e => e.dataset.group)")
    assert groups == ["fix-bug", "add-test", "refactor"]  # largest first
    p.click('[data-group="fix-bug"] a')
    p.wait_for_url("**/groups/task/fix-bug")
    rewards = [r for r, _ in rldata.TASKS["fix-bug"]]
    ids = p.eval_on_selector_all("[data-attempt-id]", "els => els.map(e => e.dataset.attemptId)")
    assert ids == [f"fix-bug-{k}" for k in range(4)]
    # advantages as GRPO (verl's compute_grpo_outcome_advantage: torch.mean / torch.std + 1e-6)
    t = torch.tensor(rewards)
    adv = p.eval_on_selector_all("[data-attempt-id]", "els => els.map(e => +e.dataset.advantage)")
    norm = p.eval_on_selector_all("[data-attempt-id]", "els => els.map(e => +e.dataset.normalized)")
    assert adv == pytest.approx((t - t.mean()).tolist())
    assert norm == pytest.approx(((t - t.mean()) / (t.std() + 1e-6)).tolist(), rel=1e-5)
    assert float(p.get_attribute("#pass-rate", "data-pass-rate") or -1) == 0.5
    # the selection: BAR and a filter, exactly what export keeps
    p.fill("input[name=select]", "bar:2:0.25:0.75")
    p.check("input[name=filter][value=nonzero-std]")
    p.click("#selection button")
    p.wait_for_url("**select=bar**")
    kept = p.eval_on_selector_all("[data-kept='1']", "els => els.map(e => e.dataset.attemptId)")
    export = _export_ids(
        rl_db, tmp_path, "--group-by", "task", "--select", "bar:2:0.25:0.75", "--filter", "nonzero-std"
    )
    assert sorted(kept) == [s for s in export if s.startswith("fix-bug")] and len(kept) == 2
    assert "kept 2 of 4" in p.inner_text("#selection-verdict")
    # two attempts side by side: they part at the first answer (step 3: system, user, answer)
    assert p.get_attribute("#pair", "data-a") == "fix-bug-0"
    assert p.get_attribute("#pair", "data-b") == "fix-bug-1"
    assert p.get_attribute("#pair", "data-diverge") == "2"
    assert p.locator("#pair .msg.diverge").count() == 2
    screenshot(p, "group.png", full_page=True)
    # pick another B: fix-bug-2 answers differently too; the selection stays in the URL
    p.click('[data-attempt-id="fix-bug-2"] .pick-b')
    p.wait_for_url("**b=fix-bug-2**")
    assert "select=bar" in p.url and p.get_attribute("#pair", "data-b") == "fix-bug-2"
    # a group every filter drops: all-zero rewards
    p = page.goto(srv.url + "/groups/task/add-test?filter=nonzero-std")
    assert "dropped" in p.inner_text("#selection-verdict")
    assert p.locator("[data-kept='0']").count() == 3
    assert _json(srv.url + "/api/groups/task/add-test?filter=nonzero-std")["dropped_by"] == "nonzero-std"
    assert [g["value"] for g in _json(srv.url + "/api/groups?key=task")["groups"]] == groups
    r = page.page.goto(srv.url + "/groups/task/fix-bug?select=bar:x")
    assert r is not None and r.status == 400
    page.errors.clear()  # the 400 page logs its status


@pytest.mark.slow
def test_filter_by_outcome_metadata_error_and_model(rl_db: str, ui_server: Any, page: Any) -> None:
    srv = ui_server(rl_db)
    p = page.goto(srv.url + "/")

    def listed() -> list[str]:
        return sorted(p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)"))

    p.fill("input[name=meta]", "task=fix-bug")
    p.press("input[name=meta]", "Enter")
    p.wait_for_url("**meta=task%3Dfix-bug**")
    assert listed() == [f"fix-bug-{k}" for k in range(4)]
    # a second key narrows (a list value holding it matches)
    p.locator("input[name=meta]").last.fill("tags=hard")
    p.locator("input[name=meta]").last.press("Enter")
    p.wait_for_url("**tags%3Dhard**")
    assert listed() == ["fix-bug-1"]
    p = page.goto(srv.url + "/")
    p.check("input[name=errors]")
    p.wait_for_url("**errors=1**")
    assert listed() == ["bad-request"]
    p = page.goto(srv.url + "/")
    assert p.eval_on_selector_all("select[name=model] option", "els => els.map(e => e.value)") == [
        "",
        "other-model",
        "qwen-tiny",
    ]
    p.select_option("select[name=model]", "other-model")
    p.wait_for_url("**model=other-model**")
    assert listed() == ["bad-request"]
    # the pager keeps the filters
    p = page.goto(srv.url + "/?meta=split%3Dtrain&per_page=4")
    assert "meta=split%3Dtrain" in (p.get_attribute(".table-head .next", "href") or "")


@pytest.mark.slow
def test_a_session_page_updates_in_place_as_calls_arrive(tmp_path: Any, ui_server: Any, page: Any) -> None:
    import time

    from orchard_rec.records import Outcome
    from orchard_rec.storage import Store

    db = f"sqlite:///{tmp_path / 'live.db'}"
    store = Store(db)
    store.upgrade()
    first, second = rldata.attempt_calls("live", 0, time.time() - 5)
    store.write_batch([first])
    srv = ui_server(db, poll_ms=300)
    p = page.goto(srv.url + "/s/live-0")
    page.settle()
    p.evaluate("window.__notReloaded = 1")
    p.click('[data-call-seq="1"] .call-head')  # an open call stays open through updates
    p.wait_for_selector('[data-call-seq="1"] .chat')
    tokens_before = p.locator('[data-sample-index="0"] [data-token-id]').count()
    store.write_batch([second])
    p.wait_for_selector('[data-call-seq="2"]', timeout=15_000)
    p.wait_for_function("document.body.dataset.tokensReady === '1' && document.body.dataset.calls === '2'")
    assert p.evaluate("window.__notReloaded") == 1
    assert p.locator('[data-call-seq="1"] .chat').count() == 1
    assert p.locator('[data-sample-index="0"] [data-token-id]').count() > tokens_before
    assert p.locator("#stale").is_hidden() and p.locator(".outcome-card").count() == 0
    # the new call opens like the others
    p.click('[data-call-seq="2"] .call-head')
    p.wait_for_selector('[data-call-seq="2"] .chat .toolres')
    # an outcome appears in place too
    store.set_outcome("live-0", Outcome(reward=1.0, status="completed", metadata={"task": "live"}))
    store.close()
    p.wait_for_selector(".outcome-card", timeout=15_000)
    assert p.evaluate("window.__notReloaded") == 1 and "completed" in p.inner_text(".hero")
