"""The viewer's JSON API, read-only guarantees, ``show --html`` and the CLI's mistakes (no browser)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app as cli_app
from orchard_rec.ui import UIError, open_store

from .test_browser import _bulk, jsonl_export

pytestmark = pytest.mark.network


def _get(url: str, **headers: str) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req) as r:
            body = r.read()
            return r.status, json.loads(
                body
            ) if r.headers.get_content_type() == "application/json" else body.decode()
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(
            body
        ) if e.headers.get_content_type() == "application/json" else body.decode()


@pytest.mark.slow
def test_api_samples_equal_the_jsonl_export(
    recorded: tuple[str, dict[str, str]], ui_server: Any, tmp_path: Path
) -> None:
    db, kinds = recorded
    srv = ui_server(db)
    for sid in kinds:
        for policy in ("split", "realign"):
            status, rows = _get(f"{srv.url}/api/sessions/{sid}/samples?on_mismatch={policy}")
            assert status == 200
            assert rows == jsonl_export(db, sid, policy, tmp_path)
    status, body = _get(srv.url + "/api/sessions?sort=id&order=asc")
    assert status == 200 and [s["id"] for s in body["sessions"]] == sorted(kinds)
    assert all(s["model"] and s["context_tokens"] > 0 for s in body["sessions"])
    status, detail = _get(srv.url + "/api/sessions/linear-chat/calls/1")
    assert status == 200 and detail["request"]["messages"] and detail["chat"][0]["role"] == "system"
    status, cmp = _get(srv.url + "/api/sessions/drift-chat/compare/2")
    assert status == 200 and cmp["tokens"]["verdict"].startswith("diverges")
    status, err = _get(srv.url + "/api/sessions/nope")
    assert status == 404 and "no session" in err["error"]
    status, err = _get(srv.url + "/api/sessions?sort=bogus")
    assert status == 400 and "sort" in err["error"]
    status, err = _get(srv.url + "/api/sessions/linear-chat?on_mismatch=sideways")
    assert status == 400 and "on_mismatch" in err["error"]
    status, err = _get(srv.url + "/api/sessions/linear-chat?credit=bogus")
    assert status == 400
    status, page = _get(srv.url + "/s/nope")
    assert status == 404 and "no session" in page


def test_the_viewer_never_creates_or_migrates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(UIError, match="no database"):
        open_store(f"sqlite:///{missing}")
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    import sqlite3

    sqlite3.connect(empty).close()
    with pytest.raises(UIError, match="no orchard-rec schema"):
        open_store(f"sqlite:///{empty}")
    res = CliRunner().invoke(cli_app, ["ui", "--db", f"sqlite:///{missing}"])
    assert res.exit_code == 1 and "no orchard-rec database" in res.output and "Traceback" not in res.output
    assert not missing.exists()
    res = CliRunner().invoke(
        cli_app, ["show", "x", "--db", f"sqlite:///{missing}", "--html", str(tmp_path / "o.html")]
    )
    assert res.exit_code == 1 and "no orchard-rec database" in res.output
    assert not missing.exists() and not (tmp_path / "o.html").exists()


def test_reading_leaves_the_database_unchanged(tmp_path: Path, ui_server: Any) -> None:
    db_path = tmp_path / "ro.db"
    db = f"sqlite:///{db_path}"
    _bulk(db, 30)
    from orchard_rec.storage import Store

    s = Store(db)
    s.engine.dispose()
    import sqlite3

    con = sqlite3.connect(db_path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    before = db_path.read_bytes()
    srv = ui_server(db)
    for path in (
        "/",
        "/?status=failed",
        "/s/bulk-00003",
        "/api/sessions",
        "/api/sessions/bulk-00003/samples",
    ):
        assert _get(srv.url + path)[0] == 200
    con = sqlite3.connect(db_path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    assert db_path.read_bytes() == before


@pytest.mark.slow
def test_show_html_is_one_self_contained_file(recorded: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    db, _ = recorded
    out = tmp_path / "drift.html"
    res = CliRunner().invoke(
        cli_app, ["show", "drift-chat", "--db", db, "--html", str(out), "--tokenizer", "demo"]
    )
    assert res.exit_code == 0, res.output
    html = out.read_text()
    markup = re.sub(r"<script>.*?</script>", "", html, flags=re.S)  # the inlined viewer code
    assert not re.findall(r'(?:src|href)="(?!data:)[^"]*"', markup), "no external resource"
    assert "<style>" in html and "data-split-reason" in html and '"call_details"' in html
    res = CliRunner().invoke(cli_app, ["show", "nope", "--db", db, "--html", str(tmp_path / "x.html")])
    assert res.exit_code == 1 and "no session" in res.output


async def _fetch(url: str, **headers: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers, allow_redirects=False) as r:
        return r.status, await r.text()


def test_ui_keys_guard_pages_and_api(tmp_path: Path, ui_server: Any) -> None:
    db = f"sqlite:///{tmp_path / 'keys.db'}"
    _bulk(db, 3)
    srv = ui_server(db, keys=("adm",))
    assert _get(srv.url + "/api/sessions")[0] == 401
    status, page = _get(srv.url + "/")
    assert status == 401 and "admin key" in page
    assert _get(srv.url + "/api/sessions", Authorization="Bearer adm")[0] == 200
    assert _get(srv.url + "/api/sessions", Authorization="Bearer wrong")[0] == 401
    import asyncio

    status, _ = asyncio.run(_fetch(srv.url + "/?key=adm"))
    assert status == 302  # sets the cookie, then the page without the key in its URL
