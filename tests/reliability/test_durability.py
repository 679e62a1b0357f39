"""Durability: the spool stays the truth until the database has acknowledged it.

- A call recorded during a one-write database failure is not lost when the next batch
  succeeds (issue 17, bug 6).
- Spool lines carry a format version; lines that cannot be decoded are moved to
  ``PATH.rejected``, never cleared unreplayed, and ``/healthz`` and the log say so (bug 7).
- Back-pressure is bounded in bytes of queued records: 429 in the caller's dialect (issue 16).
- Group commit (``machine`` durability): one fsync covers many calls under concurrency.
- ``kill -9`` in a long growing session (capture lines written against earlier calls, their
  bases in the spool and in the database): every answered call is stored, with its exact ids.

The kill -9 test runs with ``serve --workers 2`` too (``workers``); the others drive the recorder
or the app in this process (a failure injected into its store, its queue's bytes), which a
served worker does not expose: each worker runs that same recorder.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from orchard_rec.proxy.app import RECORDER, build_app
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.records import CallOutcome, CallRecord, Dialect
from orchard_rec.storage import Store
from orchard_rec.storage.spool import FORMAT, Spool, record_from_json, record_to_json
from tests.factories import post_status


def _health(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
        return json.loads(r.read())


def _wait(pred: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _record(call_id: str, text: str = "hi") -> CallRecord:
    return CallRecord(
        call_id=call_id,
        session_id="s",
        dialect=Dialect.CHAT,
        method="POST",
        path="/v1/chat/completions",
        stream=False,
        status_code=200,
        outcome=CallOutcome.OK,
        received_at=time.time(),
        first_byte_at=None,
        done_at=time.time(),
        request={"messages": [{"role": "user", "content": text}]},
        prompt_ids=(1, 2, 3),
    )


class OneFailure:
    """Wraps a real ``Store``: its next ``fail`` writes raise, as a dropped connection would."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fail = 0
        self._write = store.write_batch
        store.write_batch = self.write_batch  # type: ignore[method-assign]

    def write_batch(self, records: Any, *, known_new: bool = False) -> int:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return self._write(records, known_new=known_new)


@pytest.mark.parametrize(
    "durability",
    ["process", "machine", pytest.param("async", marks=pytest.mark.slow)],  # the replay: ~1.2 s each
)
@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_a_call_during_a_one_write_failure_is_not_lost(upstream, db_url, tmp_path, durability) -> None:  # type: ignore[no-untyped-def]
    store = Store(db_url)
    store.upgrade()
    flaky = OneFailure(store)
    cfg = ProxyConfig(
        upstream=upstream.url, db=db_url, durability=durability, spool=str(tmp_path / "s.spool")
    )
    with BackgroundServer(lambda: build_app(cfg, store=store)) as proxy:
        rec = proxy.app[RECORDER]
        chat = {"model": "m", "messages": [{"role": "user", "content": "A"}]}
        assert post_status(f"{proxy.url}/s/one/v1/chat/completions", chat)[0] == 200
        proxy.app[RECORDER].flush()
        flaky.fail = 1  # the next write fails once
        assert (
            post_status(
                f"{proxy.url}/s/one/v1/chat/completions",
                {**chat, "messages": [{"role": "user", "content": "B"}]},
            )[0]
            == 200
        )
        assert rec.flush()
        assert rec.spool_depth >= 1  # B is in the spool, not lost
        assert (
            post_status(
                f"{proxy.url}/s/one/v1/chat/completions",
                {**chat, "messages": [{"role": "user", "content": "C"}]},
            )[0]
            == 200
        )
        assert rec.flush()
        _wait(lambda: rec.spool_depth == 0 and rec.healthy)  # the replay stored what the failure left
        texts = sorted(c.request["messages"][0]["content"] for c in store.calls("one"))
        assert texts == ["A", "B", "C"]
        assert [c.seq for c in store.calls("one")] == [1, 2, 3]
    store.close()


