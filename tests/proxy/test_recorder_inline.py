"""The event loop's part of recording under ``process`` durability (``Recorder._write_inline``).

With the writer process ready, the database thread is handed each call's spool line alone
(``Spooled``), not a copy of the call: the records must be what the copies gave, also when the
writer process is gone by the time the batch reaches the thread (the lines are decoded there,
as a replay does)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from factories import growing_capture

from orchard_rec.proxy import capline
from orchard_rec.proxy.handoff import Handoff, Spooled
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.storage import Store
from orchard_rec.storage.spool import Spool, load_line


class _Ready:
    """Stands in for a ready writer process (``_write_inline`` only asks ``is_ready``)."""

    is_ready = True


def _recorder(tmp_path: Path, store: Store) -> Recorder:
    rec = Recorder(store, spool=tmp_path / "i.spool", durability="process", writer="process")
    rec.spool = Spool(tmp_path / "i.spool", preallocate=0)  # as ``start`` opens it; no threads
    rec._thread = object()  # type: ignore[assignment]  # "started": small calls are written inline
    return rec


def _inline(rec: Recorder, caps: list[Any]) -> list[Any]:
    """``durable`` of each call on an event loop; the database thread's queue items, in order."""

    async def run() -> None:
        for c in caps:
            rec.begin()
            await rec.durable(c)

    asyncio.run(run())
    items = []
    while not rec._dbq.empty():
        items.append(rec._dbq.get_nowait())
    return items


def test_the_database_thread_gets_the_lines_alone_and_they_give_the_records_the_copies_did(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'i.db'}")
    store.upgrade()
    rec = _recorder(tmp_path, store)
    rec.proc = _Ready()  # type: ignore[assignment]
    caps = [growing_capture("s", k) for k in range(4)]
    copies: list[Any] = []
    encode = rec.lines.encode

    def keep(cap: Any) -> bytes:
        copies.append(capline.snapshot(cap))  # what the line says (done_at set as it is written)
        return encode(cap)

    rec.lines.encode = keep  # type: ignore[method-assign]
    items = _inline(rec, caps)
    assert [type(x) for it in items for x in it[0]] == [Spooled] * 4
    assert all(c.done_at is None for c in caps)  # the live calls are not changed
    assert [it[5][0] for it in items] == [x.line for it in items for x in it[0]]
    assert sum(1 for it in items for part in load_line(it[5][0])["request"] if part[0] == "ref") >= 3
    # the writer process died meanwhile: the thread decodes the lines (``_records``), in order
    got = rec._records([x for it in items for x in it[0]])
    ids = IdParser()
    want = [c.to_record(ids) for c in copies]
    assert got == want
    assert [r.done_at for r in got] == [c.done_at for c in copies]
    rec.spool.close()  # type: ignore[union-attr]
    store.close()


def test_without_the_writer_process_the_thread_gets_copies(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'i.db'}")
    store.upgrade()
    rec = _recorder(tmp_path, store)
    caps = [growing_capture("s", k) for k in range(2)]
    items = _inline(rec, caps)
    batch = [x for it in items for x in it[0]]
    assert [type(x).__name__ for x in batch] == ["Capture", "Capture"]
    assert all(x is not c and x.call_id == c.call_id and x.done_at is not None for x, c in zip(batch, caps))
    rec.spool.close()  # type: ignore[union-attr]
    store.close()


def _item(acks: list[Any] | None = None) -> tuple[Any, ...]:
    return ([], 0, 1, acks or [], 0, None, 0.0)


def test_the_database_threads_queue_polls_under_load_and_sleeps_when_idle() -> None:
    import queue
    import threading
    import time

    q = Handoff()
    q.poll = 0.2
    got: list[tuple[float, Any]] = []

    def take(n: int) -> None:
        for _ in range(n):
            item = q.get()
            got.append((time.monotonic(), item))

    t = threading.Thread(target=take, args=(3,))
    t.start()
    time.sleep(0.05)
    a = _item()
    t0 = time.monotonic()
    q.put_nowait(a)  # it sleeps until woken (idle): taken at once
    while len(got) < 1:
        time.sleep(0.001)
    assert got[0][1] is a and got[0][0] - t0 < 0.15
    time.sleep(0.05)
    b = _item()
    t1 = time.monotonic()
    q.put_nowait(b)  # it polls now: a put does not wake it, its next look takes it
    assert not q._wake.is_set()
    while len(got) < 2:
        time.sleep(0.001)
    assert got[1][1] is b and got[1][0] - t1 < 0.2 + 0.15
    c = _item(acks=[object()])  # a client waits for this one: woken
    t2 = time.monotonic()
    q.put_nowait(c)
    t.join(5)
    assert got[2][1] is c and got[2][0] - t2 < 0.15
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    q.task_done()
    q.poll = 0.0  # as under machine durability: a plain SimpleQueue
    q.put_nowait(a)
    assert q.get(timeout=1) is a


