"""The viewer in a real headless Chromium: every session listed, a session page's token elements
equal the jsonl export (tokens and [0]*prompt + loss_mask) for linear, split and realigned
sessions, no JavaScript error, filters and pagination over 10k sessions."""

from __future__ import annotations

import json
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app as cli_app
from orchard_rec.records import CallOutcome, CallRecord, Dialect, Outcome
from orchard_rec.storage import Store

from .conftest import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.network]

READ_SAMPLE = """(idx) => {
  const el = document.querySelector(`[data-sample-index="${idx}"]`);
  const ts = el.querySelectorAll('[data-token-id]');
  return [Array.from(ts, t => +t.dataset.tokenId), Array.from(ts, t => +t.dataset.mask)];
}"""


def jsonl_export(db: str, sid: str, on_mismatch: str, tmp: Path) -> list[dict[str, Any]]:
    out = tmp / f"{sid}-{on_mismatch}.jsonl"
    res = CliRunner().invoke(
        cli_app,
        [
            "export",
            "--format",
            "jsonl",
            "--db",
            db,
            "--session",
            sid,
            "--on-mismatch",
            on_mismatch,
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_session_pages_show_exactly_the_exported_tokens_and_masks(
    recorded: tuple[str, dict[str, str]], ui_server: Any, page: Any, tmp_path: Path
) -> None:
    db, kinds = recorded
    srv = ui_server(db, tokenizer=None)
    # the sessions page lists every recorded session
    p = page.goto(srv.url + "/")
    listed = p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)")
    assert sorted(listed) == sorted(kinds)
    screenshot(p, "sessions.png", full_page=True)

    seen = {"linear": 0, "split": 0, "realigned": 0}
    for sid, kind in sorted(kinds.items()):
        for policy in ("split", "realign"):
            rows = jsonl_export(db, sid, policy, tmp_path)
            assert rows
            p = page.goto(f"{srv.url}/s/{sid}?on_mismatch={policy}")
            page.settle()
            indices = p.eval_on_selector_all(
                "[data-sample-index]", "els => els.map(e => +e.dataset.sampleIndex)"
            )
            assert indices == [r["index"] for r in rows]
            for r in rows:
                ids, masks = p.evaluate(READ_SAMPLE, r["index"])
                prompt = len(r["tokens"]) - r["response_length"]
                assert ids == r["tokens"], (sid, policy, r["index"])
                assert masks == [0] * prompt + r["loss_mask"], (sid, policy, r["index"])
            seqs = p.eval_on_selector_all("[data-call-seq]", "els => els.map(e => +e.dataset.callSeq)")
            assert seqs == list(range(1, len(seqs) + 1)) and seqs
            reasons = p.eval_on_selector_all(
                "[data-split-reason]", "els => els.map(e => e.dataset.splitReason)"
            )
            assert reasons == [r["metadata"]["reason"] for r in rows if r["metadata"].get("reason")]
            if kind == "linear":
                assert len(rows) == 1 and not reasons
                seen["linear"] += 1
            elif policy == "split":
                assert len(rows) > 1 and reasons and set(reasons) == {"mismatch"}
                seen["split"] += 1
            else:
                assert len(rows) == 1 and rows[0]["metadata"].get("realigned")
                seen["realigned"] += 1
    assert seen == {"linear": 6, "split": 3, "realigned": 3}

    # the README's session screenshot: a split session, decoded with the demo tokenizer
    from orchard_rec.tokenizer import load_tokenizer

    demo = ui_server(db, tokenizer=load_tokenizer("demo"))
    p = page.goto(demo.url + "/s/drift-chat")
    page.settle()
    assert p.locator("[data-split-reason]").count() >= 1
    p.click('[data-call-seq="2"] .call-head')
    p.wait_for_selector('[data-call-seq="2"] .chat')
    for _ in range(3):  # off-screen chunks get their real height once scrolled to
        p.evaluate("document.querySelectorAll('.tokens').forEach(b => b.scrollTop = b.scrollHeight)")
        p.wait_for_timeout(200)
    p.hover('[data-sample-index="1"] [data-token-id][data-mask="1"]')
    screenshot(p, "session-split.png", full_page=True, clip={"x": 0, "y": 0, "width": 1320, "height": 2300})


@pytest.mark.slow
def test_call_details_chat_and_raw_json_one_click_away(
    recorded: tuple[str, dict[str, str]], ui_server: Any, page: Any
) -> None:
    db, _ = recorded
    srv = ui_server(db)
    p = page.goto(srv.url + "/s/linear-messages")
    page.settle()
    p.click('[data-call-seq="2"] .call-head')
    p.wait_for_selector('[data-call-seq="2"] .chat .toolcall')
    assert p.locator('[data-call-seq="2"] .msg.role-user').count() >= 1
    assert p.locator('[data-call-seq="2"] .toolres').count() >= 1
    p.click('[data-call-seq="2"] .tabs button[data-tab="response"]')
    p.wait_for_selector('[data-call-seq="2"] pre.json')
    raw = p.inner_text('[data-call-seq="2"] pre.json')
    assert '"content"' in raw
    # hover shows a token's id and position
    p.hover('[data-sample-index="0"] [data-token-id][data-mask="1"]')
    tip = p.inner_text("#tip")
    assert "id" in tip and "trained" in tip and "logprob" in tip
    # the compare view of two consecutive calls
    p = page.goto(srv.url + "/s/linear-messages/compare/2")
    assert "extends" in p.inner_text(".verdict")
    assert p.locator("[data-token-id]").count() == 0  # compare chips never carry data-token-id


def _bulk(db: str, n: int) -> dict[str, Any]:
    """n one-call sessions through Store's batch write (harness, status and reward vary)."""
    store = Store(db)
    store.upgrade()
    rng = random.Random(7)
    t0 = time.time() - 86400
    harnesses = ["codex", "claude-code", "openclaw"]
    batch: list[CallRecord] = []
    expect: dict[str, Any] = {"codex": 0, "failed": 0, "reward_hi": 0}
    outcomes: list[tuple[str, Outcome]] = []
    for i in range(n):
        sid = f"bulk-{i:05d}"
        h = harnesses[i % 3]
        t = t0 + i
        batch.append(
            CallRecord(
                call_id=uuid.uuid4().hex,
                session_id=sid,
                dialect=Dialect.CHAT,
                method="POST",
                path="/v1/chat/completions",
                stream=False,
                status_code=200,
                outcome=CallOutcome.OK,
                received_at=t,
                first_byte_at=t + 0.01,
                done_at=t + 0.02,
                harness=h,
                model="m",
                request={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                prompt_ids=(1, 2, 3),
                completion_ids=(4, 5),
                completion_logprobs=(-0.1, -0.2),
            )
        )
        if len(batch) == 2000:
            store.write_batch(batch, known_new=True)
            batch = []
        expect["codex"] += h == "codex"
        if i % 10 == 0:
            r = rng.random()
            status = "failed" if i % 20 == 0 else "completed"
            outcomes.append((sid, Outcome(reward=r, status=status)))
            expect["failed"] += status == "failed"
            expect["reward_hi"] += r >= 0.5
    store.write_batch(batch, known_new=True)
    for sid, o in outcomes:
        store.set_outcome(sid, o)
    store.close()
    return expect


@pytest.fixture(scope="module")
def bulk_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    db = f"sqlite:///{tmp_path_factory.mktemp('bulk') / 'bulk.db'}"
    return db, _bulk(db, 10_000)


@pytest.mark.slow
def test_filters_and_pagination_over_10k_sessions(
    bulk_db: tuple[str, dict[str, Any]], ui_server: Any, page: Any
) -> None:
    db, expect = bulk_db
    srv = ui_server(db)
    p = page.goto(srv.url + "/")
    assert p.get_attribute("#total", "data-total") == "10000"
    first = p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)")
    assert first == [f"bulk-{i:05d}" for i in range(9999, 9949, -1)]  # newest first, 50 a page
    p.click(".table-head .next")
    p.wait_for_url("**page=2**")
    second = p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)")
    assert second == [f"bulk-{i:05d}" for i in range(9949, 9899, -1)]
    # sort by id ascending via the header (click twice: desc, then asc)
    p = page.goto(srv.url + "/?sort=id&order=asc&page=3&per_page=100")
    ids = p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)")
    assert ids == [f"bulk-{i:05d}" for i in range(200, 300)]
    # filters from the form
    p = page.goto(srv.url + "/")
    p.select_option("select[name=harness]", "codex")
    p.wait_for_url("**harness=codex**")
    assert p.get_attribute("#total", "data-total") == str(expect["codex"])
    rows = p.eval_on_selector_all(
        "tbody tr[data-session-id] td:nth-child(3)", "els => els.map(e => e.innerText)"
    )
    assert set(rows) == {"codex"}
    p.select_option("select[name=status]", "failed")
    p.wait_for_url("**status=failed**")
    n_failed_codex = int(p.get_attribute("#total", "data-total") or -1)
    assert 0 < n_failed_codex <= expect["failed"]
    p = page.goto(srv.url + "/?reward_min=0.5")
    assert p.get_attribute("#total", "data-total") == str(expect["reward_hi"])
    p = page.goto(srv.url + "/")
    p.fill("input[name=q]", "bulk-0012")
    p.press("input[name=q]", "Enter")
    p.wait_for_url("**q=bulk-0012**")
    ids = p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)")
    assert sorted(ids) == [f"bulk-0012{i}" for i in range(10)]
    # API agrees with the page
    import urllib.request

    with urllib.request.urlopen(srv.url + "/api/sessions?harness=codex&per_page=10&page=2") as r:
        body = json.loads(r.read())
    assert body["total"] == expect["codex"] and len(body["sessions"]) == 10 and body["page"] == 2


