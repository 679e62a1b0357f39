"""Faults inside the recorder's own threads: nothing a call or the disk does may stop a writer.

- A record that cannot be serialized (an integer past 64 bits, a lone surrogate: orjson refuses
  both) is logged and set aside (``SPOOL.rejected``, written by the standard library's ``json``),
  under ``async`` and ``wal`` alike; the calls around it are stored and the writer keeps going.
- The database thread (``wal``) and the replays survive a spool operation that raises (``ack``,
  reading the spool): the spool keeps what was not acknowledged and a later replay stores it.
- ``wal``: a call whose record cannot be built after its capture line offered itself as a base of
  later lines: the spool is not acknowledged past it (a replay sets it aside, decoding the later
  lines against it), no line written afterwards uses it as a base, and a replay pass that set a
  line aside acknowledges nothing past it before the pass is done. Each checked across a restart.

Real ``Store`` on SQLite and a real spool on disk; faults are injected by wrapping one method.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from factories import call, growing_capture, rejected_ids

from orchard_rec.proxy import capline
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.records import CallRecord, Dialect
from orchard_rec.storage import Store
from orchard_rec.storage.spool import SpoolFormatError


def _wait(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


class Flaky:
    """Wraps a real ``Store``: its next ``fail`` writes raise, as a lost connection would."""

    def __init__(self, store: Store) -> None:
        self.fail = 0
        self._write = store.write_batch
        store.write_batch = self.write_batch  # type: ignore[method-assign]

    def write_batch(self, records: Any, *, known_new: bool = False) -> int:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("server closed the connection unexpectedly")
        return self._write(records, known_new=known_new)


def _store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    store.upgrade()
    return store


POISONS = [
    pytest.param({"big": 10**30}, id="int-past-64-bits"),
    pytest.param({"text": "\ud800"}, id="lone-surrogate"),
]


@pytest.mark.parametrize("meta", POISONS)
def test_async_a_record_the_spool_cannot_serialize_is_set_aside(tmp_path, caplog, meta) -> None:  # type: ignore[no-untyped-def]
    """The database is down, so the batch goes to the spool, where one record cannot be written
    as JSON: that record is set aside and logged, the others are spooled, the writer lives on and
    the replay stores them once the database is back."""
    store = _store(tmp_path)
    flaky = Flaky(store)
    spool = tmp_path / "a.spool"
    rec = Recorder(store, spool=spool, durability="async", retry_s=0.05, linger_s=0)
    rec.start()
    flaky.fail = 1
    poison = call("s", metadata=meta)
    rec.submit(poison)
    assert rec.flush(5)
    good = [call("s") for _ in range(3)]
    for r in good:
        rec.submit(r)
    assert rec.flush(5), "the writer thread died"
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    assert rec._thread is not None and rec._thread.is_alive()
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {r.call_id for r in good}
    assert "could not write the record of call " + poison.call_id in caplog.text
    aside = [json.loads(line) for line in (tmp_path / "a.spool.rejected").read_text().splitlines()]
    assert [a["call_id"] for a in aside] == [poison.call_id]
    store.close()


@pytest.mark.parametrize("meta", POISONS)
def test_wal_a_record_line_that_cannot_be_serialized_is_set_aside(tmp_path, caplog, meta) -> None:  # type: ignore[no-untyped-def]
    """Under wal a ``CallRecord`` submitted as one is spooled as a record line: one that cannot be
    serialized is set aside, the rest of its batch is spooled and stored, nobody waits forever."""
    store = _store(tmp_path)
    rec = Recorder(store, spool=tmp_path / "w.spool", durability="wal", retry_s=0.05)
    rec.start()
    poison = call("s", metadata=meta)
    good = call("s")
    rec.submit(poison)
    rec.submit(good)
    assert rec.flush(5), "the writer thread died"
    later = call("s")
    rec.submit(later)
    assert rec.flush(5), "the writer thread died"
    assert rec._thread is not None and rec._thread.is_alive()
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {good.call_id, later.call_id}
    assert "could not write the record of call " + poison.call_id in caplog.text
    aside = (tmp_path / "w.spool.rejected").read_text().splitlines()
    assert [json.loads(a)["call_id"] for a in aside] == [poison.call_id]
    store.close()


def test_wal_an_ack_that_raises_does_not_stop_the_database_thread(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """``Spool.ack`` fails once (an I/O error truncating the file): the database thread logs it,
    the spool keeps the batch (a replay acknowledges it later), and later calls are stored."""
    store = _store(tmp_path)
    rec = Recorder(store, spool=tmp_path / "k.spool", durability="wal", retry_s=0.05)
    rec.start()
    assert rec.spool is not None
    ack = rec.spool.ack
    fails = [1]

    def broken(upto: int) -> None:
        if fails[0]:
            fails[0] -= 1
            raise OSError(5, "Input/output error")
        ack(upto)

    rec.spool.ack = broken  # type: ignore[method-assign]
    first, second = call("s"), call("s")
    rec.submit(first)
    assert rec.flush(5)
    rec.submit(second, committed=True)
    assert rec.flush(5), "the database thread died"
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    assert rec._db_thread is not None and rec._db_thread.is_alive()
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {first.call_id, second.call_id}
    assert "Input/output error" in caplog.text
    store.close()


@pytest.mark.parametrize("durability", ["async", "wal"])
def test_a_replay_that_raises_is_retried_not_fatal(tmp_path, caplog, durability) -> None:  # type: ignore[no-untyped-def]
    """Reading the spool fails once during a replay: the thread that replays logs it and tries
    again ``retry_s`` later; everything spooled is stored."""
    store = _store(tmp_path)
    flaky = Flaky(store)
    rec = Recorder(store, spool=tmp_path / "r.spool", durability=durability, retry_s=0.05, linger_s=0)
    rec.start()
    assert rec.spool is not None
    lines = rec.spool.lines
    fails = [1]

    def broken() -> Any:
        if fails[0]:
            fails[0] -= 1
            raise OSError(5, "Input/output error")
        return lines()

    rec.spool.lines = broken  # type: ignore[method-assign]
    flaky.fail = 1
    records: list[CallRecord] = [call("s"), call("s")]
    for r in records:
        rec.submit(r)
        assert rec.flush(5)
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    assert not fails[0], "no replay ran"
    later = call("s")
    rec.submit(later)
    assert rec.flush(5), "the thread that replays died"
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {r.call_id for r in [*records, later]}
    assert "Input/output error" in caplog.text
    store.close()


@pytest.mark.parametrize("meta", POISONS)
def test_without_a_spool_a_record_the_database_refuses_does_not_stall_the_writer(
    tmp_path, caplog, meta
) -> None:  # type: ignore[no-untyped-def]
    """No spool: a failed write is retried in memory until the database takes it. A record that
    cannot be serialized never will be; it is logged and dropped from the retry, the others stored."""
    store = _store(tmp_path)
    rec = Recorder(store, durability="async", retry_s=0.05, linger_s=0)
    rec.start()
    poison, good = call("s", metadata=meta), call("s")
    rec.submit(poison)
    rec.submit(good)
    assert rec.flush(5), "the writer is stuck retrying a record the database cannot take"
    later = call("s")
    rec.submit(later)
    assert rec.flush(5)
    rec.close()
    assert {c.call_id for c in store.calls("s")} == {good.call_id, later.call_id}
    assert "could not write the record of call " + poison.call_id in caplog.text
    store.close()


# -- wal: a call whose record cannot be built, after its capture line offered itself as a base ------


class Schedule:
    """Wraps a real ``Store``: write number ``k`` (from 1) fails when ``fails(k)``."""

    def __init__(self, store: Store, fails: Any) -> None:
        self.n = 0
        self.fails = fails
        self._write = store.write_batch
        store.write_batch = self.write_batch  # type: ignore[method-assign]

    def write_batch(self, records: Any, *, known_new: bool = False) -> int:
        self.n += 1
        if self.fails(self.n):
            raise ConnectionError("server closed the connection unexpectedly")
        return self._write(records, known_new=known_new)


def _submit(rec: Recorder, cap: Capture) -> None:
    rec.begin()
    rec.submit(cap)
    assert rec.flush(5)


def test_wal_a_call_whose_record_fails_stays_in_the_spool_for_the_lines_written_against_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """B's capture line is spooled, then its record cannot be built; C's line is written against
    B's (its request and prompt ids extend B's). The database fails for C and the process stops
    (as ``kill -9`` would leave it): the next process must still rebuild C, so the spool may not
    be acknowledged past B. B itself goes to ``SPOOL.rejected``, never silently dropped."""
    store = _store(tmp_path)
    down = [False]
    Schedule(store, lambda n: down[0])
    spool = tmp_path / "b.spool"
    rec = Recorder(store, spool=spool, durability="wal", retry_s=3600)
    rec.start()
    a, b, c = growing_capture("s", 0), growing_capture("s", 1, broken=True), growing_capture("s", 2)
    _submit(rec, a)
    _submit(rec, b)
    down[0] = True
    _submit(rec, c)
    rec.close()
    down[0] = False
    rec2 = Recorder(store, spool=spool, durability="wal", retry_s=0.05)
    rec2.start()
    _wait(lambda: rec2.spool_depth == 0 and rec2.healthy)
    rec2.close()
    assert [r.call_id for r in store.calls("s")] == [a.call_id, c.call_id]
    assert rejected_ids(tmp_path / "b.spool.rejected") == {b.call_id}
    store.close()


def test_wal_a_call_whose_record_fails_is_no_base_after_the_replay_set_it_aside(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """B's record fails; a replay sets B's line aside and acknowledges the spool. The session's
    next call C comes later: it must not be written against B (neither in the spool nor in the
    database any more), or a crash before C is stored loses C."""
    store = _store(tmp_path)
    down = [False]
    Schedule(store, lambda n: down[0])
    spool = tmp_path / "n.spool"
    rec = Recorder(store, spool=spool, durability="wal", retry_s=0.05)
    rec.start()
    a, b, c = growing_capture("s", 0), growing_capture("s", 1, broken=True), growing_capture("s", 2)
    _submit(rec, a)
    _submit(rec, b)
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    assert rejected_ids(tmp_path / "n.spool.rejected") == {b.call_id}
    down[0] = True
    rec.retry_s = 3600
    _submit(rec, c)
    rec.close()
    down[0] = False
    rec2 = Recorder(store, spool=spool, durability="wal", retry_s=0.05)
    rec2.start()
    _wait(lambda: rec2.spool_depth == 0 and rec2.healthy)
    rec2.close()
    assert [r.call_id for r in store.calls("s")] == [a.call_id, c.call_id]
    assert rejected_ids(tmp_path / "n.spool.rejected") == {b.call_id}
    store.close()


def test_a_replay_does_not_acknowledge_past_a_line_set_aside_before_it_is_done(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The spool after a crash: B (its record cannot be built), X (another session), C (written
    against B). The replay stores one call per batch (``batch_bytes=1``); the database fails on
    C's write. Had X's write acknowledged the spool past B, the next pass would start at C with
    B's bases neither in the spool nor in the database, and set C aside."""
    enc = capline.Encoder()
    b, x, c = growing_capture("s", 1, broken=True), growing_capture("t", 0), growing_capture("s", 2)
    lines = [enc.encode(capline.snapshot(k)) for k in (b, x, c)]
    assert any(p[0] == "ref" for p in orjson.loads(lines[2])["request"])  # C is written against B
    spool = tmp_path / "p.spool"
    spool.write_bytes(b"\n".join(lines) + b"\n")
    store = _store(tmp_path)
    Schedule(store, lambda n: n == 2)  # X's write goes through, C's fails once
    rec = Recorder(store, spool=spool, durability="wal", retry_s=0.05)
    rec.batch_bytes = 1
    rec.start()
    _wait(lambda: rec.spool_depth == 0 and rec.healthy)
    rec.close()
    assert {r.call_id for r in store.calls()} == {x.call_id, c.call_id}
    assert rejected_ids(tmp_path / "p.spool.rejected") == {b.call_id}
    store.close()


