"""Capture lines (spool format 3, ``proxy.capline``): what ``wal`` durability spools of a call.

- A replay rebuilds exactly the record the live path built: every line of a session decoded in
  order (bases from the lines before), and each line alone (bases read from the database), for
  chat, completions, Responses, Messages, stream and not, and tito.
- Through a real proxy whose database fails mid-session: what the replay stores reads back equal
  to what the live records store.
- A line holds what is new: a growing session's later lines are a fraction of its request.
- A line whose base is gone (the database replaced) goes to ``.rejected`` with a log line.

Not run with ``serve --workers 2``: they compare the records the live path built in this
process with what the lines replay to; across workers, lines are replayed by the kill -9 tests
(``test_durability``, ``test_database_faults``, ``test_workers``).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from factories import check_stored_as_written, growing_body

from orchard_rec.proxy import capline
from orchard_rec.proxy.app import RECORDER, build_app
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.records import CallRecord
from orchard_rec.storage import Store
from orchard_rec.storage.spool import Spool, SpoolFormatError


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        return bytes(r.read())


class Taps:
    """Wraps a real ``Store`` and the recorder's spool: the records the live path wrote (or tried
    to), the lines it spooled; ``down`` makes writes fail as a lost database would."""

    def __init__(self, store: Store) -> None:
        self.records: list[CallRecord] = []
        self.lines: list[bytes] = []
        self.down = False
        self._write = store.write_batch
        store.write_batch = self.write_batch  # type: ignore[method-assign]

    def write_batch(self, records: Any, *, known_new: bool = False) -> int:
        if self.down:
            self.records += [r for r in records if r.call_id not in {x.call_id for x in self.records}]
            raise ConnectionError("server closed the connection unexpectedly")
        return self._write(records, known_new=known_new)

    def tap_spool(self, spool: Spool) -> None:
        append = spool.append_lines

        def tapped(lines: Any, **kw: Any) -> int:
            self.lines += list(lines)
            return append(lines, **kw)

        spool.append_lines = tapped  # type: ignore[method-assign]


def _run_session(
    upstream_url: str, db: str, tmp: Path, dialect: str, mode: str, turns: int, fail_from: int | None = None
) -> tuple[Store, Taps, list[CallRecord]]:
    """One growing session (two calls not streamed, two streamed, ...) through a wal proxy; the live records
    (collected before the database sees them) in call order."""
    store = Store(db)
    store.upgrade()
    taps = Taps(store)
    kw: dict[str, Any] = {"tokenizer": "demo"} if mode == "tito" else {}
    cfg = ProxyConfig(
        upstream=upstream_url, db=db, mode=mode, durability="wal", spool=str(tmp / "c.spool"), **kw
    )
    with BackgroundServer(lambda: build_app(cfg, store=store)) as proxy:
        rec = proxy.app[RECORDER]
        rec.retry_s = 0.2
        if fail_from is not None:
            rec.batch_bytes = 1  # a replay then stores (and acknowledges) one call at a time
        taps.tap_spool(rec.spool)
        spool_batch = rec._spool_batch
        caps: list[Any] = []

        def keep(batch: Any, *args: Any) -> None:
            caps.extend(batch)  # what the database thread builds its records from
            spool_batch(batch, *args)

        rec._spool_batch = keep
        for t in range(turns):
            if fail_from is not None and t == fail_from:
                taps.down = True
            stream = t % 4 >= 2  # in pairs: a pair's second body repeats the first's tail
            path, body, headers = growing_body(dialect, t, stream=stream)
            _post(f"{proxy.url}/s/cl-{dialect}/{path}", body, headers)
            assert rec.flush()
        taps.down = False
        deadline = time.monotonic() + 30
        while (rec.spool_depth or not rec.healthy) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rec.spool_depth == 0 and rec.healthy and rec.spool_rejected == 0
    ids = IdParser()
    live = [c.to_record(ids) for c in caps]  # the live path's records (built there unless a replay did)
    return store, taps, live


def _decode_all(lines: list[bytes], store: Store | None) -> list[CallRecord]:
    dec, ids = capline.Decoder(store), IdParser()
    return [dec.capture(orjson.loads(line)).to_record(ids) for line in lines]


CASES = [("chat", "token"), ("completions", "token"), ("responses", "token"), ("messages", "token")]


@pytest.mark.parametrize(
    ("dialect", "mode"),
    [
        pytest.param(*c, marks=() if c == ("chat", "token") else pytest.mark.slow)
        for c in [*CASES, ("chat", "tito"), ("responses", "tito")]
    ],
)
def test_capture_lines_rebuild_the_records_the_live_path_built(upstream, tmp_path, dialect, mode) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'live.db'}"
    store, taps, live = _run_session(upstream.url, db, tmp_path, dialect, mode, turns=6)
    by_id = {r.call_id: r for r in live}
    assert len(taps.lines) == len(live) == 6
    # in order, each base from the lines before (a replay after a crash, nothing acknowledged)
    replayed = _decode_all(taps.lines, None)
    for r in replayed:
        assert r == by_id[r.call_id], r.call_id
    # each line alone: its bases read back from the database (acknowledged before the crash)
    for line in taps.lines:
        dec = capline.Decoder(store)
        r = dec.capture(orjson.loads(line)).to_record(IdParser())
        assert r == by_id[r.call_id]
    # what is new: the later lines write the request's new turn and the prompt's new ids only
    last, line = live[-1], orjson.loads(taps.lines[-1])
    assert last.bytes_in > 12_000
    assert len(orjson.dumps(line["request"])) < 0.3 * last.bytes_in
    if mode == "token":
        assert any(p[:2] == ["ref", "ids"] for p in line["answer"])
        if dialect in ("responses", "messages"):  # the translation's messages shared with the last call's
            base_id, n, shared = line["upstream"]["msgs"]
            # Responses: the fold may translate the previous call's last item again
            assert n >= 9 and shared >= n - 1 and base_id == live[-2].call_id
            assert len(orjson.dumps(line["upstream"])) < 0.4 * len(orjson.dumps(last.upstream_request))
    else:  # tito: the prompt's ids in the upstream request, once
        # (the live record's body holds the prompt's ``Ids``, the ids the record's prompt is)
        assert last.upstream_request["prompt"] is last.prompt_ids
        whole = orjson.dumps(last.upstream_request, default=list)
        assert len(orjson.dumps(line["upstream"])) < 0.3 * len(whole)
        assert "prompt_from" in line["tokens"]
    store.close()


@pytest.mark.parametrize(
    ("dialect", "mode"),
    [
        pytest.param(*c, marks=() if c == ("chat", "token") else pytest.mark.slow)
        for c in [*CASES, ("chat", "tito"), ("messages", "tito")]
    ],
)
@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_a_database_failure_mid_session_replays_what_live_would_have_stored(
    upstream, tmp_path, dialect, mode
) -> None:  # type: ignore[no-untyped-def]
    """The database fails from the third call on (the first two are acknowledged: later lines'
    bases come back from the database), then returns: the replay stores every call, and each
    reads back (``Store.get_call``, what ``orchard-rec calls --json`` shows) equal to the record
    the live path built, written to a database that never failed."""
    _replayed_equals_live(upstream.url, f"sqlite:///{tmp_path / 'replayed.db'}", tmp_path, dialect, mode)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_database_failure_mid_session_replays_on_postgresql(upstream, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same on PostgreSQL (the bases read back through ``Store.request_text`` / ``prompt_ids``)."""
    _replayed_equals_live(upstream.url, pg.new_database(), tmp_path, "chat", "token")


