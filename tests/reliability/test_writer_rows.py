"""The writer process stores row for row what the writer thread stores (issue 40, round 8).

Calls of every kind go through a real proxy (chat, completions, Responses and Messages in token
mode, chat passthrough, chat and Responses in tito; each session two calls not streamed, two
streamed, growing): the records its database thread built from the ``Capture`` objects, written
by a store that takes none of the SQLite fast paths (``Store.direct = False``: SQLAlchemy's
statements, a pool connection per batch), are the reference. The same calls' spool lines go
through what ``serve --db-writer process`` runs, ``dbproc._Child.write`` (``capline.Decoder``
filling blank captures, ``record_of_line``, the store's statements straight to the driver on
its own connection, NULL columns written as NULL, ``None`` and ``bytes`` bound through the
process's pass-through adapters), in a process of its own as in ``serve``, the sessions
interleaved in batches of 1 to 16 lines. Every table is the same row for row and byte for byte,
rowids included (the search index: every term at every place, ``test_write_paths.dump``), and
so is what reading gives back. On PostgreSQL (no fast path there, but the calls insert built by
column, the same code) what reading gives back is the reference's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from orchard_rec.records import CallRecord
from orchard_rec.storage import Store
from tests.reliability.test_capture_lines import _run_session
from tests.storage.test_write_paths import _frozen_clock, dump

CASES = [
    ("chat", "token"),
    ("completions", "token"),
    ("responses", "token"),
    ("messages", "token"),
    ("chat", "passthrough"),
    ("chat", "tito"),
    ("responses", "tito"),
]
SIZES = (1, 3, 7, 16)

_CHILD = """
import json, sys
from orchard_rec.proxy import dbproc
from tests.storage.test_write_paths import _frozen_clock

url, path = sys.argv[1], sys.argv[2]
batches = [[line.encode() for line in b] for b in json.load(open(path))]
child = dbproc._Child(url, access_log=False)
with _frozen_clock():
    for b in batches:
        got = child.write(b, True)
        assert got["ok"] and got["built"] == len(b), got
child.store.close()
"""


def _calls(upstream_url: str, tmp: Path) -> tuple[list[list[CallRecord]], list[list[bytes]]]:
    """Per session, the records the writer thread built and the spool lines, in call order."""
    records, lines = [], []
    for dialect, mode in CASES:
        work = tmp / f"{dialect}-{mode}"
        work.mkdir()
        store, taps, live = _run_session(
            upstream_url, f"sqlite:///{work / 'live.db'}", work, dialect, mode, 4
        )
        store.close()
        assert len(taps.lines) == len(live) == 4
        by_id = {r.call_id: r for r in live}
        records.append([by_id[orjson.loads(x)["call_id"]] for x in taps.lines])
        lines.append(list(taps.lines))
    return records, lines


def _batches(per_session: list[list[Any]]) -> list[list[Any]]:
    """The sessions interleaved (each in its own order), cut into batches of ``SIZES`` in turn."""
    order: list[Any] = []
    for k in range(max(map(len, per_session))):
        order += [s[k] for s in per_session if k < len(s)]
    out, i, j = [], 0, 0
    while i < len(order):
        out.append(order[i : i + SIZES[j % len(SIZES)]])
        i += len(out[-1])
        j += 1
    return out


def _child(url: str, batches: list[list[bytes]], tmp: Path) -> None:
    path = tmp / "batches.json"
    path.write_text(json.dumps([[x.decode() for x in b] for b in batches]))
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", _CHILD, url, str(path)], check=True, cwd=root, timeout=120)


def _reference(url: str, batches: list[list[CallRecord]]) -> Store:
    store = Store(url)
    store.upgrade()
    store.direct = False
    with _frozen_clock():
        for b in batches:
            store.write_batch(b, known_new=True)
    return store


def _same_reads(got: Store, want: Store, sessions: list[list[CallRecord]]) -> None:
    """(A dialect's sessions in several modes share their id, ``cl-<dialect>``: one session each.)"""
    sids = {r.session_id for calls in sessions for r in calls}
    n = 0
    for sid in sorted(s for s in sids if s is not None):
        a, b = got.calls(sid), want.calls(sid)
        assert a and [r.call_id for r in a] == [r.call_id for r in b]
        for x, y in zip(a, b, strict=True):
            assert x == y, x.call_id
        n += len(a)
    assert n == sum(map(len, sessions))


@pytest.mark.slow  # seven proxied sessions: ~10 s
def test_the_writer_process_stores_what_the_writer_thread_stores(upstream, tmp_path) -> None:  # type: ignore[no-untyped-def]
    records, lines = _calls(upstream.url, tmp_path)
    ref = _reference(f"sqlite:///{tmp_path / 'ref.db'}", _batches(records))
    for calls in records:  # the upstream's answers carry every kind of id this path cuts
        assert {r.stream for r in calls} == {False, True}
    store = Store(f"sqlite:///{tmp_path / 'child.db'}")
    store.upgrade()
    _child(store.url, _batches(lines), tmp_path)
    a, b = dump(tmp_path / "child.db"), dump(tmp_path / "ref.db")
    assert a.keys() == b.keys() and a["calls"] and a["blobs"] and a["search_fts (instances)"]
    assert len(a["calls"]) == sum(map(len, records))
    for t in a:
        assert a[t] == b[t], t
    _same_reads(store, ref, records)
    store.close()
    ref.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_the_writer_process_on_postgresql_reads_back_as_the_reference(upstream, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    records, lines = _calls(upstream.url, tmp_path)
    ref = _reference(f"sqlite:///{tmp_path / 'ref.db'}", _batches(records))
    store = Store(pg.new_database())
    store.upgrade()
    _child(store.url, _batches(lines), tmp_path)
    _same_reads(store, ref, records)
    store.close()
    ref.close()


def test_a_blank_capture_is_what_init_leaves_but_for_the_line_s_fields() -> None:
    """``capline._blank`` (the decoder's capture, without ``Capture.__init__``): every slot that is
    not one of ``capline.FIELDS`` (the line sets all of those) as ``__init__`` leaves it."""
    from orchard_rec.proxy import capline
    from orchard_rec.proxy.capture import Capture
    from orchard_rec.records import Dialect

    made, blank = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", "s"), capline._blank()
    rest = [s for s in Capture.__slots__ if s not in capline.FIELDS]
    assert rest and set(capline.FIELDS) <= set(Capture.__slots__)
    for slot in rest:
        want, got = getattr(made, slot), getattr(blank, slot)
        if slot == "started":  # a clock: both read it
            assert abs(got - want) < 5
        else:
            assert type(got) is type(want) and got == want, slot
    assert blank.chunks is not capline._blank().chunks  # fresh lists, as ``__init__`` makes them