# -- capture lines: an upstream base read back from the database is checked by content ---------------


def _tito_cap(sid: str, ids: list[int]) -> Capture:
    """A tito call: the upstream request carries the prompt's ids (a JSON delta against the
    session's previous upstream request, its ``"up"`` base)."""
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", sid)
    cap.request_raw, cap.request, cap.bytes_in = raw, orjson.loads(raw), len(raw)
    cap.upstream_request = {"model": "m", "prompt": ids, "max_tokens": 16}
    cap.status_code, cap.body = 200, b'{"id":"x","choices":[{"text":"ok"}]}'
    return capline.snapshot(cap)


class _Call:
    def __init__(self, upstream_request: Any) -> None:
        self.upstream_request = upstream_request


def test_an_upstream_base_read_back_other_than_written_is_refused() -> None:
    """The database's upstream request for a base is as long as the one the line was written
    against but not the same (one id another of as many digits): the line is refused (CRC), not
    rebuilt into an upstream request the call never sent."""
    enc = capline.Encoder()
    first_ids = list(range(1000, 3000))
    first = _tito_cap("up", first_ids)
    second = _tito_cap("up", [*first_ids, *range(3000, 3050)])
    enc.encode(first)
    line = orjson.loads(enc.encode(second))
    assert any(p[:2] == ["ref", "up"] for p in line["upstream"]["bytes"])
    wrong = {"model": "m", "prompt": [*first_ids[:-1], 9999], "max_tokens": 16}
    assert len(orjson.dumps(wrong)) == len(orjson.dumps(first.upstream_request))

    class Db:
        def __init__(self, up: Any) -> None:
            self.up = up

        def get_call(self, call_id: str) -> _Call:
            return _Call(self.up)

    got = capline.Decoder(Db(first.upstream_request)).capture(line)  # type: ignore[arg-type]
    assert got.upstream_request == second.upstream_request
    with pytest.raises(SpoolFormatError, match="other than it was written"):
        capline.Decoder(Db(wrong)).capture(line)  # type: ignore[arg-type]