def _replayed_equals_live(upstream_url: str, db: str, tmp_path: Path, dialect: str, mode: str) -> None:
    store, taps, live = _run_session(upstream_url, db, tmp_path, dialect, mode, turns=6, fail_from=2)
    assert taps.records  # a write failed
    check_stored_as_written(store, f"cl-{dialect}", live, tmp_path / "reference.db")
    store.close()


def test_a_line_whose_base_is_gone_is_set_aside_with_a_reason(upstream, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """The database replaced between a crash and the restart: a line written against a call the
    new database does not hold cannot be rebuilt; it goes to ``.rejected``, logged, never dropped."""
    db = f"sqlite:///{tmp_path / 'a.db'}"
    store, taps, _ = _run_session(upstream.url, db, tmp_path, "chat", "token", turns=3)
    store.close()
    spool = tmp_path / "lost.spool"
    spool.write_bytes(taps.lines[-1] + b"\n")  # its bases are in a.db only
    fresh = f"sqlite:///{tmp_path / 'b.db'}"
    caplog.set_level(logging.ERROR, "orchard_rec.spool")
    cfg = ProxyConfig(upstream=upstream.url, db=fresh, spool=str(spool))
    with BackgroundServer(lambda: build_app(cfg)) as proxy:
        rec = proxy.app[RECORDER]
        deadline = time.monotonic() + 20
        while rec.spool_depth and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rec.spool_rejected == 1
    assert (tmp_path / "lost.spool.rejected").read_bytes() == taps.lines[-1] + b"\n"
    assert "neither in the spool nor in the database" in caplog.text


def _cap(sid: str, raw: bytes, answer: bytes, *, stream: bool = False) -> Any:
    from orchard_rec.proxy.capture import Capture
    from orchard_rec.records import Dialect

    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", sid)
    cap.request_raw, cap.request, cap.bytes_in = raw, orjson.loads(raw), len(raw)
    cap.status_code, cap.stream = 200, stream
    if stream:
        cap.chunks = [answer[i : i + 5000] for i in range(0, len(answer), 5000)]
    else:
        cap.body = answer
    return capline.snapshot(cap)


def _answer(ids: list[int], sep: bytes = b",") -> bytes:
    text = "é" * 3000  # multi-byte characters around the cuts
    return (
        b'{"id":"x","choices":[{"message":{"content":"'
        + text.encode()
        + b'"}}],"prompt_token_ids":['
        + sep.join(str(i).encode() for i in ids)
        + b"]}"
    )


def test_capture_lines_round_trip_byte_exact_through_forks_and_odd_bytes() -> None:
    """Growth, a repeat, a fork (the prompt no longer extends the base), ids written with spaces
    (never a base: the database renders them compactly), a new message that differs from the base
    inside a multi-byte character, a stream cut anywhere: every line rebuilds the exact bytes."""
    enc = capline.Encoder()
    msgs = ["à" * 3000]
    ids = list(range(1000, 5000))
    steps: list[Any] = []
    for k, (more, sep, stream) in enumerate(
        [
            (50, b",", False),
            (50, b",", True),
            (0, b",", False),
            (-100, b",", False),
            (40, b", ", False),
            (40, b",", True),
        ]
    ):
        msgs.append("è" * 200 if k % 2 else "é" * 200)
        raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": m} for m in msgs]})
        ids = ids + list(range(7, 7 + more)) if more >= 0 else ids[:more] + [1, 2, 3]
        steps.append(_cap("odd", raw, _answer(ids, sep), stream=stream))
    lines = [enc.encode(c) for c in steps]
    dec = capline.Decoder(None)
    for c, line in zip(steps, lines, strict=True):
        got = dec.capture(orjson.loads(line))
        assert got.request_raw == c.request_raw and got.request == c.request
        assert (b"".join(got.chunks) if c.stream else got.body) == (
            b"".join(c.chunks) if c.stream else c.body
        )
    parts = [orjson.loads(x)["answer"] for x in lines]
    assert any(p[0] == "ref" for p in parts[1])  # grown: on the base
    assert any(p[0] == "ref" for p in parts[2])  # the same ids again
    assert not any(p[0] == "ref" for p in parts[3])  # a fork: whole, and the new base
    assert not any(p[0] == "ref" for p in parts[4])  # ", " separators: whole, and no base
    assert not any(p[0] == "ref" for p in parts[5])
    assert all(len(line) < 30_000 for line in lines[1:3])


def test_a_base_read_back_other_than_written_is_refused() -> None:
    """The database's ids for a base differ from the array the line was written against (CRC)."""
    enc = capline.Encoder()
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
    first = _cap("crc", raw, _answer(list(range(100, 5000))))
    second = _cap("crc", raw, _answer(list(range(100, 5100))))
    enc.encode(first)
    line = orjson.loads(enc.encode(second))

    class Db:
        def request_text(self, call_id: str) -> str:
            return raw.decode()

        def prompt_ids(self, call_id: str) -> tuple[int, ...]:
            return (*range(100, 4999), 4990)  # as long in JSON, another id

    with pytest.raises(SpoolFormatError, match="other than it was written"):
        capline.Decoder(Db()).capture(line)  # type: ignore[arg-type]
    with pytest.raises(SpoolFormatError, match="neither in the spool nor in the database"):
        capline.Decoder(None).capture(line)


def test_a_call_whose_capture_line_fails_is_spooled_as_its_record(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """A bug in the encoder costs the compact line, never the call: its whole record is spooled,
    and no later line is written against it."""
    from orchard_rec.proxy.recorder import Recorder

    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    store.upgrade()
    rec = Recorder(store, spool=tmp_path / "f.spool", durability="wal")
    rec.start()
    taps = Taps(store)
    taps.tap_spool(rec.spool)  # type: ignore[arg-type]
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 6000}]})
    first = _cap("bug", raw, _answer(list(range(100, 5000))))
    second = _cap("bug", raw, _answer(list(range(100, 5100))))
    encode = rec.lines.encode

    def broken(cap: Any) -> bytes:
        line = encode(cap)  # remembered as a base, then fails
        if cap.call_id == first.call_id:
            raise RuntimeError("boom")
        return line

    rec.lines.encode = broken  # type: ignore[method-assign]
    for cap in (first, second):
        rec.begin()
        rec.submit(cap)
        assert rec.flush()
    rec.close()
    assert "could not write the capture line" in caplog.text
    one, two = (orjson.loads(x) for x in taps.lines)
    assert "_k" not in one and one["request_text"] == raw.decode()  # a record line
    assert two["_k"] == "cap" and not any(p[0] == "ref" for p in two["request"] + two["answer"])
    assert {c.call_id for c in store.calls("bug")} == {first.call_id, second.call_id}
    store.close()
