"""Issue 37, items 6, 8, 9, 11 and 12 against real servers over loopback (the proxy in a
subprocess or a background thread, the demo upstream as vLLM and as a teacher).

Before the fix, on main: ``serve`` on a damaged SQLite file printed ``ready``, logged four
lines of raw SQL per batch and said ``0 call(s) recorded`` on stop without the spooled calls;
``sessions`` showed tokens ``-`` for a session whose last call was streamed while the viewer
showed its size; a ``GET /v1/models`` first labelled the session ``curl``; ``teacher --url
.../v1`` failed every sample with ``teacher answered 404`` printed twice and no hint; ``serve
--ui`` showed raw ids with ``--tokenizer demo``, ``/ui`` was a 404 and the log never named the viewer.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from factories import call, free_port, post_status

from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.records import CallRecord, Dialect
from orchard_rec.storage import Store
from tests.cli.test_mistakes import assert_short, cli

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.network


def _serve(tmp_path: Path, upstream: str, db: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "orchard_rec.cli", "serve", "--upstream", upstream, "--port", str(port),
         "--db", db, *extra],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2):
                return p, base
        except OSError:
            if p.poll() is not None:
                return p, base
            time.sleep(0.1)
    p.kill()
    raise AssertionError("serve did not start")


# -- 6. a damaged database -------------------------------------------------------------------------------------


def _damaged(tmp_path: Path) -> str:
    path = tmp_path / "orchard.db"
    store = Store(f"sqlite:///{path}")
    store.upgrade()
    store.write_batch([call(f"s{i}", prompt_ids=[1] * 500, completion_ids=[2] * 50) for i in range(40)])
    store.close()
    with sqlite3.connect(path) as con:
        pages = {name: root for name, root in con.execute("SELECT name, rootpage FROM sqlite_master")}
    with open(path, "r+b") as f:  # the sessions table's root page: the schema still reads
        f.seek((pages["sessions"] - 1) * 4096)
        f.write(b"\xff" * 4096)
    return f"sqlite:///{path}"


@pytest.mark.slow
def test_serve_on_a_damaged_database_refuses_before_listening(tmp_path: Path) -> None:
    db = _damaged(tmp_path)
    p, _ = _serve(tmp_path, "http://127.0.0.1:9/v1", db)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "malformed" in err and "ready" not in err and "listening" not in err, err
    assert_short(err)
    assert not (tmp_path / "orchard.db.spool").exists()


@pytest.mark.slow
def test_stop_reports_the_calls_waiting_in_the_spool_in_one_line_warnings(tmp_path: Path) -> None:
    up = BackgroundServer(DemoUpstream().app()).start()
    db = f"sqlite:///{tmp_path / 'orchard.db'}"
    p, base = _serve(tmp_path, up.url + "/v1", db)
    try:
        with sqlite3.connect(tmp_path / "orchard.db") as con:  # the database goes bad under the proxy
            con.execute("DROP TABLE sessions")
        for i in range(3):
            assert post_status(f"{base}/s/run-{i}/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})[0] == 200  # fmt: skip
        time.sleep(1.5)
    finally:
        up.stop()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    failures = [x for x in err.splitlines() if "database write failed" in x]
    assert failures and all("no such table: sessions" in x for x in failures), err
    assert "[SQL:" not in err and "Background on this error" not in err, err
    stop = err.strip().splitlines()[-1]
    assert "0 call(s) recorded, 3 waiting in the spool" in stop and "orchard.db.spool" in stop, err


# -- 8. a streamed last call: the same size in `sessions` and the viewer -----------------------------------------


@pytest.mark.slow
def test_streamed_last_call_tokens_agree(tmp_path: Path, upstream, proxy_factory) -> None:  # type: ignore[no-untyped-def]
    from orchard_rec.ui import build_ui_app, open_store

    db = f"sqlite:///{tmp_path / 'orchard.db'}"
    proxy = proxy_factory(upstream.url, db, mode="token")
    msgs = [{"role": "user", "content": "hi"}]
    assert post_status(f"{proxy.url}/s/run/v1/chat/completions", {"model": "m", "messages": msgs})[0] == 200
    msgs += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more please"}]
    status, _ = post_status(
        f"{proxy.url}/s/run/v1/chat/completions", {"model": "m", "messages": msgs, "stream": True}
    )
    assert status == 200
    proxy.flush()
    rc, out = cli("sessions", "--json", "--db", db)
    assert rc == 0, out
    [row] = json.loads(out)
    assert isinstance(row["tokens"], int) and row["tokens"] > 0, row
    store = open_store(db)
    srv = BackgroundServer(lambda: build_ui_app(store)).start()
    try:
        with urllib.request.urlopen(srv.url + "/api/sessions", timeout=30) as r:
            [viewer] = json.loads(r.read())["sessions"]
    finally:
        srv.stop()
        store.close()
    assert viewer["context_tokens"] == row["tokens"]


# -- 9. the harness label comes from a model call ---------------------------------------------------------------


def _probe(sid: str, harness: str) -> CallRecord:
    return call(sid, dialect=Dialect.MODELS, harness=harness)


def test_a_probe_first_does_not_label_the_session(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    store.write_batch([_probe("one", "curl")])  # its own batch, before the harness's first call
    store.write_batch([call("one", prompt_ids=[1], completion_ids=[2], harness="codex")])
    store.write_batch(
        [_probe("two", "curl"), call("two", prompt_ids=[1], completion_ids=[2], harness="codex")]
    )
    store.write_batch([_probe("three", "curl")])
    harness = {s.id: s.harness for s in store.sessions()}
    store.close()
    assert harness == {"one": "codex", "two": "codex", "three": None}


# -- 11. teacher --url with /v1, failures once with a hint -------------------------------------------------------


@pytest.fixture
def small_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'orchard.db'}"
    store = Store(url)
    store.upgrade()
    store.write_batch([call("alpha", prompt_ids=[5, 6, 7], completion_ids=[8, 9], logprobs=[-0.1, -0.2])])
    store.close()
    return url


def test_teacher_url_with_v1_is_the_upstream_form(small_db: str) -> None:
    with BackgroundServer(DemoUpstream().app()) as teacher:
        rc, out = cli("teacher", "--db", small_db, "--url", teacher.url + "/v1", "--retries", "0")
    assert rc == 0 and "1 scored" in out and "0 failed" in out, out


def test_teacher_failures_are_printed_once_with_a_hint(small_db: str) -> None:
    from aiohttp import web

    def app() -> web.Application:
        a = web.Application()
        a.router.add_route("*", "/{tail:.*}", lambda r: web.Response(status=404, text="Not Found"))
        return a

    store = Store(small_db)
    store.write_batch([call("beta", prompt_ids=[5, 6], completion_ids=[8], logprobs=[-0.1])])
    store.close()
    with BackgroundServer(app) as teacher:
        rc, out = cli("teacher", "--db", small_db, "--url", teacher.url, "--retries", "0")
    assert rc == 1, out
    for sid in ("alpha", "beta"):
        assert sum(1 for line in out.splitlines() if f"{sid}/" in line and "404" in line) == 1, out
    assert "is --url" in out and "--kind" in out


# -- 12. serve --ui: the tokenizer, /ui, the log --------------------------------------------------------------------


@pytest.mark.slow
def test_serve_ui_decodes_with_the_tokenizer_redirects_and_logs_its_url(tmp_path: Path) -> None:
    up = BackgroundServer(DemoUpstream().app()).start()
    db = f"sqlite:///{tmp_path / 'orchard.db'}"
    p, base = _serve(tmp_path, up.url + "/v1", db, "--ui", "--tokenizer", "demo")
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "tell me about orchards"}]}
        assert post_status(f"{base}/s/run/v1/chat/completions", body)[0] == 200
        time.sleep(1.0)

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(base + "/ui?key=abc", timeout=10)
            raise AssertionError("/ui answered without a redirect")
        except urllib.error.HTTPError as e:
            assert e.code == 302 and e.headers["Location"] == "/ui/?key=abc"
        with urllib.request.urlopen(base + "/ui", timeout=10) as r:
            assert r.status == 200 and r.url.endswith("/ui/")
        with urllib.request.urlopen(base + "/ui/api/sessions/run", timeout=30) as r:
            view = json.loads(r.read())
        assert view["token_source"] == "tokenizer" and view["vocab"], view["token_source"]
    finally:
        up.stop()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert f"viewer: {base}/ui/" in err, err