def test_a_request_base_read_back_other_than_written_is_refused() -> None:
    """The same for a request base: the database's request text is as long as the one the line was
    written against but one character differs (its blobs replaced, say): refused, not rebuilt into
    a request the client never sent."""

    def chat(sid: str, n: int) -> Capture:
        msgs = [{"role": "user", "content": f"turn {i} " + "x" * 900} for i in range(n)]
        raw = orjson.dumps({"model": "m", "messages": msgs})
        cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", sid)
        cap.request_raw, cap.request, cap.bytes_in = raw, orjson.loads(raw), len(raw)
        cap.status_code, cap.body = 200, b'{"id":"x","choices":[]}'
        return capline.snapshot(cap)

    enc = capline.Encoder()
    first, second = chat("rq", 6), chat("rq", 7)
    enc.encode(first)
    line = orjson.loads(enc.encode(second))
    assert any(p[:2] == ["ref", "req"] and len(p) == 7 for p in line["request"])  # with its CRC
    assert first.request_raw is not None
    text = first.request_raw.decode()
    wrong = text.replace("turn 3", "turn 8")
    assert len(wrong) == len(text) and wrong != text

    class Db:
        def __init__(self, text: str) -> None:
            self.text = text

        def request_text(self, call_id: str) -> str:
            return self.text

    got = capline.Decoder(Db(text)).capture(line)  # type: ignore[arg-type]
    assert got.request_raw == second.request_raw
    with pytest.raises(SpoolFormatError, match="other than it was written"):
        capline.Decoder(Db(wrong)).capture(line)  # type: ignore[arg-type]
    old = orjson.loads(orjson.dumps(line))  # a line of a build before the request's CRC: length only
    old["request"] = [p[:6] if p[0] == "ref" else p for p in old["request"]]
    assert capline.Decoder(Db(text)).capture(old).request_raw == second.request_raw  # type: ignore[arg-type]


