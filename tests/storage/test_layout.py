"""The linear layout: exact request text back for every dialect, deltas on earlier calls,
forks and drift as new bases, and per-call storage that grows with what is new."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import orjson
import pytest
from factories import call, run_threads
from sqlalchemy import create_engine, func, select, text

from orchard_rec.records import Dialect
from orchard_rec.storage import Store, layout
from orchard_rec.storage.models import Blob, Call

SYSTEM = "You are a careful engineer. " * 40


def _msgs(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for k in range(n):
        out.append({"role": "user", "content": f'turn {k}: é ☃ \u2028 "quoted" \\ back'})
        out.append({"role": "assistant", "content": f"answer {k} " * 20})
    return out


# Whitespace, key order and escapes as different clients write them.
STYLES = [
    lambda b: json.dumps(b),  # Python json / httpx default: ", " and ": ", \\u escapes
    lambda b: json.dumps(b, separators=(",", ":"), ensure_ascii=False),  # compact, raw UTF-8
    lambda b: json.dumps(b, indent=2, ensure_ascii=False),  # pretty
    lambda b: "\n  " + json.dumps(dict(reversed(list(b.items()))), separators=(" ,", " : ")) + " \n",
]


def _bodies(dialect: str, turns: int) -> dict[str, Any]:
    msgs = _msgs(turns)
    tools = [
        {"type": "function", "function": {"name": f"tool{i}", "parameters": {"type": "object"}}}
        for i in range(5)
    ]
    if dialect == "chat":
        return {"model": "m", "messages": msgs, "tools": tools, "temperature": 0.5, "stream": False}
    if dialect == "completions":
        return {"model": "m", "prompt": "".join(m["content"] for m in msgs), "max_tokens": 8}
    if dialect == "responses":
        items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in msgs[1:]]
        return {"model": "m", "instructions": SYSTEM, "input": items, "tools": tools, "store": False}
    return {
        "model": "m",
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": msgs[1:],
        "max_tokens": 64,
    }


@pytest.mark.parametrize("dialect", ["chat", "completions", "responses", "messages"])
@pytest.mark.parametrize("style", range(len(STYLES)))
def test_request_text_comes_back_byte_for_byte(dialect: str, style: int) -> None:
    prev = None
    blobs: dict[bytes, str] = {}
    for turns in (1, 2, 3, 5):
        sent = STYLES[style](_bodies(dialect, turns))
        split = layout.split_request(sent, prev)
        blobs.update(split.blobs)
        assert layout.join_request(split.literals, split.refs, blobs) == sent
        assert json.loads(sent) == json.loads(layout.join_request(split.literals, split.refs, blobs))
        if prev is not None and dialect != "completions":  # earlier messages are recognised, not re-hashed
            assert len(split.blobs) < len(split.refs)
        prev = split


def test_malformed_or_odd_text_is_kept_whole() -> None:
    for sent in ("[1, 2]", '{"a": [1, 2, 3], "b": "x"}', '{"messages": []}', '{"messages": "just text"}'):
        split = layout.split_request(sent)
        assert layout.join_request(split.literals, split.refs, split.blobs) == sent


def _post(url: str, raw: bytes) -> bytes:
    req = urllib.request.Request(url, data=raw, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


@pytest.mark.parametrize("dialect", ["chat", "completions", "responses", "messages"])
def test_the_proxy_records_the_exact_bytes_and_what_the_client_received(
    upstream, proxy_factory, sqlite_url, dialect
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token")
    path = {
        "chat": "chat/completions",
        "completions": "completions",
        "responses": "responses",
        "messages": "messages",
    }
    sent, got = [], []
    for turns, style in ((1, 0), (2, 1), (3, 3)):
        body = _bodies(dialect, turns)
        body.pop("tools", None)  # the demo model's tool parser is not under test here
        raw = STYLES[style](body).encode()
        sent.append(raw)
        got.append(json.loads(_post(f"{proxy.url}/s/exact-{dialect}/v1/{path[dialect]}", raw)))
    proxy.flush()
    store = proxy.store()
    recs = store.calls(f"exact-{dialect}")
    assert [r.request_text.encode() for r in recs] == sent  # type: ignore[union-attr]
    assert [r.request for r in recs] == [json.loads(s) for s in sent]
    assert [r.response for r in recs] == got  # as the client received it: no injected ids
    for r in recs:
        assert r.prompt_ids and r.completion_ids and r.upstream_request["return_token_ids"] is True
    store.close()


def test_ids_are_deltas_on_the_previous_call_and_forks_start_a_new_base(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    base = list(range(1000, 1400))
    a = call("d", prompt_ids=base, completion_ids=[7, 8, 9], logprobs=[-0.5, -0.25, -1.0], received_at=1.0)
    b = call(
        "d", prompt_ids=[*base, 7, 8, 9, 50, 51], completion_ids=[10], logprobs=[-0.125], received_at=2.0
    )
    fork = call("d", prompt_ids=[*base[:100], 99, 98], completion_ids=[1], logprobs=[-0.1], received_at=3.0)
    fresh = call("d", prompt_ids=[5, 6], completion_ids=[2], logprobs=[-0.3], received_at=4.0)
    after = call("d", prompt_ids=[5, 6, 2, 3], completion_ids=[4], logprobs=[-0.2], received_at=5.0)
    store.write_batch([a, b])
    store.write_batch([fork])
    store.write_batch([fresh, after])
    got = store.calls("d")
    for want, back in zip([a, b, fork, fresh, after], got, strict=True):
        assert back.prompt_ids == want.prompt_ids and back.completion_ids == want.completion_ids
        assert back.completion_logprobs == pytest.approx(want.completion_logprobs, abs=1e-7)
    assert got[0].completion_logprobs == (-0.5, -0.25, -1.0)  # float32 when exact
    assert store.get_call(after.call_id).prompt_ids == (5, 6, 2, 3)  # type: ignore[union-attr]
    eng = create_engine(db_url)
    with eng.connect() as c:
        sizes = dict(c.execute(select(Call.id, func.length(Call.prompt_ids))).all())
    eng.dispose()
    assert sizes[b.call_id] < 64  # 2 new ids + the reference, not 405 ids
    assert sizes[fork.call_id] < 64  # shares 100 ids with the previous call: a new base
    # a new writer (restart) continues the session from the database
    store2 = Store(db_url)
    nxt = call("d", prompt_ids=[5, 6, 2, 3, 4, 11], completion_ids=[12], logprobs=[-0.5], received_at=6.0)
    store2.write_batch([nxt])
    assert store2.calls("d")[-1].prompt_ids == (5, 6, 2, 3, 4, 11)
    store.close()
    store2.close()


def test_messages_are_stored_once_per_session(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    for turns in range(1, 21):
        body = _bodies("chat", turns)
        store.write_batch([call("m", request=body, request_text=json.dumps(body), received_at=float(turns))])
    eng = create_engine(db_url)
    with eng.connect() as c:
        n_blobs = c.execute(select(func.count()).select_from(Blob)).scalar_one()
        blob_bytes = c.execute(select(func.sum(func.length(Blob.data)))).scalar_one()
        refs = c.execute(select(func.sum(func.length(Call.request_refs)))).scalar_one()
        if store.dialect == "sqlite":
            c.execute(text("select 1"))
    eng.dispose()
    final = json.dumps(_bodies("chat", 20))
    assert n_blobs == 1 + 2 * 20 + 1  # system, each turn's two messages, the tool list
    assert blob_bytes < 1.1 * len(final.encode())
    assert refs < 20 * 100  # each call references its predecessor's list: a few new digests each
    back = store.calls("m")
    assert [r.request_text for r in back] == [json.dumps(_bodies("chat", t)) for t in range(1, 21)]
    store.close()


@pytest.mark.parametrize("dialect", ["chat", "completions", "responses", "messages"])
def test_a_writer_without_the_session_in_its_cache_stores_what_one_with_it_does(
    db_url: str, tmp_path: Any, dialect: str
) -> None:
    """More sessions than the writer's state cache holds: each call reads the session back from the
    database (its ids, its last request's split rebuilt from its parts) and stores the same deltas,
    blobs and bases a writer that had kept it in memory stores."""
    from orchard_rec.storage.delta import Encoder

    def run(url: str, cold: bool) -> tuple[list[Any], list[Any]]:
        store = Store(url)
        store.upgrade()
        if cold:
            store.encoder = Encoder(0)  # nothing kept: every call a miss
        ids: list[int] = list(range(100, 400))
        for turns in range(1, 9):
            body = _bodies(dialect, turns)
            comp = [1000 + turns, 2000 + turns]
            store.write_batch(
                [
                    call(
                        "w",
                        dialect=Dialect(dialect),
                        request=body,
                        request_text=STYLES[turns % 2](body),
                        prompt_ids=ids,
                        completion_ids=comp,
                        received_at=float(turns),
                    )
                ]
            )
            ids = [*ids, *comp, 7, 8, 9]
        with store.engine.connect() as c:
            calls = [
                (len(r[0]), r[1], r[2], r[3])
                for r in c.execute(
                    select(
                        Call.prompt_ids, Call.request_refs, Call.request_skel, Call.upstream_refs
                    ).order_by(Call.seq)
                )
            ]
            blobs = sorted(
                tuple(r) for r in c.execute(select(Blob.digest, Blob.data, Blob.base, Blob.base_len))
            )
        back = [(r.request_text, r.prompt_ids) for r in store.calls("w")]
        store.close()
        assert back[-1][0] == STYLES[0](_bodies(dialect, 8))
        return [(*row[:1], *row[3:]) for row in calls] + back, blobs

    cold_url = db_url if db_url.startswith("postgresql") else f"sqlite:///{tmp_path / 'cold.db'}"
    warm_url = f"sqlite:///{tmp_path / 'warm.db'}"
    cold, warm = run(cold_url, True), run(warm_url, False)
    assert cold[1] == warm[1]
    assert cold[0] == warm[0]


def test_calls_json_has_each_call_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from orchard_rec.cli import app

    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = Store(url)
    store.upgrade()
    body = _bodies("messages", 2)
    resp = {"type": "message", "content": [{"type": "text", "text": "hé"}]}
    store.write_batch([call("w", request=body, request_text=json.dumps(body, indent=1), response=resp)])
    store.close()
    r = CliRunner().invoke(app, ["calls", "w", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    [row] = json.loads(r.output)
    assert row["request"] == body and row["response"] == resp


def test_lazy_session_reads_decode_one_call_at_a_time_and_match_the_lists(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    for sid in ("la", "lb", "lc"):
        ids: list[int] = list(range(50))
        for k in range(6):
            store.write_batch(
                [
                    call(
                        sid,
                        prompt_ids=ids,
                        completion_ids=[k, k + 1],
                        logprobs=[-0.5, -0.25],
                        received_at=float(k),
                    )
                ]
            )
            ids = [*ids, k, k + 1, 7, 8] if k != 3 else [1, 2, 3]  # a break in the middle: a new base
    eager = [
        (s.id, [(c.call_id, c.prompt_ids, c.completion_ids) for c in calls])
        for s, calls in store.iter_sessions_calls()
    ]
    lazy = []
    for k, (s, calls) in enumerate(store.iter_sessions_calls(lazy=True)):
        if k == 1:
            next(calls)  # a consumer that leaves a session half read
            continue
        lazy.append((s.id, [(c.call_id, c.prompt_ids, c.completion_ids) for c in calls]))
    assert [e for k, e in enumerate(eager) if k != 1] == lazy
    assert [s for s, _ in eager] == ["la", "lb", "lc"]
    store.close()


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
def test_ids_built_on_the_previous_prompt_are_stored_as_the_same_deltas(db_url: str) -> None:
    """``delta.Ids`` (the proxy's id parser: previous prompt + new ids) lets the writer skip the
    comparison; only when its base is the session's last prompt, and the result is the same."""
    from dataclasses import replace

    from orchard_rec.storage.delta import Ids
    from orchard_rec.storage.spool import record_from_json, record_to_json

    store = Store(db_url)
    store.upgrade()
    p1 = Ids(range(1000, 1400))
    p2 = Ids(p1 + (7, 8, 9, 50), p1)  # the completion, then new ids: compared past the known part
    p3 = Ids(p2 + (51,), p2)
    stray = Ids(range(5000, 5400))  # not the base the writer holds for the session next
    p4 = Ids(stray + (1,), stray)
    recs = [
        call("k", prompt_ids=list(p), completion_ids=c, received_at=float(i))
        for i, (p, c) in enumerate([(p1, [7, 8, 9]), (p2, [10]), (p3, [11]), (p4, [2])])
    ]
    recs = [replace(r, prompt_ids=p) for r, p in zip(recs, (p1, p2, p3, p4), strict=True)]
    assert record_from_json(record_to_json(recs[1])).prompt_ids == tuple(p2)  # the spool takes Ids
    store.write_batch(recs[:2])
    store.write_batch(recs[2:])
    got = store.calls("k")
    assert [g.prompt_ids for g in got] == [tuple(p) for p in (p1, p2, p3, p4)]
    eng = create_engine(db_url)
    with eng.connect() as c:
        sizes = dict(c.execute(select(Call.id, func.length(Call.prompt_ids))).all())
    eng.dispose()
    assert sizes[recs[1].call_id] < 64 and sizes[recs[2].call_id] < 64
    assert sizes[recs[3].call_id] > 1600  # its base was never this session's: stored whole
    store.close()


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_tito_prompts_sharing_a_buffer_take_their_prefix_by_identity(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tito's prompts: the branch's ``Ids`` (prompt + completion) extended by the new ids, in one
    buffer: the writer takes the previous prompt as their prefix without comparing the two."""
    from dataclasses import replace

    from orchard_rec.storage import delta
    from orchard_rec.storage.delta import Ids

    store = Store(db_url)
    store.upgrade()
    p1 = Ids(range(1000, 1400))
    p2 = p1.extend([7, 8, 9]).extend([50, 51])  # the completion, then the new ids
    p3 = p2.extend([10]).extend([52])
    recs = [
        call("t", prompt_ids=list(p), completion_ids=c, received_at=float(i))
        for i, (p, c) in enumerate([(p1, [7, 8, 9]), (p2, [10]), (p3, [11])])
    ]
    recs = [replace(r, prompt_ids=p) for r, p in zip(recs, (p1, p2, p3), strict=True)]
    store.write_batch(recs[:1])
    compared: list[int] = []
    real = delta.layout.common_prefix
    monkeypatch.setattr(delta.layout, "common_prefix", lambda a, b: compared.append(len(a)) or real(a, b))
    store.write_batch(recs[1:])
    assert max(compared, default=0) < 100  # only the completions and request refs: never 400 ids
    assert [g.prompt_ids for g in store.calls("t")] == [tuple(p) for p in (p1, p2, p3)]
    eng = create_engine(db_url)
    with eng.connect() as c:
        sizes = dict(c.execute(select(Call.id, func.length(Call.prompt_ids))).all())
    eng.dispose()
    assert sizes[recs[1].call_id] < 64 and sizes[recs[2].call_id] < 64
    store.close()


def test_a_split_on_the_previous_one_equals_a_split_from_scratch() -> None:
    """Runs of the previous call's messages are taken at once (one text comparison): the result is
    what a split without the previous one gives, for growth, edits, drops and odd spacing."""
    msgs = [{"role": "user" if k % 2 else "assistant", "content": f"message {k} " * 20} for k in range(40)]

    def body(ms: list[Any], sep: str = ",", tools: bool = True) -> str:
        inner = sep.join(json.dumps(m) for m in ms)
        extra = ',"tools":[' + ",".join(['{"name":"t","description":"' + "d" * 300 + '"}']) + "]"
        return '{"model":"m","messages":[' + inner + "]" + (extra if tools else "") + "}"

    texts = [
        body(msgs[:10]),
        body(msgs[:12]),
        body(msgs[:12]),  # the same again
        body(msgs[:3] + msgs[4:14]),  # one dropped
        body(msgs[:2] + [{"role": "user", "content": "edited"}] + msgs[3:16]),  # one edited
        body(msgs[:16], sep=", "),  # other spacing
        body(msgs[:20], tools=False),
        '{"messages":[' + json.dumps(msgs[0]) + "]," + '"messages":[' + json.dumps(msgs[1]) + "]}",
        body(msgs[:25]),
    ]
    prev = None
    for t in texts:
        got = layout.split_request(t, prev)
        want = layout.split_request(t)
        assert got.literals == want.literals and got.refs == want.refs and got.pieces == want.pieces
        assert got.starts == want.starts and got.first == want.first
        assert (
            layout.join_request(got.literals, got.refs, {h: p for ps in got.pieces.values() for p, h in ps})
            == t
        )
        prev = got


@pytest.mark.parametrize("dialect", ["chat", "completions", "responses", "messages"])
@pytest.mark.parametrize("style", range(len(STYLES)))
def test_a_split_rebuilt_from_its_parts_equals_the_split_of_the_text(dialect: str, style: int) -> None:
    """A session read back from the database: its last request's split is rebuilt from the stored
    literals, references and blob texts without parsing the text again, and is the same split."""
    keys = '{"messages":[{"a":1},{"b":"' + "x" * 300 + '"}],"messages":[{"c":2}],"tools":"' + "t" * 300 + '"}'
    odd = [keys, '{"k\\"\\":[":"' + "v" * 300 + '","input":"' + "i" * 300 + '","input":[]}']
    for sent in [STYLES[style](_bodies(dialect, turns)) for turns in (0, 1, 4)] + odd:
        want = layout.split_request(sent, deltas=False)
        texts = {h: p for ps in want.pieces.values() for p, h in ps}
        got = layout.rejoin(want.literals, want.refs, texts)
        assert got is not None, sent[:80]
        assert got.text == sent and got.literals == want.literals and got.refs == want.refs
        assert got.starts == want.starts and got.pieces == want.pieces
        # an empty array leaves no trace in the parts; it has no run for the next split either
        kept = [k for k in want.pieces if want.first.get(k, -1) >= 0]
        assert {k: got.first.get(k, -1) for k in kept} == {k: want.first[k] for k in kept}
        assert not got.blobs and not got.bases
    assert layout.rejoin(["{", "junk", "}"], [b"h", b"g"], {b"h": "1", b"g": "2"}) is None


@pytest.mark.parametrize(
    ("asked", "sent"),
    [({"logprobs": False}, {"logprobs": 0}), ({"logprobs": 1}, {"logprobs": True}), ({"t": 1}, {"t": 1.0})],
)
def test_an_upstream_value_equal_to_the_requests_but_of_another_type_is_kept(
    db_url: str, asked: dict[str, Any], sent: dict[str, Any]
) -> None:
    """Token mode sends ``logprobs: 0`` to a completions client's ``logprobs: false`` (and ``true``
    to a chat client's ``1``): equal in Python, not the same JSON. The upstream request read back
    is what was sent."""
    request = {"model": "m", "prompt": "hi", **asked}
    upstream = {**request, **sent, "return_token_ids": True}
    s = Store(db_url)
    s.upgrade()
    r = call(dialect=Dialect.COMPLETIONS, request=request, upstream_request=upstream)
    s.write_batch([r])
    got = s.get_call(r.call_id)
    assert got is not None
    assert orjson.dumps(got.upstream_request) == orjson.dumps(upstream)


def test_compress_from_many_threads_at_once_round_trips() -> None:
    """Several proxies' writer and spool threads compress at once (a shared ZstdCompressor wrote
    corrupt frames: "Dictionary is corrupted" when a replica read them back)."""

    def work(k: int) -> None:
        for i in range(300):
            obj = [f"{k}-{i}-" + "x" * (i * 37 % 5000), {"k": k, "i": i}]
            assert layout.decompress(layout.compress(obj)) == obj

    run_threads(work, 8)


def test_a_deep_chain_is_read_back_cold_in_a_few_queries(db_url: str) -> None:
    """A session's last call read by a new process (a restarted writer continuing the session, a
    single call looked up): its ids and its request's digests are deltas on each earlier call in
    turn, 60 deep here. Read back equal, in a number of queries that does not grow with the depth
    (one query a link was ~80 ms at 180 calls of a 140k-token session, issue 16)."""
    from sqlalchemy import event

    store = Store(db_url)
    store.upgrade()
    ids: list[int] = list(range(1000, 1300))
    want = []
    for t in range(1, 61):
        body = _bodies("chat", t)
        r = call(
            "deep",
            prompt_ids=ids,
            completion_ids=[t, t + 1],
            request=body,
            request_text=json.dumps(body),
            received_at=float(t),
        )
        store.write_batch([r])
        want.append(r)
        ids = [*ids, t, t + 1, *range(5000 + 10 * t, 5005 + 10 * t)]
    store.close()

    def count(fn: Any) -> tuple[Any, int]:
        cold = Store(db_url)
        seen: list[str] = []
        event.listen(cold.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
        try:
            return fn(cold), len(seen)
        finally:
            cold.close()

    last = want[-1]
    got, n = count(lambda s: s.prompt_ids(last.call_id))
    assert got == last.prompt_ids and n <= 4, n
    got, n = count(lambda s: s.get_call(last.call_id))
    assert got.prompt_ids == last.prompt_ids and got.request_text == last.request_text  # type: ignore[union-attr]
    assert n <= 12, n
    # a new writer continues the session: its state is read back from the database once
    nxt = call("deep", prompt_ids=[*ids], completion_ids=[1], received_at=61.0)
    _, n = count(lambda s: s.write_batch([nxt]))
    assert n <= 16, n
    back = Store(db_url)
    assert back.calls("deep")[-1].prompt_ids == tuple(ids)
    assert [c.prompt_ids for c in back.calls("deep")[:-1]] == [r.prompt_ids for r in want]
    back.close()


def test_common_prefix_of_ids_tuples_lists_and_arrays_alike() -> None:
    """``layout.common_prefix`` gives the naive answer whatever mix of sequences it is handed: a
    ``delta.Ids`` against a tuple (a prompt read back from the database) is compared as 4-byte arrays,
    an id past 4 bytes falls back to tuples, and a list against a tuple no longer reads as 0."""
    import random
    from array import array

    from orchard_rec.storage.delta import Ids

    def naive(x: list[int], y: list[int]) -> int:
        i = 0
        while i < min(len(x), len(y)) and x[i] == y[i]:
            i += 1
        return i

    rng = random.Random(7)
    for _ in range(300):
        base = [rng.randrange(5) for _ in range(rng.randrange(40))]
        x = base + [rng.randrange(5) for _ in range(rng.randrange(4))]
        y = base[: rng.randrange(len(base) + 1)] + [rng.randrange(5) for _ in range(rng.randrange(4))]
        for xa in (Ids(x), tuple(x), list(x), array("i", x)):
            for ya in (Ids(y), tuple(y), list(y), (*y, 1 << 40), array("i", y)):
                assert layout.common_prefix(xa, ya) == naive(list(xa), list(ya)), (x, y)


def test_tito_prompt_ids_as_4_byte_arrays_are_derived_as_before() -> None:
    """A tito prompt reaches the writer as a ``delta.Ids`` (``capture._ints``); the upstream body's
    ``prompt`` list is still known for the recorded ids, compared as arrays."""
    from orchard_rec.proxy.capture import _ints
    from orchard_rec.storage.delta import Ids

    ids = [(k * 7919) % 150_000 for k in range(5000)]
    got = _ints(list(ids))
    assert isinstance(got, Ids) and got == ids and list(got) == ids
    assert _ints([1.0] * 300) == (1,) * 300 and _ints(["a"] * 300) is None  # as before: int() each
    assert _ints([2**40] * 300) == (2**40,) * 300  # past 4 bytes: a tuple
    up = {"model": "m", "prompt": list(ids), "max_tokens": 9}
    recipe, _ = layout.derive_upstream(up, {"model": "m"}, got)
    assert ["prompt", "p"] in recipe["k"]
    other = _ints([*ids[:-1], 1])
    recipe, _ = layout.derive_upstream(up, {"model": "m"}, other)
    assert ["prompt", "p"] not in recipe["k"]


def test_events_json_is_the_client_views_dump_and_leaves_the_events_as_they_were() -> None:
    """The writer process's events column (``events_json``, nulling in place) is the bytes of the
    copies ``client_view`` makes, for every kind of event and each injected set; the events are
    unchanged after."""
    first = {"id": "c", "prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    token = {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "delta": {"content": "x"},
                "logprobs": {"content": [{"logprob": -0.1}]},
                "token_ids": [7],
            },
            {"index": 1, "prompt_token_ids": [3], "token_ids": None, "logprobs": None},
            "not a choice",
        ],
    }
    events: list[Any] = [
        [None, first],
        [None, token],
        ["named", {"choices": {"not": "a list"}, "prompt_token_ids": None}],
        [None, "[DONE]"],
        ["only a name"],
        ("a", {"prompt_token_ids": [9]}),
        [None, [1, 2]],
    ]
    before = orjson.dumps(events)
    for ids in (False, True):
        for lp in (False, True):
            _, view, _ = layout.client_view("chat", None, events, {}, {}, None, None, (ids, lp))
            assert layout.events_json(events, ids, lp) == orjson.dumps(view)
            assert layout.compress_json(layout.events_json(events, ids, lp)) == layout.compress(view)
            assert orjson.dumps(events) == before
