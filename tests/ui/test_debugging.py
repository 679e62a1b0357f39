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
