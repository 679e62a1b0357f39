"""Client disconnects, SIGTERM with calls in flight, health and metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.request

import aiohttp
import pytest
from factories import free_port, serve_process

from orchard_rec.records import CallOutcome
from orchard_rec.storage import Store


def test_client_disconnect_mid_stream_is_recorded_aborted_and_cancels_upstream(
    upstream_factory, proxy_factory, db_url
) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(chunk_delay=0.05)
    proxy = proxy_factory(up.url, db_url, mode="passthrough")

    async def main() -> bytes:
        async with aiohttp.ClientSession() as http:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "tell me a long story please"}],
                "stream": True,
            }
            async with http.post(f"{proxy.url}/s/gone/v1/chat/completions", json=body) as r:
                first = await r.content.readany()
                r.close()  # hang up mid-stream
                return first

    first = asyncio.run(main())
    assert first.startswith(b"data: ")
    proxy.flush()
    [rec] = proxy.store().calls("gone")
    assert rec.outcome is CallOutcome.ABORTED and rec.stream
    assert rec.events  # what had arrived is kept
    deadline = time.time() + 5
    while up.fake.aborted == 0 and time.time() < deadline:
        time.sleep(0.02)
    assert up.fake.aborted == 1  # the upstream request was cancelled, not run to the end


@pytest.mark.slow  # a proxy subprocess stopped with SIGTERM mid-load: ~15 s
def test_sigterm_with_calls_in_flight_loses_none_that_completed(upstream_factory, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(chunk_delay=0.01)
    port = free_port()
    proc = serve_process(
        port,
        up.url,
        db_url,
        "--mode",
        "passthrough",
        "--spool",
        str(tmp_path / "term.spool"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        completed: list[int] = []

        async def one(http: aiohttp.ClientSession, i: int) -> None:
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"call {i}: write a long answer"}],
                "stream": True,
            }
            try:
                async with http.post(f"{base}/s/term/v1/chat/completions", json=body) as r:
                    data = await r.read()
                    if data.endswith(b"data: [DONE]\n\n"):
                        completed.append(i)
            except aiohttp.ClientError:
                pass

        async def main() -> None:
            async with aiohttp.ClientSession() as http:
                tasks = [asyncio.create_task(one(http, i)) for i in range(20)]
                await asyncio.sleep(0.15)  # all 20 are streaming now
                os.kill(proc.pid, signal.SIGTERM)
                await asyncio.gather(*tasks)

        asyncio.run(main())
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(completed) == 20  # graceful: in-flight streams were allowed to finish
    recs = Store(db_url).calls("term")
    done = {
        int(r.request["messages"][0]["content"].split(":")[0].split()[1])
        for r in recs
        if r.outcome is CallOutcome.OK
    }
    assert set(completed) <= done
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))


def test_healthz_and_metrics(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="passthrough")
    import json

    with urllib.request.urlopen(proxy.url + "/healthz") as r:
        health = json.loads(r.read())
    assert r.status == 200 and health["status"] == "ok"
    req = urllib.request.Request(
        proxy.url + "/s/m/v1/chat/completions",
        data=b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req).read()
    proxy.flush()
    with urllib.request.urlopen(proxy.url + "/metrics") as r:
        text = r.read().decode()
    assert 'orchard_calls_total{dialect="chat",outcome="ok"} 1.0' in text
    assert "orchard_call_duration_seconds_bucket" in text and "orchard_upstream_ttfb_seconds_count" in text
    assert "orchard_writer_queue_depth 0.0" in text
    assert 'orchard_bytes_total{direction="out"}' in text


def test_healthz_and_metrics_report_the_per_session_caches(
    upstream, proxy_factory, sqlite_url, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Each per-session cache's entries, bytes, bound, hits and misses: a writer that keeps no
    session (a bound of 0) reads each session back from the database on its every call, and says so."""
    import json

    monkeypatch.setenv("ORCHARD_STATE_CACHE_MB", "0")
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token", durability="wal")
    history: dict[str, list[dict[str, str]]] = {"a": [], "b": []}
    for turn in range(3):
        for s, msgs in history.items():
            msgs.append({"role": "user", "content": f"{s} turn {turn}: " + "words " * 1500})
            req = urllib.request.Request(
                f"{proxy.url}/s/{s}/v1/chat/completions",
                data=json.dumps({"model": "m", "messages": msgs, "max_tokens": 8}).encode(),
                headers={"Content-Type": "application/json"},
            )
            answer = json.loads(urllib.request.urlopen(req).read())
            msgs.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        proxy.flush()
    with urllib.request.urlopen(proxy.url + "/healthz") as r:
        caches = json.loads(r.read())["caches"]
    assert {"requests", "translations", "ids", "state", "spool_bases"} <= set(caches)
    for stats in caches.values():
        assert set(stats) == {"entries", "bytes", "max_bytes", "hits", "misses"}
    state = caches["state"]
    assert state["max_bytes"] == 0 and state["entries"] == 0 and state["bytes"] == 0
    assert state["hits"] == 0 and state["misses"] == 4  # turns 2 and 3 of both sessions
    ids = caches["ids"]
    assert (
        ids["entries"] == 2
        and ids["misses"] == 2
        and ids["hits"] == 4
        and 0 < ids["bytes"] <= ids["max_bytes"]
    )
    assert caches["requests"]["hits"] >= 4 and caches["spool_bases"]["hits"] >= 4
    with urllib.request.urlopen(proxy.url + "/metrics") as r:
        text = r.read().decode()
    assert 'orchard_cache_misses_total{cache="state"} 4.0' in text
    assert 'orchard_cache_entries{cache="ids"} 2.0' in text and "orchard_cache_max_bytes" in text
