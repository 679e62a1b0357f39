"""The writer's fast paths store exactly what the plain ones store (issue 40, round 6).

The same calls (growing sessions in four dialects and four JSON spellings, requests sent again
byte for byte, forks, images, streams, untagged calls, token-mode captures built as the proxy's
database thread builds them) are written by a store taking the fast paths (SQLite: multi-row
inserts with the search index keyed by the rowids they got, the session upsert straight to the
driver; a request the same as its session's previous one taken whole from the previous split,
its skeleton reused) and by one taking none, in the same batches; every table (the search
index's own included) must be identical row for row and byte for byte, rowids included, and so
must what reading and searching give back. The search index holds the same entries (each
term's every place in every call); only how FTS5 groups them into segments differs: the fast path
adds a batch's documents in one ``executemany`` of plain values, the plain one by an ``INSERT ..
SELECT`` each, which makes FTS5 write a segment per call.

``python tests/storage/test_write_paths.py OUT.json`` writes the dump of the workload's database
for the tree on ``PYTHONPATH``: the same file from the tree before these paths is the A/B proof.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from factories import call

from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.records import CallRecord, Dialect
from orchard_rec.storage import Store, layout, search

T0 = 1_790_000_000.123456
PNG = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk" * 40
STYLES = [
    lambda b: json.dumps(b),
    lambda b: json.dumps(b, separators=(",", ":"), ensure_ascii=False),
    lambda b: json.dumps(b, indent=2, ensure_ascii=False),
]


def _msgs(n: int, tag: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": f"You are {tag}. " + "rules " * 60}]
    for k in range(n):
        out.append({"role": "user", "content": f"question {k} of {tag} ünïcödé ☃ " * 3})
        out.append({"role": "assistant", "content": f"answer {k} about orchards " * 4})
    return out


def _body(dialect: str, turns: int, tag: str) -> dict[str, Any]:
    msgs = _msgs(turns, tag)
    tools = [
        {"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
        for i in range(4)
    ]
    if dialect == "chat":
        if turns == 2:  # an image in the conversation
            msgs[1] = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}
        return {"model": "m", "messages": msgs, "tools": tools, "temperature": 0.5}
    if dialect == "completions":
        return {"model": "m", "prompt": "".join(m["content"] for m in msgs), "max_tokens": 8}
    if dialect == "responses":
        items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in msgs[1:]]
        return {"model": "m", "instructions": msgs[0]["content"], "input": items, "tools": tools}
    return {"model": "m", "system": msgs[0]["content"], "messages": msgs[1:], "max_tokens": 64}


def _answer(k: int, prompt: list[int], comp: list[int]) -> dict[str, Any]:
    return {
        "id": f"r{k}",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"reply {k} with words"},
                "finish_reason": "stop",
                "token_ids": comp,
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(comp)},
        "prompt_token_ids": prompt,
    }


def _captured(k: int, session: str, turns: int) -> CallRecord:
    """A token-mode chat call built as the database thread builds it (``IdParser`` below)."""
    body = {"model": "m", "messages": _msgs(turns, session)}
    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", session)
    cap.call_id = f"{k:032x}"
    cap.received_at, cap.first_byte_at, cap.done_at = T0 + k, T0 + k + 0.25, T0 + k + 0.5
    cap.headers = {"content-type": "application/json", "user-agent": "python-httpx/0.28"}
    cap.request, cap.request_raw = body, orjson.dumps(body)
    cap.upstream_request = {**body, "logprobs": True, "return_token_ids": True}
    prompt = list(range(40 * turns + 12))
    comp = list(range(900 + turns, 916 + turns))
    ans = _answer(k, prompt, comp)
    ans["choices"][0]["logprobs"] = {"content": [{"token": "x", "logprob": -0.5, "top_logprobs": []}] * 16}
    cap.status_code, cap.body, cap.bytes_in, cap.bytes_out = 200, orjson.dumps(ans), 900, 700
    return cap.to_record(_IDS)


_IDS = IdParser()


def workload() -> list[list[CallRecord]]:
    """The batches, in order (call ids and times fixed: two runs store the same)."""
    global _IDS
    _IDS = IdParser()
    recs: list[CallRecord] = []
    k = 0
    for d, dialect in enumerate(("chat", "completions", "responses", "messages")):
        for style in range(len(STYLES)):
            sid = f"s-{dialect}-{style}"
            for turns in (0, 1, 1, 2, 3, 3, 3, 5, 4, 6):  # grows, the same again, a fork back
                body = _body(dialect, turns, sid)
                k += 1
                prompt = list(range(30 * turns + 5))
                comp = list(range(500 + turns, 508 + turns))
                recs.append(
                    call(
                        sid,
                        call_id=f"{k:032x}",
                        dialect=Dialect(dialect),
                        received_at=T0 + k,
                        request=body,
                        request_text=STYLES[style](body),
                        upstream_request={**body, "return_token_ids": True} if d == 0 else None,
                        response=_answer(k, prompt, comp),
                        prompt_ids=prompt,
                        completion_ids=comp,
                        logprobs=[-0.25] * len(comp),
                        finish_reason="stop",
                        headers={"user-agent": "x"},
                        usage={"prompt_tokens": len(prompt)},
                        harness="codex" if turns else None,
                        stream=turns == 5,
                        events=[[None, {"choices": [{"delta": {"content": "hi"}}]}]] if turns == 5 else None,
                    )
                )
    for _ in range(3):  # untagged calls, the same request each time
        k += 1
        recs.append(
            call(None, call_id=f"{k:032x}", received_at=T0 + k, request={"model": "m", "messages": []})
        )
    for turns in (1, 1, 1, 2, 2, 3):  # the bench's load: one session, the same body again and again
        k += 1
        recs.append(_captured(k, "captured", turns))
    order = sorted(recs, key=lambda r: (r.call_id[-1], r.call_id))  # sessions interleaved in batches
    out, i = [], 0
    for size in (1, 3, 7, 32, 150):
        out.append(order[i : i + size])
        i += size
    out.append(order[i:])
    return [b for b in out if b]


@contextmanager
def _frozen_clock() -> Iterator[None]:
    """``write_batch``'s ``datetime.now`` (the sessions' created/updated times) fixed."""
    from orchard_rec.storage import store as store_mod

    class Fixed(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Fixed:  # type: ignore[override]
            return cls(2026, 12, 6, 4, 30, 1, 234567, tzinfo=UTC)

    saved = store_mod.datetime
    store_mod.datetime = Fixed  # type: ignore[misc]
    try:
        yield
    finally:
        store_mod.datetime = saved  # type: ignore[misc]


def write(url: str, batches: list[list[CallRecord]], *, plain: bool = False) -> Store:
    store = Store(url)
    store.upgrade()
    if plain:  # none of the fast paths
        store.direct = False
    with _frozen_clock():
        for b in batches:
            store.write_batch(b, known_new=True)
    return store


def dump(path: Path) -> dict[str, list[str]]:
    """Every table's rows (rowids included where a table has them), as text, sorted."""
    con = sqlite3.connect(path)
    out: dict[str, list[str]] = {}
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    for t in names:
        if t in ("search_fts", "search_fts_data", "search_fts_idx", "alembic_version"):
            continue  # the index's segments: below
        if t.startswith("fts_vocab"):
            continue
        try:
            rows = con.execute(f'SELECT rowid, * FROM "{t}"').fetchall()
        except sqlite3.OperationalError:  # WITHOUT ROWID
            rows = con.execute(f'SELECT * FROM "{t}"').fetchall()
        out[t] = sorted(repr(r) for r in rows)
    # what the search index holds: every (term, rowid, column, offset), not how FTS5 cut it into
    # segments (the same documents added by one statement each, or in one batch, are merged into
    # segments differently; an ``optimize`` leaves both the same segments but for their numbers)
    con.execute("CREATE VIRTUAL TABLE temp.fts_vocab USING fts5vocab(main, search_fts, 'instance')")
    out["search_fts (instances)"] = [
        repr(r) for r in con.execute("SELECT * FROM temp.fts_vocab ORDER BY 1, 2, 3, 4")
    ]
    con.close()
    return out