@pytest.mark.slow
def test_new_sessions_appear_while_recording(tmp_path: Path, ui_server: Any, page: Any) -> None:
    db = f"sqlite:///{tmp_path / 'live.db'}"
    _bulk(db, 3)
    srv = ui_server(db, poll_ms=500)
    p = page.goto(srv.url + "/")
    assert p.locator("[data-session-id]").count() == 3
    store = Store(db)
    t = time.time()
    store.write_batch(
        [
            CallRecord(
                call_id=uuid.uuid4().hex,
                session_id="fresh-one",
                dialect=Dialect.CHAT,
                method="POST",
                path="/v1/chat/completions",
                stream=False,
                status_code=200,
                outcome=CallOutcome.OK,
                received_at=t,
                first_byte_at=t,
                done_at=t,
            )
        ]
    )
    store.close()
    p.wait_for_selector('[data-session-id="fresh-one"]', timeout=15_000)
    assert p.get_attribute("#total", "data-total") == "4"


@pytest.mark.slow
def test_serve_ui_mounts_the_viewer_behind_the_admin_key(
    upstream: Any, proxy_factory: Any, sqlite_url: str, page: Any
) -> None:
    from e2e.agents import AGENTS

    proxy = proxy_factory(upstream.url, sqlite_url, ui=True, api_keys=("client",), admin_keys=("adm",))
    AGENTS["chat"](f"{proxy.url}/s/mounted/v1", None, {"Authorization": "Bearer client"})
    proxy.flush()
    p = page.page
    resp = p.goto(proxy.url + "/ui/")
    assert resp is not None and resp.status == 401
    p.fill("input[name=key]", "wrong")
    p.press("input[name=key]", "Enter")
    p.wait_for_load_state()
    assert p.locator("[data-session-id]").count() == 0
    page.errors.clear()  # the 401 pages log their status as console errors
    p.goto(proxy.url + "/ui/?key=adm")  # sets the cookie, then the page without the key
    assert p.url.endswith("/ui/")
    assert p.eval_on_selector_all("[data-session-id]", "els => els.map(e => e.dataset.sessionId)") == [
        "mounted"
    ]
    p.click('[data-session-id="mounted"] a')
    page.settle()
    assert p.url.endswith("/ui/s/mounted")
    assert p.locator('[data-sample-index="0"] [data-token-id]').count() > 0
    # the proxy itself still answers its clients, and the API needs the key too
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(proxy.url + "/ui/api/sessions")
    assert e.value.code == 401


@pytest.mark.slow
def test_show_html_file_renders_offline_with_the_same_tokens(
    recorded: tuple[str, dict[str, str]], page: Any, tmp_path: Path
) -> None:
    db, _ = recorded
    out = tmp_path / "drift-chat.html"
    res = CliRunner().invoke(cli_app, ["show", "drift-chat", "--db", db, "--html", str(out)])
    assert res.exit_code == 0, res.output
    rows = jsonl_export(db, "drift-chat", "split", tmp_path)
    p = page.goto(out.as_uri())
    page.settle()
    for r in rows:
        ids, masks = p.evaluate(READ_SAMPLE, r["index"])
        assert ids == r["tokens"]
        assert masks == [0] * (len(r["tokens"]) - r["response_length"]) + r["loss_mask"]
    p.click('[data-call-seq="3"] .call-head')  # from the embedded data: no server behind a file
    p.wait_for_selector('[data-call-seq="3"] .chat .toolcall')
    p.click('[data-call-seq="3"] .tabs button[data-tab="upstream_request"]')
    p.wait_for_selector('[data-call-seq="3"] pre.json')
