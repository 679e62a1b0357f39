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


def test_session_from_the_opening_is_hashed_once_per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    import orjson

    from orchard_rec.proxy import identity
    from orchard_rec.proxy.reqparse import RequestCache
    from orchard_rec.records import Dialect

    def plain(body: dict) -> str:  # type: ignore[type-arg]
        opening = [m["content"] for m in body["messages"][:2]]
        return "c-" + hashlib.sha256(orjson.dumps(opening)).hexdigest()[:32]

    monkeypatch.setattr(identity, "_openings", identity._Openings())
    system = {"role": "system", "content": "You are an agent. " * 400}
    msgs = [system, {"role": "user", "content": "go"}]
    cache = RequestCache(64 * 1024 * 1024)
    bodies = []
    for turn in range(4):  # one session growing: the cache hands out the same message objects
        msgs = msgs + [
            {"role": "assistant", "content": f"step {turn}"},
            {"role": "user", "content": "x" * 9000},
        ]
        raw = orjson.dumps({"model": "m", "messages": msgs})
        body, _ = cache.parse(raw, "s1", f"call{turn}")
        bodies.append(body)
        assert identity.derive_session(None, None, Dialect.CHAT, body) == plain(body)
    assert bodies[1]["messages"][0] is bodies[2]["messages"][0]  # shared: the digest was kept
    assert len(identity._openings.entries) == 1 and identity._openings.stats()["hits"] == 3  # one digest
    # equal content in new objects: the same id; another opening: another id
    fresh = orjson.loads(orjson.dumps(bodies[-1]))
    assert identity.derive_session(None, None, Dialect.CHAT, fresh) == plain(bodies[-1])
    other = {"messages": [{"role": "system", "content": "Other. " * 500}, {"role": "user", "content": "go"}]}
    assert identity.derive_session(None, None, Dialect.CHAT, other) == plain(other) != plain(fresh)
    # bounded in bytes
    monkeypatch.setattr(identity._Openings, "MAX_BYTES", 64 * 1024)
    for i in range(40):
        b = {
            "messages": [
                {"role": "system", "content": f"{i} " + "y" * 8000},
                {"role": "user", "content": "go"},
            ]
        }
        assert identity.derive_session(None, None, Dialect.CHAT, b) == plain(b)
    assert identity._openings.bytes <= 64 * 1024
    assert sum(e[2] for e in identity._openings.entries.values()) == identity._openings.bytes


def test_a_small_opening_is_hashed_once_and_kept_by_its_bytes_within_a_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small opening's objects are new each call (the request cache keeps no small body): its digest
    is kept by its encoded bytes, the same id as hashing it; the bytes kept stay under the bound."""
    import hashlib

    import orjson

    from orchard_rec.proxy import identity
    from orchard_rec.records import Dialect

    def plain(body: dict) -> str:  # type: ignore[type-arg]
        return (
            "c-" + hashlib.sha256(orjson.dumps([m["content"] for m in body["messages"][:1]])).hexdigest()[:32]
        )

    monkeypatch.setattr(identity, "_openings", identity._Openings())
    monkeypatch.setattr(identity._Openings, "SMALL_MAX_BYTES", 4096)
    ops = identity._openings
    for _ in range(3):  # new objects each time, equal bytes
        body = orjson.loads(b'{"model":"m","messages":[{"role":"user","content":"hello there"}]}')
        assert identity.derive_session(None, None, Dialect.CHAT, body) == plain(body)
    assert (ops.stats()["hits"], ops.stats()["misses"], len(ops.small), ops.entries) == (2, 1, 1, {})
    for i in range(200):
        body = {"messages": [{"role": "user", "content": f"question {i} " + "z" * 50}]}
        assert identity.derive_session(None, None, Dialect.CHAT, body) == plain(body)
    assert 0 < ops.small_bytes <= 4096 and ops.small_bytes == sum(map(len, ops.small))
    assert ops.stats()["bytes"] == ops.small_bytes and ops.stats()["entries"] == len(ops.small)