def _search(store: Store, word: str) -> list[str]:
    with store.engine.connect() as conn:
        return sorted({r[0] for r in conn.execute(search.session_match("sqlite", word))})


@contextmanager
def _slow_split() -> Iterator[None]:
    """``split_request`` without its same-text path: the text scanned as before."""

    def again(prev: layout.Split) -> layout.Split:
        out = layout.Split()
        out.text = prev.text
        assert prev.text is not None
        layout._split(prev.text, prev, out, True)
        return out

    saved = layout._again
    layout._again = again
    try:
        yield
    finally:
        layout._again = saved


def test_fast_and_plain_writes_store_the_same(tmp_path: Path) -> None:
    batches = workload()
    assert sum(map(len, batches)) > 100 and max(map(len, batches)) > 64  # more than one insert statement
    fast = write(f"sqlite:///{tmp_path / 'fast.db'}", batches)
    with _slow_split():
        plain = write(f"sqlite:///{tmp_path / 'plain.db'}", workload(), plain=True)
    a, b = dump(tmp_path / "fast.db"), dump(tmp_path / "plain.db")
    assert a.keys() == b.keys() and a["calls"] and a["search_fts (instances)"] and a["search_fts_docsize"]
    for t in a:
        assert a[t] == b[t], t
    for word in ("orchards", "reply", "question", "ünïcödé", "words", "rules"):
        assert _search(fast, word) == _search(plain, word), word
    for sid in sorted({r.session_id for b in batches for r in b if r.session_id}):
        got, want = fast.calls(sid), plain.calls(sid)
        assert [r.call_id for r in got] == [r.call_id for r in want]
        for x, y in zip(got, want, strict=True):
            assert x == y
    fast.close()
    plain.close()


