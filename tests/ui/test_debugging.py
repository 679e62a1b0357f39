"""The viewer as an RL debugging tool, in a real headless Chromium over an RL-shaped database
(``rldata``): what was wrong (compare of the first call, pages past the end, compactions,
an upstream 400's error), task groups, filters by outcome metadata, live pages, per-call
details. Every page is checked for JavaScript errors by the ``page`` fixture."""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
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
    # from an attempt's page back to its group and its siblings
    p = page.goto(srv.url + "/s/fix-bug-3")
    assert p.get_attribute("dd:has(code:text-is('fix-bug')) .meta-group", "href") == "/groups/task/fix-bug"
    p.click("dd:has(code:text-is('fix-bug')) .meta-filter")
    p.wait_for_url("**meta=task%3Dfix-bug**")
    assert p.locator("[data-session-id]").count() == 4
    p = page.goto(srv.url + "/groups/task/fix-bug?select=bar:2:0.25:0.75&filter=nonzero-std")
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


@pytest.mark.slow
def test_per_call_events_curl_and_send_again(rl_db: str, ui_server: Any, page: Any) -> None:
    import shlex

    from orchard_rec.demo.upstream import DemoUpstream
    from orchard_rec.proxy import BackgroundServer
    from orchard_rec.ui.calls import Resend

    # off by default: no tab, and the API refuses
    srv = ui_server(rl_db)
    p = page.goto(srv.url + "/s/streamed")
    p.click('[data-call-seq="1"] .call-head')
    assert p.locator('[data-call-seq="1"] .tabs button[data-tab="resend"]').count() == 0
    req = urllib.request.Request(
        srv.url + "/api/sessions/streamed/calls/1/resend", method="POST", headers={"X-Orchard-Resend": "1"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403
    # the raw stream events, in order, with the window they arrived in
    p.click('[data-call-seq="1"] .tabs button[data-tab="events"]')
    p.wait_for_selector('[data-call-seq="1"] table.events')
    assert p.locator('[data-call-seq="1"] [data-event]').count() == 3
    assert "[DONE]" in p.inner_text('[data-call-seq="1"] [data-event="2"]')
    assert "first byte +50" in p.inner_text('[data-call-seq="1"] .events-timing')
    # copy as curl: secrets masked, the rest a valid shell command
    p.click('[data-call-seq="1"] .tabs button[data-tab="curl"]')
    p.wait_for_selector('[data-call-seq="1"] pre.curl-text')
    curl = p.inner_text('[data-call-seq="1"] pre.curl-text')
    assert "SECRET" not in curl and "x-portkey-api-key: ***" in curl and '"api_key":"***"' in curl
    words = shlex.split(curl.replace("\\\n", " "))
    assert (
        words[:4] == ["curl", "-sS", "-X", "POST"]
        and words[4] == "$ORCHARD_URL/s/streamed/v1/chat/completions"
    )
    body = json.loads(words[words.index("--data-binary") + 1])
    assert body["messages"] == [{"role": "user", "content": "stream please"}]
    p.click('[data-call-seq="1"] .curl .copy')
    p.wait_for_selector('[data-call-seq="1"] .copied', state="visible")
    # send again, opted in, to a real upstream on loopback: the new answer beside the recorded one
    with BackgroundServer(DemoUpstream().app()) as up:
        srv2 = ui_server(rl_db, resend_to=Resend(up.url + "/v1", "upstream-key"))
        p = page.goto(srv2.url + "/s/fix-bug-0")
        p.click('[data-call-seq="2"] .call-head')
        p.click('[data-call-seq="2"] .tabs button[data-tab="resend"]')
        p.click('[data-call-seq="2"] .resend .send')
        p.wait_for_selector('[data-call-seq="2"] pre.fresh-answer', timeout=30_000)
        assert "200" in p.inner_text('[data-call-seq="2"] .resend-status')
        assert "Attempt 0 done" in p.inner_text('[data-call-seq="2"] pre.recorded')
        fresh = p.inner_text('[data-call-seq="2"] pre.fresh-answer')
        assert '"choices"' in fresh and "Attempt 0 done" not in fresh
        assert "content-type" in p.inner_text('[data-call-seq="2"] pre.resend-headers').lower()
        screenshot(p, "call-resend.png", full_page=True)


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_a_streamed_calls_event_timing_and_response_headers(
    proxy_factory: Any, sqlite_url: str, page: Any
) -> None:
    """Recorded through the proxy (its own viewer, ``serve --ui``) from an upstream that paces its
    frames and sends secret headers: each event's arrival and gap in the Stream events tab, the
    upstream's response headers, without their secrets, in the Headers tab."""
    import openai
    from factories import PACED_SECRETS, check_paced_record, paced_stream_upstream

    from orchard_rec.proxy import BackgroundServer

    with BackgroundServer(paced_stream_upstream()) as up:
        proxy = proxy_factory(up.url + "/v1", sqlite_url, ui=True)
        client = openai.OpenAI(base_url=f"{proxy.url}/s/paced/v1", api_key="k", max_retries=0)
        for _ in client.chat.completions.create(
            model="paced", messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            pass
        proxy.flush()
    (c,) = proxy.store().calls("paced")
    check_paced_record(c)
    at = c.metadata["event_ms"]
    p = page.goto(proxy.url + "/ui/s/paced")
    p.click('[data-call-seq="1"] .call-head')
    p.click('[data-call-seq="1"] .tabs button[data-tab="events"]')
    p.wait_for_selector('[data-call-seq="1"] table.events')
    rows = p.locator('[data-call-seq="1"] [data-event][data-ms]')
    assert rows.count() == 5
    assert [int(rows.nth(i).get_attribute("data-ms")) for i in range(5)] == at
    assert p.inner_text('[data-call-seq="1"] [data-event="1"] .ev-gap') == f"+{at[1] - at[0]}"
    assert p.inner_text('[data-call-seq="1"] [data-event="0"] .ev-gap') == ""
    timing = p.inner_text('[data-call-seq="1"] .events-timing')
    longest = max(b - a for a, b in itertools.pairwise(at))
    assert f"longest gap {longest} ms" in timing and "not recorded" not in timing
    screenshot(p, "call-event-gaps.png", full_page=True)
    p.click('[data-call-seq="1"] .tabs button[data-tab="meta"]')
    p.wait_for_selector('[data-call-seq="1"] pre.response-headers')
    shown = p.inner_text('[data-call-seq="1"] pre.response-headers')
    assert "req-paced-1" in shown and "x-ratelimit-remaining-tokens" in shown
    page_text = p.inner_text('[data-call-seq="1"] .tab-body')
    assert not any(s in page_text for s in PACED_SECRETS) and "event_ms" not in page_text
    screenshot(p, "call-response-headers.png", full_page=True)


def test_serve_ui_resend_and_annotations_behind_the_admin_key(
    upstream: Any, proxy_factory: Any, sqlite_url: str
) -> None:
    from e2e.agents import AGENTS

    proxy = proxy_factory(
        upstream.url, sqlite_url, ui=True, ui_resend=True, api_keys=("client",), admin_keys=("adm",)
    )
    AGENTS["chat"](f"{proxy.url}/s/again/v1", None, {"Authorization": "Bearer client"})
    proxy.flush()
    url = proxy.url + "/ui/api/sessions/again/calls/1/resend"
    req = urllib.request.Request(url, method="POST", headers={"X-Orchard-Resend": "1"})
    with pytest.raises(urllib.error.HTTPError) as e:  # behind the admin key like every viewer route
        urllib.request.urlopen(req)
    assert e.value.code == 401
    req.add_header("Authorization", "Bearer adm")
    with urllib.request.urlopen(req) as r:
        res = json.loads(r.read())
    assert res["status"] == 200 and res["url"].startswith(upstream.url) and res["response"]["choices"]
    # the curl of a call in the proxy points at the proxy itself
    detail = _json_auth(proxy.url + "/ui/api/sessions/again/calls/1", "adm")
    assert detail["curl"].startswith(f"curl -sS -X POST {proxy.url}/s/again/v1/chat/completions")
    assert "client" not in detail["curl"].replace("codex", "")  # the client's key was never recorded
    # annotations through the proxy's viewer: refused without the admin key, written with it
    ann = urllib.request.Request(
        proxy.url + "/ui/api/sessions/again/outcome",
        data=b'{"reward": 1, "label": "ok"}',
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer client"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(ann)
    assert e.value.code == 401
    ann.headers["Authorization"] = "Bearer adm"
    with urllib.request.urlopen(ann) as r:
        assert json.loads(r.read())["metadata"] == {"label": "ok"}
    assert _sessions_json(sqlite_url)["again"]["reward"] == 1


def _json_auth(url: str, key: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def test_ui_resend_flags_are_checked() -> None:
    from typer.testing import CliRunner

    from orchard_rec.cli import app as cli_app

    res = CliRunner().invoke(cli_app, ["ui", "--db", "sqlite:///x.db", "--resend-key-env", "K"])
    assert res.exit_code == 2 and "--resend-to" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli_app, ["serve", "--upstream", "http://127.0.0.1:9/v1", "--ui-resend"])
    assert res.exit_code == 2 and "--ui" in res.output


@pytest.mark.slow
def test_search_finds_a_session_by_its_conversation(rl_db: str, ui_server: Any, page: Any) -> None:
    srv = ui_server(rl_db)
    p = page.goto(srv.url + "/")
    p.fill("input[name=q]", "zanzibar2")  # a word of one attempt's tool result
    p.press("input[name=q]", "Enter")
    p.wait_for_url("**q=zanzibar2**")
    ids = sorted(p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)"))
    assert ids == ["add-test-2", "fix-bug-2"]
    p = page.goto(srv.url + "/?q=" + urllib.parse.quote("Summary of the conversation"))
    assert p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)") == [
        "compacted"
    ]
    screenshot(p, "search.png")


def _sessions_json(db: str) -> dict[str, Any]:
    from typer.testing import CliRunner

    from orchard_rec.cli import app as cli_app

    res = CliRunner().invoke(cli_app, ["sessions", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    return {r["id"]: r for r in rows}


@pytest.mark.slow
def test_annotate_and_curate(tmp_path: Any, ui_server: Any, page: Any) -> None:
    import pyarrow.parquet as pq

    from orchard_rec.storage import Store

    db = f"sqlite:///{tmp_path / 'curate.db'}"
    rldata.build(db)
    # read-only by default: no form, and the API refuses
    ro = ui_server(db)
    p = page.goto(ro.url + "/s/fix-bug-1")
    assert p.locator("#annotate").count() == 0
    req = urllib.request.Request(
        ro.url + "/api/sessions/fix-bug-1/outcome",
        data=b'{"label": "x"}',
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403
    writer = Store(db)
    srv = ui_server(db, writer=writer, poll_ms=300)
    p = page.goto(srv.url + "/s/fix-bug-1")
    p.fill("#annotate input[name=reward]", "0.25")
    p.fill("#annotate input[name=label]", "good-sft")
    p.fill("#annotate input[name=note]", "reads the file, then answers: keep")
    p.click("#annotate button[type=submit]")
    p.wait_for_function("document.getElementById('annotate').dataset.saved === '1'")
    p.wait_for_selector(".hero .reward:has-text('0.25')")
    assert "good-sft" in p.inner_text(".outcome-card")
    row = _sessions_json(db)["fix-bug-1"]
    assert row["reward"] == 0.25 and row["status"] == "completed"  # status untouched
    assert row["metadata"]["label"] == "good-sft" and row["metadata"]["task"] == "fix-bug"  # merged
    assert row["metadata"]["note"].startswith("reads the file")
    # change only the status; clear the note
    p.select_option("#annotate select[name=status]", "failed")
    p.fill("#annotate input[name=note]", "")
    p.click("#annotate button[type=submit]")
    p.wait_for_function("document.getElementById('annotate').dataset.saved === '2'")
    row = _sessions_json(db)["fix-bug-1"]
    assert row["status"] == "failed" and row["reward"] == 0.25 and "note" not in row["metadata"]
    assert row["metadata"]["label"] == "good-sft"
    screenshot(p, "annotate.png")
    # a bad value is refused in words, nothing written
    p.fill("#annotate input[name=label]", "x" * 10_001)
    p.click("#annotate button[type=submit]")
    p.wait_for_selector("#annotate-msg.bad")
    assert "longer than" in p.inner_text("#annotate-msg")
    page.errors.clear()  # the 400 is logged by the browser
    assert _sessions_json(db)["fix-bug-1"]["metadata"]["label"] == "good-sft"
    # pick sessions on the list, download their export
    p = page.goto(srv.url + "/?meta=task%3Dfix-bug")
    p.check('[data-session-id="fix-bug-0"] input.pick')
    p.check('[data-session-id="fix-bug-2"] input.pick')
    assert p.inner_text("#picked") == "2"
    with p.expect_download() as dl:
        p.click("#curate .dl[data-format=jsonl]")
    rows = [json.loads(line) for line in Path(dl.value.path()).read_text().splitlines()]
    assert sorted({r["session_id"] for r in rows}) == ["fix-bug-0", "fix-bug-2"]
    with p.expect_download() as dl:
        p.click("#curate .dl[data-format=parquet]")
    table = pq.read_table(dl.value.path())
    assert sorted(set(table.column("session_id").to_pylist())) == ["fix-bug-0", "fix-bug-2"]
    # a GET with the ids in the query works too (scripts), and says what is wrong in words
    with urllib.request.urlopen(srv.url + "/api/export?format=jsonl&session=refactor-1") as r:
        assert {json.loads(line)["session_id"] for line in r.read().splitlines()} == {"refactor-1"}
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(srv.url + "/api/export?format=csv&session=refactor-1")
    assert e.value.code == 400 and "format must be one of" in json.loads(e.value.read())["error"]
    writer.close()


@pytest.mark.slow
def test_dashboard_charts_over_time(rl_db: str, ui_server: Any, page: Any) -> None:
    srv = ui_server(rl_db)
    p = page.goto(srv.url + "/")
    p.click("#nav-dash")
    p.wait_for_function("document.body.dataset.chartsReady === '1'")
    # 9 attempts x 2 calls + the 400 + 2 compaction calls + 1 streamed
    totals = p.eval_on_selector("#dash-totals", "e => ({...e.dataset})")
    assert totals["calls"] == "22" and totals["errors"] == "1" and totals["rewards"] == "9"
    n_prompt = sum(4 + 7 + 2 for _ in range(9)) + 0 + 40 + 45 + 2  # usage as rldata reports it
    assert int(totals["prompt"]) == n_prompt
    for chart in ("calls", "tokens", "latency", "errors", "rewards"):
        assert p.locator(f"#chart-{chart} canvas").count() == 1, chart  # drawn by the vendored uPlot
    assert p.get_attribute("#chart-calls", "data-series") == "3"  # all + codex + claude-code
    assert p.evaluate("typeof uPlot.paths.bars") == "function"
    rows = p.eval_on_selector_all(
        "[data-breakdown]", "els => els.map(e => [e.dataset.breakdown, +e.dataset.calls])"
    )
    assert rows == [["codex|qwen-tiny", 21], ["claude-code|other-model", 1]]
    screenshot(p, "dashboard.png", full_page=True)
    # per harness and model
    p.select_option("select[name=model]", "other-model")
    p.wait_for_url("**model=other-model**")
    p.wait_for_function("document.body.dataset.chartsReady === '1'")
    assert p.get_attribute("#dash-totals", "data-calls") == "1"
    assert p.get_attribute("#dash-totals", "data-errors") == "1"
    api = _json(srv.url + "/api/dash?harness=codex")
    assert api["totals"]["calls"] == 21 and api["totals"]["errors"] == 0
    assert sum(api["rewards"]["counts"]) == 9
    # no CDN: every script and stylesheet is served by the viewer itself
    srcs = p.eval_on_selector_all("script[src], link[rel=stylesheet]", "els => els.map(e => e.src || e.href)")
    assert srcs and all(s.startswith(srv.url) for s in srcs)