def test_a_spool_that_the_database_has_not_acknowledged_survives_a_restart(db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The recorder level of the same rule: a failed batch, then a good one, then the process
    stops before any replay could run: the next process stores both from the spool."""
    from orchard_rec.proxy.recorder import Recorder

    store = Store(db_url)
    store.upgrade()
    flaky = OneFailure(store)
    spool = tmp_path / "r.spool"
    rec = Recorder(store, spool=spool, durability="wal", retry_s=3600)
    rec.start()
    flaky.fail = 1
    rec.submit(_record("a" * 32, "A"))
    assert rec.flush()
    rec.submit(_record("b" * 32, "B"))
    assert rec.flush()
    flaky.fail = 10**6  # the database stays down until the process stops
    rec.close()
    assert len(Spool(spool).records()) == 2  # nothing cleared that the database had not acknowledged
    flaky.fail = 0
    rec2 = Recorder(store, spool=spool, durability="wal")
    rec2.start()
    assert rec2.flush()
    _wait(lambda: rec2.spool_depth == 0)
    rec2.close()
    assert sorted(c.call_id for c in store.calls("s")) == ["a" * 32, "b" * 32]
    store.close()


def test_spool_lines_are_versioned_and_legacy_lines_still_read(tmp_path: Path) -> None:
    r = _record("c" * 32)
    line = record_to_json(r)
    assert orjson.loads(line)["_v"] == FORMAT
    assert record_from_json(line) == r
    legacy = orjson.loads(line)
    del legacy["_v"]  # written before lines were versioned
    assert record_from_json(orjson.dumps(legacy)) == r


def test_format_2_lines_of_the_previous_build_still_read(tmp_path: Path) -> None:
    """A spool written by the build before capture lines (record lines, ``"_v": 2``, ids shed)
    replays as it did."""
    from dataclasses import replace

    prompt = tuple(range(100, 400))
    r = replace(_record("9" * 32), response={"id": "x", "prompt_token_ids": list(prompt)}, prompt_ids=prompt)
    d = orjson.loads(record_to_json(r))
    assert d["_v"] == FORMAT == 3 and d["response"]["prompt_token_ids"] is None
    d["_v"] = 2
    path = tmp_path / "v2.spool"
    path.write_bytes(orjson.dumps(d) + b"\n")
    sp = Spool(path)
    records, _ = sp.pending()
    assert records == [r] and sp.rejected == 0
    sp.close()


def test_undecodable_lines_are_moved_aside_never_cleared(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "x.spool"
    good = record_to_json(_record("d" * 32))
    renamed = orjson.loads(good)
    renamed["prompt_token_ids"] = renamed.pop("prompt_ids")  # a field renamed by another version
    newer = {**orjson.loads(good), "_v": FORMAT + 1}
    bad_lines = [b"{not json", orjson.dumps(renamed), orjson.dumps(newer)]
    path.write_bytes(good + b"\n" + b"\n".join(bad_lines) + b"\n" + b'{"torn by a cra')
    caplog.set_level(logging.ERROR, "orchard_rec.spool")
    sp = Spool(path)
    assert sp.depth == 4  # the torn tail went aside at once (it was never acknowledged)
    records, end = sp.pending()
    assert [r.call_id for r in records] == ["d" * 32]
    sp.ack(end)
    sp.close()
    assert path.read_bytes() == b""
    kept = (tmp_path / "x.spool.rejected").read_bytes().splitlines()
    assert kept == [b'{"torn by a cra', *bad_lines]  # every byte that was not replayed is kept
    assert "moved to" in caplog.text and "x.spool.rejected" in caplog.text


def test_healthz_says_when_spool_lines_were_set_aside(upstream, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spool = tmp_path / "h.spool"
    spool.write_bytes(record_to_json(_record("e" * 32)) + b"\n" + b'{"_v": 999, "call_id": "x"}\n')
    cfg = ProxyConfig(upstream=upstream.url, db=sqlite_url, spool=str(spool))
    with BackgroundServer(lambda: build_app(cfg)) as proxy:
        _wait(lambda: _health(proxy.url)["spool_depth"] == 0)
        h = _health(proxy.url)
        assert h["spool_rejected"] == 1 and "h.spool.rejected" in h["warning"] and "999" in h["warning"]
    assert [c.call_id for c in Store(sqlite_url).calls("s")] == ["e" * 32]
    assert b'"_v": 999' in (tmp_path / "h.spool.rejected").read_bytes()


def test_spool_segments_do_not_grow_while_the_database_keeps_up(tmp_path: Path) -> None:
    """The database always a batch behind (a pipeline): closed segments go once acknowledged."""
    sp = Spool(tmp_path / "g.spool", segment_bytes=2000)
    prev = 0
    for k in range(200):
        end = sp.append([_record(f"{k:032d}")])
        sp.ack(prev)  # the batch before this one is in the database
        prev = end
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= 3, files
    assert sp.depth == 1
    assert [r.call_id for r in sp.pending()[0]] == [f"{199:032d}"]
    sp.close()
    reopened = Spool(tmp_path / "g.spool")
    ids = [r.call_id for r in reopened.records()]  # at most the open segment replays (idempotently)
    assert ids[-1] == f"{199:032d}" and len(ids) <= 8, ids
    reopened.close()


@pytest.mark.slow  # 4-5 s: fills a queue to its byte bound
def test_back_pressure_is_bounded_in_bytes(upstream, sqlite_url, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ORCHARD_FAULT_WRITE_DELAY_S", "1.0")  # a slow database
    cfg = ProxyConfig(
        upstream=upstream.url, db=sqlite_url, spool=str(tmp_path / "b.spool"), max_queue_bytes=20_000
    )
    big = "x" * 30_000  # one queued call is past the bound
    with BackgroundServer(lambda: build_app(cfg)) as proxy:
        rec = proxy.app[RECORDER]
        chat = {"model": "m", "messages": [{"role": "user", "content": big}]}
        assert post_status(f"{proxy.url}/s/bb/v1/chat/completions", chat)[0] == 200
        assert rec.queued_bytes > 20_000
        code, err = post_status(f"{proxy.url}/s/bb/v1/chat/completions", chat)
        assert (
            code == 429 and err["error"]["type"] == "rate_limit_error" and "bytes" in err["error"]["message"]
        )
        msgs = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        code, err = post_status(f"{proxy.url}/s/bb/v1/messages", msgs, {"anthropic-version": "2023-06-01"})
        assert code == 429 and err["type"] == "error" and err["error"]["type"] == "rate_limit_error"
        assert rec.flush()
        assert rec.queued_bytes == 0
        assert post_status(f"{proxy.url}/s/bb/v1/chat/completions", chat)[0] == 200  # room again
        assert rec.flush()
        assert [c.status_code for c in Store(sqlite_url).calls("bb")] == [200, 429, 429, 200]


def test_group_commit_covers_concurrent_calls_with_few_fsyncs(upstream, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = ProxyConfig(
        upstream=upstream.url, db=sqlite_url, spool=str(tmp_path / "gc.spool"), durability="machine"
    )
    with BackgroundServer(lambda: build_app(cfg)) as proxy:
        rec = proxy.app[RECORDER]
        assert rec.durability == "machine"  # the last byte after the fsync

        async def main() -> list[int]:
            async with aiohttp.ClientSession() as http:

                async def one(i: int) -> int:
                    body = {
                        "model": "m",
                        "messages": [{"role": "user", "content": f"c {i}"}],
                        "stream": i % 2 == 0,
                    }
                    async with http.post(f"{proxy.url}/s/gc/v1/chat/completions", json=body) as r:
                        await r.read()
                        return r.status

                return await asyncio.gather(*(one(i) for i in range(64)))

        assert asyncio.run(main()) == [200] * 64
        assert rec.flush()
        assert rec.fsyncs < 64  # several calls per fsync
        assert len(Store(sqlite_url).calls("gc")) == 64


def test_spool_lines_hold_token_ids_once_and_read_back_equal() -> None:
    from dataclasses import replace

    prompt, completion = tuple(range(100, 400)), (7, 8, 9)
    response = {
        "id": "x",
        "prompt_token_ids": list(prompt),
        "choices": [{"index": 0, "token_ids": list(completion), "prompt_token_ids": None}],
    }
    events = [["", {"prompt_token_ids": list(prompt), "choices": [{"token_ids": [7]}]}], ["", "[DONE]"]]
    r = replace(
        _record("f" * 32), prompt_ids=prompt, completion_ids=completion, response=response, events=events
    )
    line = record_to_json(r)
    d = orjson.loads(line)
    assert d["response"]["prompt_token_ids"] is None and d["events"][0][1]["prompt_token_ids"] is None
    assert len(d["_ids"]) == 3 and line.count(b"397,398,399") == 1  # the prompt's ids once (not a bare
    # "399": a timestamp may hold it)
    assert response["prompt_token_ids"] == list(prompt)  # the record is not changed
    back = record_from_json(line)
    assert back == r
    assert back.response["prompt_token_ids"] == list(prompt)
    not_ids = replace(r, response={"prompt_token_ids": [1, 2]}, events=None)  # not its ids: kept
    assert record_from_json(record_to_json(not_ids)) == not_ids
    assert "_ids" not in orjson.loads(record_to_json(not_ids))


@pytest.mark.slow
def test_kill_9_in_a_long_growing_session_loses_no_answered_call(
    upstream, tmp_path, monkeypatch, workers
) -> None:  # type: ignore[no-untyped-def]
    """40 growing turns of one session (stream and not), the database slow (lines pile up in
    the spool, later ones written against earlier ones), ``kill -9`` mid-run: after a restart
    every answered call is stored, its request byte for byte and its ids exact (as the model
    server gives them for that body). With ``--workers 2`` the turns land on either worker (each
    writes against the calls it saw, in its own spool or the database), and kill -9 takes all."""
    import threading

    from factories import free_port, kill_all, metric_sum, serve_process

    from orchard_rec.proxy.workers import spool_paths

    port = free_port()
    db = f"sqlite:///{tmp_path / 'long.db'}"
    spool = tmp_path / "long.spool"
    monkeypatch.setenv("ORCHARD_FAULT_WRITE_DELAY_S", "0.25")  # token mode and process: the defaults
    # acknowledged lines cut at once (not kept up to 4 MiB): later lines' bases are then in the
    # database as well as in the spool, and the replay reads both
    monkeypatch.setenv("ORCHARD_SPOOL_KEEP_MB", "0")
    served = ("--spool", str(spool), "--workers", str(workers))
    proc = serve_process(port, upstream.url, db, *served)
    base = f"http://127.0.0.1:{port}"
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    hist: list[dict[str, Any]] = []
    answered: list[bytes] = []
    kill_after = 28
    for t in range(40):
        hist.append(
            {"role": "user", "content": f"turn {t}: " + " ".join(words[(t + k) % 12] for k in range(300))}
        )
        body = json.dumps({"model": "m", "messages": hist, "stream": t % 2 == 1}).encode()
        if t == kill_after - 6:  # the database catches up (the spool empties), then falls behind again
            _wait(lambda: metric_sum(port, "orchard_spool_depth") == 0)
        if t == kill_after:  # kill -9 while this call is in flight
            threading.Timer(0.005, kill_all, (proc.pid,)).start()
        req = urllib.request.Request(
            base + "/s/long/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                data = r.read()
        except (OSError, urllib.error.URLError):
            break
        if t % 2 == 0 or data.endswith(b"data: [DONE]\n\n"):
            answered.append(body)
        hist.append({"role": "assistant", "content": f"ran turn {t}"})
    proc.wait(10)
    assert len(answered) >= kill_after
    lines = [
        orjson.loads(x)
        for path in spool_paths(spool, workers)
        for x in path.read_bytes().splitlines()
        if x.endswith(b"}")
    ]
    in_spool = {d["call_id"] for d in lines}
    refs = {p[2] for d in lines for p in [*d["request"], *(d["answer"] or [])] if p[0] == "ref"}
    assert refs - in_spool and refs & in_spool  # bases in the database and in the spool both
    monkeypatch.delenv("ORCHARD_FAULT_WRITE_DELAY_S")
    restarted = serve_process(port, upstream.url, db, *served)
    try:
        _wait(lambda: metric_sum(port, "orchard_spool_depth") == 0, timeout=60)
        for _ in range(4 * workers):  # whichever worker answers
            assert _health(base).get("spool_rejected", 0) == 0
    finally:
        restarted.terminate()
        restarted.wait(30)
    store = Store(db)
    stored = {c.request_text: c for c in store.calls("long")}
    assert len({c.call_id for c in stored.values()}) == len(stored)
    for body in answered:
        call = stored.get(body.decode())
        assert call is not None, f"an answered call of {len(body)} bytes is not stored"
        direct = json.loads(body)
        direct.update(stream=False, return_token_ids=True, logprobs=True)
        _, out = post_status(upstream.url + "/chat/completions", direct)
        want = json.loads(out)
        assert list(call.prompt_ids or ()) == want["prompt_token_ids"]
        assert list(call.completion_ids or ()) == want["choices"][0]["token_ids"]
    store.close()
