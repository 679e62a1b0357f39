"""`orchard-rec serve` as a user runs it: a real process, its start/access/stop log, /healthz's view
of the upstream, Ctrl-C once (drain) and twice (at once), and an outcome right after a first call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from factories import free_port

from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.storage import Store

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.network]


def _post(url: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _serve(tmp_path: Path, upstream: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "orchard_rec.cli", "serve", "--upstream", upstream, "--port", str(port),
         "--db", f"sqlite:///{tmp_path / 'o.db'}", "--spool", str(tmp_path / "o.spool"), *extra],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "ORCHARD_UPSTREAM_CHECK_S": "0.3"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            _get(base + "/healthz")
            return p, base
        except OSError:
            assert p.poll() is None, p.stderr.read() if p.stderr else ""
            time.sleep(0.2)
    p.kill()
    raise AssertionError("serve did not start")


def _chat(base: str, sid: str) -> tuple[int, Any]:
    return _post(
        f"{base}/s/{sid}/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )


def test_serve_logs_start_each_call_and_stop_and_reports_the_upstream(tmp_path: Path) -> None:
    up = BackgroundServer(DemoUpstream().app()).start()
    p, base = _serve(tmp_path, up.url + "/v1", "--log-format", "json")
    try:
        assert _chat(base, "run-1")[0] == 200
        deadline = time.monotonic() + 10
        while (
            _get(base + "/healthz")["upstream"].get("reachable") is not True and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        h = _get(base + "/healthz")
        assert h["status"] == "ok" and h["upstream"]["reachable"] is True
        up.stop()
        deadline = time.monotonic() + 10
        while _get(base + "/healthz")["status"] == "ok" and time.monotonic() < deadline:
            time.sleep(0.1)
        h = _get(base + "/healthz")
        assert h["status"] == "degraded" and h["upstream"]["reachable"] is False and h["upstream"]["error"]
    finally:
        up.stop()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    msgs = [x["msg"] for x in lines]
    assert any("listening on " + base in m and "mode token" in m for m in msgs), msgs
    [access] = [x for x in lines if x["logger"] == "orchard_rec.access"]
    assert access["session"] == "run-1" and access["status"] == 200 and access["outcome"] == "ok"
    assert access["method"] == "POST" and access["tokens_in"] > 0 and access["tokens_out"] > 0
    assert access["latency_ms"] > 0
    assert any("shutting down: draining" in m for m in msgs) and "stopped" in msgs[-1]


def test_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    up = BackgroundServer(DemoUpstream(chunk_delay=5.0).app()).start()
    p, base = _serve(tmp_path, up.url + "/v1", "--shutdown-timeout", "120")
    try:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

        def slow_call() -> None:
            try:
                _post(f"{base}/s/slow/v1/chat/completions", body, timeout=120)
            except Exception:
                pass  # cut by the hard stop: expected

        t = threading.Thread(target=slow_call)
        t.daemon = True
        t.start()
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert p.poll() is None  # draining the slow call
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
        assert time.monotonic() - t0 < 10 and p.returncode == 130
        err = p.stderr.read() if p.stderr else ""
        assert "draining 1 call(s)" in err and "stopping now" in err
    finally:
        if p.poll() is None:
            p.kill()
        up.stop()


def test_an_outcome_right_after_a_first_call_always_succeeds(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    """The race of issue 22: the writer creates the session row while the outcome route does."""
    proxy = proxy_factory(upstream.url, sqlite_url, mode="passthrough")
    codes = []
    for k in range(30):
        sid = f"race-{k}"
        assert _chat(proxy.url, sid)[0] == 200
        codes.append(_post(f"{proxy.url}/sessions/{sid}/outcome", {"reward": 1})[0])
    assert codes == [200] * 30
    store = Store(sqlite_url)
    assert all(store.session(f"race-{k}").outcome.reward == 1 for k in range(30))  # type: ignore[union-attr]
    store.close()