def test_rows_are_numbered_by_lookup_when_the_rowids_are_not_consecutive(tmp_path: Path) -> None:
    """A ``calls`` table whose largest rowid leaves no room (SQLite then picks rowids at random):
    the search index finds each call's rowid by its id, as before."""
    batches = workload()[:3]
    store = Store(f"sqlite:///{tmp_path / 'x.db'}")
    store.upgrade()
    store.write_batch([call(None, call_id="big", request={"model": "m"})])  # untagged: not indexed
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE calls SET rowid = 9223372036854775807 WHERE id = 'big'")
    for b in batches:
        store.write_batch(b, known_new=True)
    con = sqlite3.connect(tmp_path / "x.db")
    n = con.execute("SELECT count(*) FROM search_fts_docsize").fetchone()[0]
    rowids = {r[0] for r in con.execute("SELECT rowid FROM calls WHERE id != 'big'")}
    assert n == sum(1 for b in batches for r in b if r.session_id) and rowids
    docs = {r[0] for r in con.execute("SELECT id FROM search_fts_docsize")}
    assert docs <= rowids
    con.close()
    sids = sorted({r.session_id for b in batches for r in b if r.session_id})
    assert _search(store, "reply") == sids
    store.close()


if __name__ == "__main__":
    import tempfile

    work = Path(tempfile.mkdtemp())
    t = time.process_time()
    write(f"sqlite:///{work / 'w.db'}", workload()).close()
    Path(sys.argv[1]).write_text(json.dumps(dump(work / "w.db"), indent=0, ensure_ascii=False))
    print(f"{time.process_time() - t:.2f} s")


def test_call_times_are_written_as_the_datetime_bind_processor_writes_them() -> None:
    """``_sqlite_epoch`` (no datetime per value) gives the text ``_sqlite_time(_ts(epoch))`` gives,
    roundings to the next second, halves and times before 1970 included."""
    import random

    from orchard_rec.storage.rows import _sqlite_epoch, _sqlite_time, _ts

    rnd = random.Random(40)
    cases = [0.0, 1.0, -1.5, 1e9 + 0.9999995, 1e9 + 0.0000005, 1e9 + 0.0000015, 1_790_000_000.9999996]
    cases += [T0 + k / 7 for k in range(200)]
    cases += [rnd.uniform(-1e9, 4e9) for _ in range(20_000)]
    cases += [int(rnd.uniform(0, 4e9)) + rnd.randrange(0, 2_000_001) / 2_000_000 for _ in range(20_000)]
    cases += [time.time() + k * 1e-7 for k in range(2_000)]
    for e in cases:
        want = _ts(e)
        assert want is not None
        assert _sqlite_epoch(e) == _sqlite_time(want), e


