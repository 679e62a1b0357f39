"""Pacing (issue 16): above ``pace_queue_bytes`` of queued calls a new call waits for the writer
before its body is read, instead of adding to the queue; the client gets its answer later, not a
429, and the queue stays near the mark. A call that waits past ``pace_timeout`` gets 429 in its
dialect; a client that hangs up while it waits is recorded as aborted.

Not run with ``serve --workers 2``: these read the recorder's queue in this process (its bytes,
its paced count) to place a call at the mark; with workers each worker paces its own queue,
the same code.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from orchard_rec.proxy.app import RECORDER, build_app
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.records import CallOutcome
from orchard_rec.storage import Store
from tests.factories import post_status

BIG = {"model": "m", "messages": [{"role": "user", "content": "x" * 30_000}]}  # one call is past the mark


@contextmanager
def _one_call_queued(
    upstream: Any,
    db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sid: str,
    delay: float,
    **cfg: Any,
) -> Iterator[tuple[BackgroundServer, Recorder, str]]:
    """A proxy over a database that takes ``delay`` s a write, and one call of ``BIG`` in its queue:
    ``(proxy, recorder, the session's chat URL)``."""
    monkeypatch.setenv("ORCHARD_FAULT_WRITE_DELAY_S", str(delay))
    config = ProxyConfig(upstream=upstream.url, db=db, spool=str(tmp_path / f"{sid}.spool"), **cfg)
    with BackgroundServer(lambda: build_app(config)) as proxy:
        rec = proxy.app[RECORDER]
        url = f"{proxy.url}/s/{sid}/v1/chat/completions"
        assert post_status(url, BIG)[0] == 200
        # under async a call is submitted just after its last byte is sent: the client may see the
        # answer a moment before the queue holds it
        deadline = time.monotonic() + 10
        while rec.queued_bytes <= 20_000:
            assert time.monotonic() < deadline, "the first call never reached the queue"
            time.sleep(0.01)
        yield proxy, rec, url


def _health(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
        return dict(json.loads(r.read()))


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
@pytest.mark.parametrize("durability", ["wal", "async"])
def test_a_call_over_the_mark_waits_for_the_writer_instead_of_queueing(  # type: ignore[no-untyped-def]
    upstream, sqlite_url, tmp_path, monkeypatch, durability
) -> None:
    with _one_call_queued(
        upstream, sqlite_url, tmp_path, monkeypatch, "pp", 0.6, durability=durability, pace_queue_bytes=20_000
    ) as (proxy, rec, url):

        async def second() -> tuple[int, int]:
            async with aiohttp.ClientSession() as http, http.post(url, json=BIG) as r:
                await r.read()
                return r.status, rec.written

        status, written_when_answered = asyncio.run(second())
        assert status == 200  # waited, then answered: no 429
        assert written_when_answered >= 1  # not admitted before the writer stored the first call
        assert rec.paced == 1 and rec.paced_s > 0.1
        health = _health(proxy.url)
        assert health["paced"] == 1 and health["pace_queue_bytes"] == 20_000
        assert health["max_queue_bytes"] == 256 * 1024 * 1024
        assert rec.flush()
        assert [c.status_code for c in Store(sqlite_url).calls("pp")] == [200, 200]
        metrics = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
        assert "orchard_paced_calls 1.0" in metrics and "orchard_writer_queue_bytes" in metrics


@pytest.mark.slow  # ~2.5 s: waits for a slow database
def test_a_call_paced_past_the_timeout_gets_429_in_its_dialect(  # type: ignore[no-untyped-def]
    upstream, sqlite_url, tmp_path, monkeypatch
) -> None:
    with _one_call_queued(
        upstream, sqlite_url, tmp_path, monkeypatch, "pt", 0.8, pace_queue_bytes=20_000, pace_timeout=0.1
    ) as (proxy, rec, url):
        code, err = post_status(url, BIG)
        assert code == 429 and err["error"]["type"] == "rate_limit_error"
        assert "stayed above 20000 bytes" in err["error"]["message"]
        msgs = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        code, err = post_status(f"{proxy.url}/s/pt/v1/messages", msgs, {"anthropic-version": "2023-06-01"})
        assert code == 429 and err["type"] == "error" and err["error"]["type"] == "rate_limit_error"
        assert rec.flush()
        assert [c.status_code for c in Store(sqlite_url).calls("pt")] == [200, 429, 429]


@pytest.mark.slow  # ~2 s: several waiters and a hang-up
def test_several_paced_calls_proceed_and_a_hang_up_while_paced_is_recorded(  # type: ignore[no-untyped-def]
    upstream, sqlite_url, tmp_path, monkeypatch
) -> None:
    with _one_call_queued(
        upstream, sqlite_url, tmp_path, monkeypatch, "ps", 0.5, pace_queue_bytes=20_000
    ) as (
        _,
        rec,
        url,
    ):

        async def main() -> list[int | str]:
            async with aiohttp.ClientSession() as http:

                async def one(i: int) -> int | str:
                    body = {"model": "m", "messages": [{"role": "user", "content": f"small {i}"}]}
                    timeout = aiohttp.ClientTimeout(total=0.15 if i == 0 else 30)
                    try:
                        async with http.post(url, json=body, timeout=timeout) as r:
                            await r.read()
                            return r.status
                    except TimeoutError:
                        return "hung up"

                return await asyncio.gather(*(one(i) for i in range(4)))

        assert asyncio.run(main()) == ["hung up", 200, 200, 200]
        assert rec.paced == 4
        assert rec.flush()
        calls = Store(sqlite_url).calls("ps")
        assert len(calls) == 5
        assert [c.outcome for c in calls].count(CallOutcome.ABORTED) == 1


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_pacing_off_and_bad_flag(upstream, sqlite_url, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from orchard_rec.cli import app as cli

    res = CliRunner().invoke(cli, ["serve", "--upstream", upstream.url, "--pace-queue-bytes", "-1"])
    assert res.exit_code == 2 and "--pace-queue-bytes must be >= 0" in res.output
    assert "Traceback" not in res.output
    with _one_call_queued(upstream, sqlite_url, tmp_path, monkeypatch, "po", 0.3, pace_queue_bytes=0) as (
        _,
        rec,
        url,
    ):
        assert post_status(url, BIG)[0] == 200  # not paced: queued behind the first
        assert rec.paced == 0
        assert rec.flush()