# -- capture lines: one list of the Capture fields written as they are (D2) --------------------------

OLD_LINE = (
    b'{"_v":3,"_k":"cap","call_id":"0123456789abcdef0123456789abcdef","session_id":"sess-1",'
    b'"dialect":"responses","upstream_dialect":"chat","method":"POST","path":"/v1/responses",'
    b'"headers":{"user-agent":"x/1"},"harness":"codex","harness_session":"h-7","stream":false,'
    b'"status_code":200,"outcome":"ok","error":null,"received_at":1.5,"first_byte_at":1.75,'
    b'"done_at":2.0,"bytes_in":12,"bytes_out":34,"metadata":{"k":"v"},"parsed":true,'
    b'"request":[["t","{\\"model\\":\\"m\\",\\"input\\":\\"hi\\"}"]],"client_response":{"id":"r",'
    b'"output":[]},"client_events":null,"upstream":{"msgs":null,"new":[{"role":"user","content":"hi"}],'
    b'"keys":["model","messages"],"other":{"model":"m"}},"tokens":null,'
    b'"answer":[["t","{\\"id\\":\\"x\\",\\"choices\\":[]}"]],"bases":{"req":true,"upobj":true}}'
)
"""A capture line as the build before this test wrote it (every scalar field set)."""


def test_every_capture_slot_is_written_or_said_not_to_be() -> None:
    """A new ``Capture`` slot must be put in one of capline's lists: written as it is (encoder and
    decoder read the same tuple), written as parts, or live-only. Otherwise a replay would lose it."""
    plain = set(capline.FIELDS)
    groups = [plain, set(capline.PARTS), set(capline.LIVE_ONLY)]
    assert sum(map(len, groups)) == len(set().union(*groups)), "a slot in two lists"
    assert set().union(*groups) == set(Capture.__slots__)


