"""Issue 37, items 2 and 3 through the real command line and the real HTTP route.

On main before the fix: ``outcome my-run --reward 0.3`` erased status and metadata, a bare
``outcome my-run`` wiped everything with rc 0 (``POST {}`` the same, 200), ``--reward nan`` and
``--step-values 1,nan,2`` were stored (as null), and from then on export, show, reward, outcome
and the viewer's session list failed on that database.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from factories import call, two_session_store

from orchard_rec.records import Outcome
from orchard_rec.storage import Store
from orchard_rec.storage.outcome import OutcomeChange
from tests.cli.test_mistakes import assert_short, cli


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'orchard.db'}"
    store = two_session_store(url, "my-run", "other")
    store.close()
    return url


def _outcome(db: str, sid: str = "my-run") -> Outcome | None:
    store = Store(db)
    try:
        return store.session(sid).outcome  # type: ignore[union-attr]
    finally:
        store.close()


def test_outcome_merges_and_clears_explicitly(db: str, tmp_path: Path) -> None:
    assert cli("outcome", "my-run", "--status", "completed", "--metadata", "task=t1", "--db", db)[0] == 0
    assert cli("outcome", "my-run", "--reward", "0.3", "--db", db)[0] == 0
    assert _outcome(db) == Outcome(reward=0.3, status="completed", metadata={"task": "t1"})
    rc, out = cli("outcome", "my-run", "--metadata", "reviewer=bob", "--db", db)
    assert rc == 0 and "reward=0.3" in out, out
    assert _outcome(db) == Outcome(reward=0.3, status="completed", metadata={"task": "t1", "reviewer": "bob"})
    # the README's recipe: a later --status keeps the task= key --group-by needs
    assert cli("outcome", "my-run", "--status", "failed", "--db", db)[0] == 0
    assert _outcome(db).metadata["task"] == "t1"  # type: ignore[union-attr]
    assert cli("outcome", "my-run", "--clear", "reward", "--clear", "metadata.reviewer", "--db", db)[0] == 0
    assert _outcome(db) == Outcome(status="failed", metadata={"task": "t1"})
    assert cli("outcome", "my-run", "--clear", "all", "--db", db)[0] == 0
    assert _outcome(db) == Outcome()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "nothing to change"),
        (("--reward", "nan"), "not a finite number"),
        (("--reward", "inf"), "not a finite number"),
        (("--reward", "1", "--step-values", "1,nan,2"), "finite"),
        (("--reward", "1", "--step-values", "1,inf"), "finite"),
        (("--reward-json", '{"a": NaN}'), "finite"),
        (("--reward-json", '{"a": Infinity}'), "finite"),
        (("--reward-json", '{"a": 1e999}'), "finite"),
        (("--clear", "bogus"), "cannot clear 'bogus'"),
        (("--reward", "1", "--clear", "reward"), "both set and cleared"),
    ],
)
def test_refused_outcomes_are_one_line_rc_2_and_change_nothing(
    db: str, args: tuple[str, ...], says: str
) -> None:
    assert cli("outcome", "my-run", "--reward", "1", "--metadata", "task=t1", "--db", db)[0] == 0
    rc, out = cli("outcome", "my-run", *args, "--db", db)
    assert rc == 2 and says in out, out
    assert_short(out)
    assert _outcome(db) == Outcome(reward=1, metadata={"task": "t1"})


@pytest.mark.parametrize("option", ["--min-reward", "--max-body-mb"])
def test_every_number_option_refuses_nan(option: str, tmp_path: Path) -> None:
    cmd = "export" if option == "--min-reward" else "serve"
    rc, out = (
        cli(cmd, option, "nan", "--out", "x.jsonl", cwd=tmp_path)
        if cmd == "export"
        else cli(cmd, "--upstream", "http://127.0.0.1:9/v1", option, "nan", cwd=tmp_path)
    )
    assert rc == 2 and "not a finite number" in out, out
    assert list(tmp_path.iterdir()) == []


def _poison(db: str, sid: str = "my-run") -> None:
    """The row main stored for ``--reward 1 --step-values 1,nan,2``."""
    path = db.removeprefix("sqlite:///")
    with sqlite3.connect(path) as con:
        con.execute(
            "UPDATE sessions SET step_values = '[1.0,null,2.0]', reward = 1, status = 'completed',"
            " outcome_metadata = ?, outcome_at = CURRENT_TIMESTAMP WHERE id = ?",
            ('{"resolved": true}', sid),
        )


def test_readers_survive_a_bad_row_with_a_warning(
    db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchard_rec.storage import outcome

    monkeypatch.setattr(outcome, "_warned", set())
    _poison(db)
    with caplog.at_level(logging.WARNING):
        rc, out = cli("export", "--out", str(tmp_path / "x.jsonl"), "--db", db)
    assert rc == 0 and "wrote 2 samples" in out, out
    [warning] = [r.getMessage() for r in caplog.records if "stored outcome" in r.getMessage()]
    assert "'my-run'" in warning and "step_values" in warning
    rc, out = cli("show", "my-run", "--plain", "--db", db)
    assert rc == 0, out
    rc, out = cli("reward", "--dry-run", "--db", db)
    assert rc == 0, out
    rc, out = cli("outcome", "my-run", "--status", "failed", "--db", db)
    assert rc == 0, out
    assert _outcome(db) == Outcome(
        reward=1, status="failed", metadata={"resolved": True}
    )  # bad step values gone


@pytest.mark.network
def test_the_viewer_lists_a_session_with_a_bad_row(db: str) -> None:
    from orchard_rec.proxy.server import BackgroundServer
    from orchard_rec.ui import build_ui_app, open_store

    _poison(db)
    store = open_store(db)
    srv = BackgroundServer(lambda: build_ui_app(store)).start()
    try:
        for path in ("/api/sessions", "/api/sessions/my-run", "/api/sessions/my-run/samples", "/"):
            with urllib.request.urlopen(srv.url + path, timeout=30) as r:
                assert r.status == 200, path
    finally:
        srv.stop()
        store.close()


def _post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.network
def test_http_outcome_follows_the_same_rules(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="passthrough")
    url = f"{proxy.url}/sessions/run-1/outcome"
    status, body = _post(url, {"status": "completed", "metadata": {"task": "t1"}, "create": True})
    assert status == 200, body
    status, body = _post(url, {"reward": 0.3})
    assert status == 200 and body["outcome"] == {
        "reward": 0.3,
        "status": "completed",
        "step_values": None,
        "metadata": {"task": "t1"},
    }
    for bad, says in (
        ({}, "nothing to change"),
        ({"create": True}, "nothing to change"),
        ({"step_values": [1, 1e308 * 10]}, "infinity"),
        ({"reward": {"a": True}}, "must be a number"),
        ({"rewrd": 1}, "unknown outcome field"),
    ):
        data = json.dumps(bad).replace("Infinity", "1e999").encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError(f"{bad} accepted")
        except urllib.error.HTTPError as e:
            err = json.loads(e.read())
            assert e.code == 400 and says in err["error"]["message"], err
    status, body = _post(url, {"reward": None, "metadata": {"task": None, "reviewer": "bob"}})
    assert status == 200, body
    assert proxy.store().session("run-1").outcome == Outcome(status="completed", metadata={"reviewer": "bob"})


def test_readers_survive_a_bad_row_on_both_databases(db_url: str, tmp_path: Path) -> None:
    """PostgreSQL behaved the same as SQLite on main: every export failed after one bad row."""
    from sqlalchemy import text

    store = Store(db_url)
    store.upgrade()
    store.write_batch([call("my-run", prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2])])
    store.update_outcome("my-run", OutcomeChange({"reward": 1, "metadata": {"resolved": True}}))
    cast = "CAST(:s AS json)" if store.dialect == "postgresql" else ":s"
    with store.engine.begin() as con:
        con.execute(
            text(f"UPDATE sessions SET step_values = {cast} WHERE id = 'my-run'"), {"s": "[1.0, null]"}
        )
    store.close()
    rc, out = cli("export", "--out", str(tmp_path / "x.jsonl"), "--db", db_url)
    assert rc == 0 and "wrote 1 samples" in out, out
    for args in (("show", "my-run", "--plain"), ("reward", "--dry-run"), ("sessions",)):
        rc, out = cli(*args, "--db", db_url)
        assert rc == 0, (args, out)
    rc, out = cli("outcome", "my-run", "--step-values", "0.5,1", "--db", db_url)
    assert rc == 0, out
    store = Store(db_url)
    assert store.session("my-run").outcome.step_values == (0.5, 1.0)  # type: ignore[union-attr]
    store.close()
