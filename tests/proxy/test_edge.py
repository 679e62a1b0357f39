"""The request path's per-call helpers (issue 40): headers filtered by a per-spelling table, call
ids handed out from a block; each gives what the plain computation gives."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from orchard_rec.proxy import capture
from orchard_rec.proxy.capture import new_call_id
from orchard_rec.proxy.edge import CLIENT_AUTH, HOP, RESP_DROP, Names


def _headers(n: int = 0) -> CIMultiDictProxy[str]:
    h = CIMultiDict(
        [
            ("Host", "x"),
            ("Accept", "*/*"),
            ("accept-encoding", "gzip"),
            ("User-Agent", "OpenAI/Python 2.24.0"),
            ("Authorization", "Bearer sk"),
            ("X-Api-Key", "k"),
            ("Content-Type", "application/json"),
            ("X-Extra", "1"),
            ("x-extra", "2"),  # repeated, in another spelling
            ("Connection", "keep-alive"),
            ("X-Orchard-Session", "s"),
        ]
    )
    for i in range(n):
        h.add(f"X-Spelling-{i}", str(i))
    return CIMultiDictProxy(h)


@pytest.mark.parametrize("names", [HOP, HOP | CLIENT_AUTH, RESP_DROP])
def test_names_filter_as_lower_casing_each_name(names: frozenset[str]) -> None:
    f = Names(names)
    for _ in range(3):  # learning, then from the table
        h = _headers()
        assert f.kept(h) == {k: v for k, v in h.items() if k.lower() not in names}
        assert f.pairs(h) == [(k, v) for k, v in h.items() if k.lower() not in names]


def test_names_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Names, "BOUND", 8)
    f = Names(HOP)
    h = _headers(20)  # more spellings than the table holds: lower-cased per call, as before
    want = {k: v for k, v in h.items() if k.lower() not in HOP}
    assert f.kept(h) == want and f.kept(h) == want
    assert f.pairs(h) == [(k, v) for k, v in h.items() if k.lower() not in HOP]
    assert len(f.dropped) <= 8


def test_call_ids_are_random_uuid4s() -> None:
    ids = [new_call_id() for _ in range(3000)]  # several blocks
    assert len(set(ids)) == len(ids)
    for i in ids:
        u = uuid.UUID(hex=i)
        assert u.hex == i and u.version == 4 and u.variant == uuid.RFC_4122


def test_call_ids_from_threads_and_after_fork() -> None:
    got: list[list[str]] = [[] for _ in range(4)]

    def take(out: list[str]) -> None:
        out.extend(new_call_id() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for g in got for i in g]
    assert len(set(every)) == len(every) == 8000
    new_call_id()
    assert capture._ids  # a block is being handed out
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (``serve --workers``) must not hand out what its parent will
        os.write(w, b"empty" if not capture._ids else b"kept")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 16) == b"empty"