def test_an_old_capture_line_decodes_and_a_new_one_says_the_same() -> None:
    """The line format is unchanged: a line of the previous build rebuilds every field, and the
    same call encoded now is the same JSON object (key for key)."""
    cap = capline.Decoder(None).capture(orjson.loads(OLD_LINE))
    assert (cap.call_id, cap.session_id, cap.dialect, cap.upstream_dialect) == (
        "0123456789abcdef0123456789abcdef",
        "sess-1",
        Dialect.RESPONSES,
        Dialect.CHAT,
    )
    assert (cap.method, cap.path, cap.headers, cap.harness, cap.harness_session) == (
        "POST",
        "/v1/responses",
        {"user-agent": "x/1"},
        "codex",
        "h-7",
    )
    assert (cap.stream, cap.status_code, cap.outcome.value, cap.error) == (False, 200, "ok", None)
    assert (cap.received_at, cap.first_byte_at, cap.done_at, cap.bytes_in, cap.bytes_out) == (
        1.5,
        1.75,
        2.0,
        12,
        34,
    )
    assert (cap.metadata, cap.client_response, cap.client_events) == (
        {"k": "v"},
        {"id": "r", "output": []},
        None,
    )
    assert cap.request == {"model": "m", "input": "hi"} and cap.body == b'{"id":"x","choices":[]}'
    again = capline.Encoder().encode(capline.snapshot(cap))
    assert orjson.loads(again) == orjson.loads(OLD_LINE)


def test_wal_a_replay_is_not_put_off_by_calls_that_keep_coming(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One write fails; calls keep coming every 20 ms, never leaving the database thread idle for
    ``retry_s``: the replay still runs ``retry_s`` after the failure, not after the traffic."""
    store = _store(tmp_path)
    flaky = Flaky(store)
    rec = Recorder(store, spool=tmp_path / "t.spool", durability="wal", retry_s=0.2)
    rec.start()
    flaky.fail = 1
    caps = [growing_capture(f"s{k}", 0) for k in range(60)]
    stored_while_busy = False
    for cap in caps:
        rec.begin()
        rec.submit(cap)
        time.sleep(0.02)
        if rec.write_errors and rec.spool_depth == 0 and rec.healthy:
            stored_while_busy = True
            break
    assert rec.flush(10)
    rec.close()
    assert stored_while_busy
    store.close()
