"""A fleet behind one proxy (``proxy/fleet.py``), over loopback with real demo upstreams and the real
openai SDK: sessions stick to one server, move to the survivor when theirs goes away (tito ids
exact across the move), calls in flight on a killed server fail in the client's dialect and only
they, every completed call is recorded once, and a restarted server is re-admitted."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from factories import free_port, serve_process

from orchard_rec.proxy.fleet import Fleet
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome

ROOT = Path(__file__).resolve().parents[2]


def _client(base: str, sid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/s/{sid}/v1", api_key="k", max_retries=0, timeout=30)


def _turn(client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool) -> str:
    if stream:
        text = ""
        for chunk in client.chat.completions.create(model="m", messages=messages, stream=True):  # type: ignore[arg-type]
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return text
    r = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
    return r.choices[0].message.content or ""


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_tito_sessions_move_to_the_survivor_and_stay_exact(
    upstream_factory, served_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    """With ``--workers 2`` a session's turns also move between workers (a client per turn: a new
    connection), each worker with its own view of the fleet."""
    a, b = upstream_factory(), upstream_factory()
    proxy = served_factory(
        a.url, sqlite_url, fleet=(b.url,), mode="tito", tokenizer="demo", health_interval=0.2
    )
    ring = Fleet([a.url, b.url])
    sids = [f"move-{k}" for k in range(12)]
    on_a = [s for s in sids if ring.home(s).url == a.url]
    assert on_a and len(on_a) < len(sids)
    convos: dict[str, list[dict[str, Any]]] = {s: [] for s in sids}
    for turn in range(6):
        if turn == 3:
            a.server.stop()  # mid-session: server a goes away
        for s in sids:
            convos[s].append({"role": "user", "content": f"turn {turn} of {s}: go on"})
            reply = _turn(_client(proxy.url, s), convos[s], stream=turn % 2 == 1)
            convos[s].append({"role": "assistant", "content": reply})
    proxy.flush()
    store = proxy.store()
    for s in sids:
        calls = store.calls(s)
        assert len(calls) == 6 and all(c.outcome is CallOutcome.OK for c in calls), s
        where = [c.metadata["upstream"] for c in calls]
        assert where == ([a.url] * 3 + [b.url] * 3 if s in on_a else [b.url] * 6), (s, where)
        assert [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * 5, s
        assert len({c.metadata["tito"]["branch"] for c in calls}) == 1
        for x, y in itertools.pairwise(calls):  # each prompt extends the last exactly, across the move
            done = list(x.prompt_ids) + list(x.completion_ids)
            assert list(y.prompt_ids[: len(done)]) == done, s
        [sample] = reconstruct_session(calls)
        assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
    # what b received for a moved session's first call on it: the exact ids a's session had
    moved = [body for _, body in b.fake.log if isinstance(body, dict) and "prompt" in body]
    assert len(moved) == 6 * len(sids) - 3 * len(on_a)


def test_routing_header_carries_the_session(upstream_factory, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    a, b = upstream_factory(), upstream_factory()
    proxy = proxy_factory(a.url, sqlite_url, fleet=(b.url,), routing_header="X-SMG-Routing-Key")
    _turn(_client(proxy.url, "keyed"), [{"role": "user", "content": "hi"}], stream=False)
    _turn(
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0),
        [{"role": "user", "content": "x"}],
        False,
    )
    headers = a.fake.headers + b.fake.headers
    proxy.flush()
    implied = [c.session_id for c in proxy.store().calls() if c.session_id != "keyed"]
    # a call naming no session is routed (and keyed) by the session its body implies
    assert sorted(h.get("x-smg-routing-key") for h in headers) == sorted(["keyed", *implied])
    h = json.loads(urllib.request.urlopen(proxy.url + "/healthz").read())
    assert [u["url"] for u in h["upstreams"]] == [a.url, b.url]
    assert sum(u["calls"] for u in h["upstreams"]) == 2 and h["status"] == "ok"
    metrics = urllib.request.urlopen(proxy.url + "/metrics").read().decode()
    assert f'orchard_upstream_healthy{{upstream="{a.url}"}} 1.0' in metrics
    assert "orchard_upstream_calls_total" in metrics


# -- kill -9 of one of two real upstream processes under load, through `orchard-rec serve` ------------------


def _upstream_process(port: int) -> subprocess.Popen[bytes]:
    """The demo model server in a process of its own (a slow stream: calls are in flight when it dies)."""
    code = (
        "import sys; from aiohttp import web; from orchard_rec.demo.upstream import DemoUpstream;"
        "web.run_app(DemoUpstream(chunk_delay=0.02).app(), host='127.0.0.1', port=int(sys.argv[1]), print=None)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(port)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.DEVNULL,  # its tracebacks when the proxy hangs up after [DONE]
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).read()
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise AssertionError("the demo upstream did not start")


def _health(base: str) -> dict[str, Any]:
    return json.loads(urllib.request.urlopen(base + "/healthz", timeout=5).read())  # type: ignore[no-any-return]


def _each_worker(base: str, n: int) -> dict[int | None, dict[str, Any]]:
    """``/healthz`` of each of ``n`` workers (None: the one process), on new connections."""
    seen: dict[int | None, dict[str, Any]] = {}
    deadline = time.monotonic() + 30
    while len(seen) < n:
        assert time.monotonic() < deadline, seen.keys()
        h = _health(base)
        seen[h.get("worker", {}).get("index")] = h
    return seen


@pytest.mark.slow
@pytest.mark.network
def test_kill_one_upstream_under_load_then_restart_it(tmp_path: Path, workers: int) -> None:
    """With ``--workers 2`` each worker keeps its own view of the fleet (its checks, its
    ejections): both see the death and the re-admission within the interval."""
    ports = [free_port(), free_port()]
    ups = [_upstream_process(p) for p in ports]
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    port = free_port()
    db = f"sqlite:///{tmp_path / 'o.db'}"
    interval = 0.5
    proxy = serve_process(port, urls[0], db, "--upstream", urls[1], "--health-interval", str(interval),
                          "--spool", str(tmp_path / "o.spool"), "--workers", str(workers))  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    ring = Fleet(urls)
    names = [f"fleet-{k}" for k in range(200)]
    sessions = [n for n in names if ring.home(n).url == urls[0]][:4] + [
        n for n in names if ring.home(n).url == urls[1]
    ][:4]  # four sessions at home on each server
    turns = 6
    ok: dict[str, int] = {s: 0 for s in sessions}
    failed: dict[str, list[str]] = {s: [] for s in sessions}
    done_turns = threading.Semaphore(0)

    def run(sid: str) -> None:
        client = _client(base, sid)
        messages: list[dict[str, Any]] = []
        for turn in range(turns):
            messages.append({"role": "user", "content": f"turn {turn}"})
            try:
                reply = _turn(client, messages, stream=True)
            except openai.APIError as exc:  # a stream cut by the dying server, or its 502
                failed[sid].append(f"{type(exc).__name__}: {exc}")
                messages.pop()
                continue
            finally:
                done_turns.release()
            ok[sid] += 1
            messages.append({"role": "assistant", "content": reply})

    try:
        threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        for _ in range(len(sessions) * 2):  # two turns each on average: then server 0 dies
            done_turns.acquire(timeout=60)
        ups[0].send_signal(signal.SIGKILL)
        killed_at = time.time()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a client hung"
        for h in _each_worker(base, workers).values():
            assert [u["healthy"] for u in h["upstreams"]] == [False, True] and h["status"] == "ok"
        ups[0] = _upstream_process(ports[0])  # restarted on its port: re-admitted within the interval
        back = time.monotonic()
        seen: set[int | None] = set()  # the workers that re-admitted it
        while len(seen) < workers:
            h = _health(base)
            if h["upstreams"][0]["healthy"]:
                seen.add(h.get("worker", {}).get("index"))
            assert time.monotonic() - back < interval + 2, "not re-admitted"
            time.sleep(0.02)
        readmitted = time.monotonic() - back
        assert readmitted <= interval + 0.5, readmitted
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait(timeout=60)
        for p in ups:
            p.kill()
            p.wait()
    from orchard_rec.storage import Store

    store = Store(db)
    total_failed = 0
    for s in sessions:
        calls = store.calls(s)
        good = [c for c in calls if c.outcome is CallOutcome.OK]
        bad = [c for c in calls if c.outcome is not CallOutcome.OK]
        assert len(good) == ok[s] and len(bad) == len(failed[s]), (
            s,
            ok[s],
            failed[s],
            [c.error for c in bad],
        )
        assert all(c.metadata["upstream"] == urls[0] for c in bad), s  # only calls in flight on the dead one
        total_failed += len(bad)
        where = [c.metadata["upstream"] for c in calls]
        before = {c.metadata["upstream"] for c in calls if c.received_at < killed_at - 0.05}
        assert before <= {ring.home(s).url}, (s, where)  # while both were healthy: its home, every call
        if urls[0] in where:  # after its server died, a session's calls all went to the survivor
            last = max(i for i, u in enumerate(where) if u == urls[0])
            assert set(where[last + 1 :]) <= {urls[1]}, (s, where)
    assert total_failed <= len(sessions)  # at most one call in flight per session when it died
    # each failure in the client's dialect: a 502 error body, or the stream's own error chunk
    assert all(
        f.startswith(("InternalServerError", "APIError")) and "upstream" in f
        for fs in failed.values()
        for f in fs
    )
    print(*(f for fs in failed.values() for f in fs), sep="\n")
    print(f"failed in flight: {total_failed}; re-admitted after {readmitted:.2f} s")


def test_a_reset_after_the_server_had_the_call_is_never_retried(
    upstream_factory, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    """The server read the whole request, then its connection reset before any byte came back: it
    may have started generating, so the call fails (502, the client's dialect) and is NOT sent to
    the other server; the server is ejected, and the session's next call goes to the other."""
    from aiohttp import web

    from orchard_rec.proxy.server import BackgroundServer

    started: list[str] = []

    async def dies(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":  # its health check passes
            return web.json_response({"object": "list", "data": []})
        await request.read()
        started.append(request.path)
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", dies)
    with BackgroundServer(app) as bad:
        good = upstream_factory()
        urls = [bad.url + "/v1", good.url]
        proxy = proxy_factory(urls[0], sqlite_url, fleet=(urls[1],), health_interval=60)
        ring = Fleet(urls)
        sid = next(f"r-{k}" for k in range(100) if ring.home(f"r-{k}").url == urls[0])
        client = _client(proxy.url, sid)
        with pytest.raises(openai.InternalServerError) as err:
            _turn(client, [{"role": "user", "content": "hi"}], stream=False)
        assert err.value.status_code == 502 and urls[0] in err.value.message
        assert started == ["/v1/chat/completions"] and not good.fake.log  # run once, never twice
        assert _turn(client, [{"role": "user", "content": "hi"}], stream=False)  # now on the other
        assert len(good.fake.log) == 1 and len(started) == 1
        h = json.loads(urllib.request.urlopen(proxy.url + "/healthz").read())
        assert [u["healthy"] for u in h["upstreams"]] == [False, True] and h["upstreams"][0]["failures"] == 1