def _strings_before(node: Any, out: list[str], depth: int = 0) -> None:
    """``search._strings`` as it was before round 8 (each value its own call)."""
    if depth > 40:
        return
    if isinstance(node, str):
        if node and not node.startswith("data:"):
            out.append(node)
    elif isinstance(node, dict):
        if "function" in node and isinstance(node.get("function"), dict) and "parameters" in node["function"]:
            return
        if "input_schema" in node:
            return
        for k, v in node.items():
            if k not in search._SKIP_KEYS:
                _strings_before(v, out, depth + 1)
    elif isinstance(node, list):
        for v in node:
            _strings_before(v, out, depth + 1)


def test_search_text_is_the_same_as_before_round_8() -> None:
    """The indexed text of answers and request pieces: the same strings in the same order, nested
    past the depth bound, with skipped keys, tool definitions, data URLs, numbers and nulls."""
    from collections import OrderedDict

    class Text(str):
        pass

    deep: Any = "bottom"
    for k in range(45):
        deep = {"content": [deep, f"level {k}", k, None, True]} if k % 2 else [deep, f"item {k}", 1.5]
    objs: list[Any] = [
        deep,
        {"a": deep},
        [deep],
        _answer(3, [1, 2], [3]),
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": "y"}}}]},
        {"tool": {"input_schema": {"a": "b"}, "name": "n"}, "text": "kept", "id": "skipped"},
        [{"type": "image_url", "image_url": {"url": PNG}}, PNG, "", "data:x", "plain"],
        OrderedDict([("role", "user"), ("content", Text("subclassed")), ("more", ("tuple", "not walked"))]),
        {"choices": [{"message": {"content": "x", "tool_calls": [{"function": {"arguments": "{}"}}]}}]},
        Text("top"),
        42,
        None,
    ]
    for obj in objs:
        for depth in (0, 1, 39, 40, 41):
            want: list[str] = []
            got: list[str] = []
            _strings_before(obj, want, depth)
            search._strings(obj, got, depth)
            assert got == want, (obj if not isinstance(obj, (dict, list)) else type(obj), depth)
        assert search.text_of(obj) == "\n".join(w for w in [*_walk(obj)])


def _walk(obj: Any) -> list[str]:
    out: list[str] = []
    _strings_before(obj, out)
    return out


def test_a_failed_batch_raises_as_sqlalchemy_and_the_next_one_is_stored(tmp_path: Path) -> None:
    """The direct path's driver errors are SQLAlchemy's (``IntegrityError`` for a call stored
    twice under ``known_new``), the batch is rolled back whole, and the writer's connection,
    given up, is replaced: the next batch is stored."""
    import sqlalchemy.exc

    batches = workload()
    store = Store(f"sqlite:///{tmp_path / 'x.db'}")
    store.upgrade()
    store.write_batch(batches[0], known_new=True)
    held = store._wconn
    assert held is not None
    again = [*batches[1], batches[0][0]]  # new calls, then one stored already
    try:
        store.write_batch(again, known_new=True)
    except sqlalchemy.exc.IntegrityError as exc:
        assert "UNIQUE" in str(exc) and "INSERT INTO calls" in str(exc)
    else:
        raise AssertionError("a call stored twice")
    assert store._wconn is None and held.closed
    assert store.count_calls() == len(batches[0])  # nothing of the failed batch
    assert store.write_batch(again) == len(batches[1])  # the lookup skips the stored one
    assert store.count_calls() == len(batches[0]) + len(batches[1])
    store.close()
    assert store._wconn is None