def test_a_call_whose_line_the_spool_refused_goes_on_as_a_copy(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'i.db'}")
    store.upgrade()
    rec = _recorder(tmp_path, store)
    rec.proc = _Ready()  # type: ignore[assignment]

    def full(*a: Any, **k: Any) -> int:
        raise OSError(28, "No space left on device")

    rec.spool.append_lines = full  # type: ignore[union-attr,method-assign]
    rec.spool.append_line = full  # type: ignore[union-attr,method-assign]  # (one call's)
    caps = [growing_capture("s", k) for k in range(2)]
    items = _inline(rec, caps)
    assert [it[2] for it in items] == [None, None]  # not in the spool: the database is their only way
    batch = [x for it in items for x in it[0]]
    assert [type(x).__name__ for x in batch] == ["Capture", "Capture"]
    assert all(x.done_at is not None for x in batch) and "spool append failed" in (rec.last_error or "")
    rec.spool.close()  # type: ignore[union-attr]
    store.close()


def _recipe_by_definition(request: Any, up: Any) -> Any:
    """``capline._recipe``'s contract written plainly (its form before it was made faster): ``up`` is
    ``request`` with the request's keys first, their values the very objects, then only the injected
    keys (scalars), or the request's own injected keys set to other scalars."""
    if type(request) is not dict or type(up) is not dict or up is request:
        return None
    keys = list(up)
    if keys[: len(request)] != list(request):
        return None
    extra = {}
    for k, v in up.items():
        if request.get(k, capline._INJECTED) is v:
            continue
        if k not in capline._INJECTED or isinstance(v, dict | list):
            return None
        extra[k] = v
    return extra


def test_the_recipe_of_an_upstream_body_is_what_its_definition_says() -> None:
    import random

    rng = random.Random(40)
    values: list[Any] = [True, False, 1, "x", None, [1], {"a": 1}]
    names = ["model", "messages", "logprobs", "return_token_ids", "stream", "cache_salt"]
    seen = set()
    for _ in range(20000):
        request = {k: rng.choice(values) for k in rng.sample(names, rng.randint(0, 5))}
        how = rng.randint(0, 4)
        up: Any = dict(request)
        if how == 0:  # token mode's plan
            up["return_token_ids"] = up["logprobs"] = True
        elif how == 1:  # other keys set or changed
            for k in rng.sample([*capline._INJECTED, "stream", "model"], rng.randint(0, 3)):
                up[k] = rng.choice(values)
        elif how == 2:  # the keys in another order
            items = list(up.items())
            rng.shuffle(items)
            up = dict(items)
            up["logprobs"] = rng.choice(values)
        elif how == 3:  # equal values, not the same objects
            up = {k: list(v) if isinstance(v, list) and rng.random() < 0.5 else v for k, v in request.items()}
            up[rng.choice(capline._INJECTED)] = rng.choice(values)
        else:  # shorter, or not a dict
            up = rng.choice([{}, [], dict(list(request.items())[:-1]), request])
        want = _recipe_by_definition(request, up)
        got = capline._recipe(request, up)
        assert got == want and type(got) is type(want), (request, up)
        seen.add(None if want is None else len(want))
    assert {None, 0, 1, 2} <= seen


def test_lines_of_small_and_large_requests_of_one_session_decode_to_their_bytes() -> None:
    """A request too short for any delta is not kept as a base (and drops the session's last): the
    lines after it are written against what the decoder keeps too, and decode byte for byte."""
    import orjson

    from orchard_rec.records import Dialect

    enc, dec = capline.Encoder(), capline.Decoder(None)
    sizes = [100, 6000, 6100, 200, 6200, 6300, 50, 50, 7000, 7100]
    refs = 0
    for k, n in enumerate(sizes):
        cap = growing_capture("mix", k)
        raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "v" * n}], "k": k})
        cap.request_raw, cap.request, cap.bytes_in = raw, orjson.loads(raw), len(raw)
        line = orjson.loads(enc.encode(cap))
        refs += sum(1 for part in line["request"] if part[0] == "ref")
        assert line["bases"]["req"] is True
        back = dec.capture(line)
        assert back.request_raw == raw and back.dialect is Dialect.CHAT
    assert refs >= 3  # the large ones after a large one were written against it
    assert all(kind != "req" or len(e[1]) >= 4096 for (kind, _), e in enc.bases._d.items())


def test_a_call_whose_capture_line_cannot_be_written_goes_inline_as_its_record_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'i.db'}")
    store.upgrade()
    rec = _recorder(tmp_path, store)
    rec.proc = _Ready()  # type: ignore[assignment]
    encode = rec.lines.encode

    def broken(cap: Any) -> bytes:
        if cap.call_id == caps[1].call_id:
            raise RuntimeError("a bug in the encoder")
        return encode(cap)

    rec.lines.encode = broken  # type: ignore[method-assign]
    caps = [growing_capture("b", k) for k in range(3)]
    want = [capline.snapshot(c).to_record() for c in caps]
    items = _inline(rec, caps)
    assert [type(x) for it in items for x in it[0]] == [Spooled] * 3
    lines = [it[5][0] for it in items]
    assert [load_line(line).get("_k") for line in lines] == ["cap", None, "cap"]  # a record line
    assert "could not write the capture line" in caplog.text
    # what was spooled gives the records (the third written whole: the bases were forgotten)
    got = rec._records([x for it in items for x in it[0]])
    assert [replace(r, done_at=0.0) for r in got] == [replace(r, done_at=0.0) for r in want]
    assert all(part[0] != "ref" for part in load_line(lines[2])["request"])
    rec.spool.close()  # type: ignore[union-attr]
    store.close()
