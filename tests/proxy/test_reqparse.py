"""The request cache (``proxy.reqparse``): always ``orjson.loads``, reusing what it can.

Property tests drive sequences of bodies as agent sessions send them (appends, retries, edits
in the middle, compaction, key order and formatting changes, truncated and invalid bodies)
through one cache and compare every result with ``orjson.loads`` of the same bytes (same
object, same key order, same error), and check ``request_base``'s byte guarantee."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_rec import dialects
from orchard_rec.proxy.reqparse import RequestCache, scan_offsets
from tests.dialects.strategies import SETTINGS

# -- what the sessions send --------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["messages", "input", "content", "a", "é", "\u2028"]), inner, max_size=3
        ),
    ),
    max_leaves=8,
)


@st.composite
def messages(draw: Any) -> Any:
    """A conversation element: usually a chat message (text with escapes and non-ASCII,
    sometimes a nested ``messages`` key), sometimes any JSON value."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    msg: dict[str, Any] = {
        "role": draw(st.sampled_from(["user", "assistant", "tool", "system"])),
        "content": draw(st.text(max_size=30)),
    }
    if draw(st.booleans()):
        msg["extra"] = draw(values)
    return msg


def dump(body: dict[str, Any], style: int) -> bytes:
    """``body`` as different clients write it."""
    if style == 0:
        return orjson.dumps(body)
    if style == 1:
        return json.dumps(body).encode()  # ", " / ": ", \\u escapes
    if style == 2:
        return json.dumps(body, indent=2, ensure_ascii=False).encode()
    if style == 3:
        return (" \n" + json.dumps(body, separators=(" ,", " : "), ensure_ascii=False) + "\r\n").encode()
    return orjson.dumps(body, option=orjson.OPT_INDENT_2)


class Session:
    def __init__(self, key: str, order: list[str], style: int) -> None:
        self.key = key
        self.convo: list[Any] = []
        self.order = order
        self.style = style
        self.others = {"model": "m", "tools": [{"name": "t", "d": "x" * 40}], "stream": False}

    def body(self) -> bytes:
        out: dict[str, Any] = {}
        for k in self.order:
            out[k] = self.convo if k == self.key else self.others[k]
        return dump(out, self.style)


ops = st.one_of(
    st.tuples(st.just("append"), st.lists(messages(), min_size=1, max_size=3)),
    st.tuples(st.just("retry"), st.none()),
    st.tuples(st.just("edit"), st.tuples(st.integers(0, 50), messages())),
    st.tuples(st.just("truncate"), st.integers(0, 50)),
    st.tuples(st.just("compact"), st.lists(messages(), max_size=2)),
    st.tuples(st.just("reorder"), st.permutations(["model", "tools", "stream", "CONVO"])),
    st.tuples(st.just("style"), st.integers(0, 4)),
    st.tuples(st.just("cut"), st.integers(1, 200)),  # a truncated body: invalid JSON
    st.tuples(
        st.just("raw"), st.sampled_from(["dup", "dup-last", "not-array", "nested", "trailing-comma", "array"])
    ),
)


def check(cache: RequestCache, raws: dict[str, bytes], raw: bytes, sid: str | None, call_id: str) -> None:
    try:
        want: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        with pytest.raises(orjson.JSONDecodeError) as got_exc:
            cache.parse(raw, sid, call_id)
        assert str(got_exc.value) == str(exc)
        return
    got, base = cache.parse(raw, sid, call_id)
    assert orjson.dumps(got) == orjson.dumps(want)
    assert type(got) is type(want)
    if base is not None:
        base_id, p, s = base
        b = raws[base_id]
        assert p + s <= len(raw) and p + s <= len(b)
        assert raw == b[:p] + raw[p : len(raw) - s] + b[len(b) - s :]
    raws[call_id] = raw
    if isinstance(got, dict):  # the caller's own: the top-level dict and the conversation list
        for k in ("messages", "input"):
            if isinstance(got.get(k), list):
                got[k].append("mutated")
        got["model"] = "mutated"


def extra(kind: str, s: Session) -> bytes:
    convo = orjson.dumps(s.convo)
    if kind == "dup":
        return b'{"messages":[1],"model":"m","messages":' + convo + b"}"
    if kind == "dup-last":
        return b'{"messages":' + convo + b',"messages":[1, 2]}'
    if kind == "not-array":
        return b'{"messages":' + orjson.dumps(orjson.dumps(s.convo).decode()) + b',"input":' + convo + b"}"
    if kind == "nested":
        return b'{"x":{"messages":' + convo + b'},"messages":[{"messages":' + convo + b"}]}"
    if kind == "trailing-comma":
        return b'{"messages":' + convo[:-1] + (b",]}" if s.convo else b"]}")
    return convo  # a top-level array


@pytest.mark.slow  # 100 random sessions of up to 12 bodies: 1-2 s (the examples below stay fast)
@settings(SETTINGS, max_examples=100)  # the cheapest way to find a new way to be wrong
@given(
    key=st.sampled_from(["messages", "input"]),
    named=st.booleans(),
    steps=st.lists(ops, min_size=1, max_size=12),
)
def test_sequences_parse_as_orjson_does(key: str, named: bool, steps: list[Any]) -> None:
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    s = Session(key, ["model", "tools", key, "stream"], 0)
    raws: dict[str, bytes] = {}
    sid = "sess" if named else None
    last = s.body()
    n = 0
    check(cache, raws, last, sid, "c0")
    for op, arg in steps:
        raw = None
        if op == "append":
            s.convo = s.convo + arg
        elif op == "edit" and s.convo:
            s.convo = list(s.convo)
            s.convo[arg[0] % len(s.convo)] = arg[1]
        elif op == "truncate":
            s.convo = s.convo[: arg % (len(s.convo) + 1)]
        elif op == "compact":
            s.convo = [{"role": "user", "content": "summary"}, *arg]
        elif op == "reorder":
            s.order = [key if k == "CONVO" else k for k in arg]
        elif op == "style":
            s.style = arg
        elif op == "retry":
            raw = last
        elif op == "cut":
            raw = last[: max(0, len(last) - arg)]
        elif op == "raw":
            raw = extra(arg, s)
        if raw is None:
            raw = last = s.body()
        n += 1
        check(cache, raws, raw, sid, f"c{n}")


@pytest.mark.slow  # 50 random histories: ~1 s (test_edit_before_the_end... stays fast)
@SETTINGS
@given(
    st.lists(messages(), min_size=1, max_size=6),
    st.lists(messages(), min_size=1, max_size=4),
    st.integers(0, 4),
)
def test_append_is_reused(history: list[Any], more: list[Any], style: int) -> None:
    """An appended body is read from its base: only the new elements parsed, old objects shared."""
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    one = dump({"model": "m", "messages": history, "stream": True}, style)
    two = dump({"model": "m", "messages": history + more, "stream": True}, style)
    first, _ = cache.parse(one, "s", "a")
    got, base = cache.parse(two, "s", "b")
    assert orjson.dumps(got) == orjson.dumps(orjson.loads(two))
    assert base is not None and base[0] == "a"
    assert base[1] >= len(one) - len(one.rstrip()[-30:]) - 200 or style in (2, 4)
    for old, new in zip(first["messages"], got["messages"], strict=False):
        assert old is new or not isinstance(old, (dict, list))
    again, base = cache.parse(two, "s", "c")
    assert base == ("b", len(two), 0)
    assert orjson.dumps(again) == orjson.dumps(got)


def test_edit_before_the_end_reuses_the_elements_before_it() -> None:
    """Claude Code moves ``cache_control`` to the newest block: the previous last message changes."""
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    hist = [{"role": "user", "content": [{"type": "text", "text": f"t{i}"}]} for i in range(10)]
    hist[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    one = orjson.dumps({"model": "m", "messages": hist, "system": "s"})
    first, _ = cache.parse(one, "s", "a")
    hist2 = [*hist[:-1], {"role": "user", "content": [{"type": "text", "text": "t9"}]}]
    hist2.append(
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}],
        }
    )
    two = orjson.dumps({"model": "m", "messages": hist2, "system": "s"})
    got, base = cache.parse(two, "s", "b")
    assert got == orjson.loads(two)
    assert base is not None and base[0] == "a"
    assert one[: base[1]] == two[: base[1]] and base[1] > len(one) // 2
    assert all(got["messages"][i] is first["messages"][i] for i in range(9))
    assert cache.hits == 1


def test_scan_offsets() -> None:
    raw = b' { "m" : {"messages": [0]}, "messages" : [ 1 , {"a":[2]} ,"\\u00e9\xc3\xa9" ] , "n":2 } '
    key, open_, ends, close = scan_offsets(raw)  # type: ignore[misc]
    assert key == "messages" and raw[open_ - 1 : open_] == b"["
    assert [raw[:e][-1:] for e in ends] == [b"1", b"}", b'"']
    assert raw[close : close + 1] == b"]"
    assert scan_offsets(b'{"messages":[1],"messages":[2]}') is None
    assert scan_offsets(b'{"messages":"x"}') is None
    assert scan_offsets(b"[1]") is None
    assert scan_offsets(b'{"input":[]}') == ("input", 10, [], 10)


def test_bounded_in_bytes() -> None:
    cache = RequestCache(200_000, min_bytes=0, min_reuse=0)
    for i in range(50):
        raw = orjson.dumps({"messages": [{"content": str(i) * 2000}]})
        assert cache.parse(raw, f"s{i}", str(i)).obj == orjson.loads(raw)
        assert cache.size <= 200_000
    off = RequestCache(0)
    raw = orjson.dumps({"messages": [{"content": "x" * 5000}]})
    assert off.parse(raw, "s").obj == orjson.loads(raw) and off.size == 0


def test_deep_nesting_fails_as_orjson_does() -> None:
    """The new elements are parsed at the depth they have in the body: orjson's limit counts alike."""
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    one = b'{"messages":[1]}'
    cache.parse(one, "s")
    for depth in (1020, 1021, 1022, 1023, 1024):
        raw = b'{"messages":[1,' + b"[" * depth + b"]" * depth + b"]}"
        try:
            want = orjson.loads(raw)
        except orjson.JSONDecodeError:
            with pytest.raises(orjson.JSONDecodeError):
                cache.parse(raw, "s")
            continue
        got = cache.parse(raw, "s").obj
        assert _depth(got["messages"][1]) == _depth(want["messages"][1]) == depth


def _depth(v: Any) -> int:
    n = 0
    while isinstance(v, list):
        n += 1
        v = v[0] if v else None
    return n


# -- through the recording core -----------------------------------------------------------------

HEADER_SETS = [
    {"user-agent": "claude-cli/2.1 (external, sdk-cli)", "x-claude-code-session-id": "cc-1"},
    {"user-agent": "codex_exec/0.171.0", "originator": "codex_exec", "session-id": "cx-1"},
    {"user-agent": "opencode/1.0", "x-session-id": "oc-1"},
    {"user-agent": "KimiCLI/1.0"},
    {"user-agent": "pi", "session_id": "pi-1"},
    {"user-agent": "OpenAI/Python 1.99.0"},
    {"user-agent": "OpenAI/Python 1.99.0", "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    {"user-agent": "zeroclaw/0.1"},
    {"user-agent": "hermes/1.0"},
    {},
]
HERMES_TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {}}}
    for n in ("terminal", "delegate_task", "session_search", "skill_view")
]


@pytest.mark.parametrize("headers", HEADER_SETS)
@pytest.mark.parametrize("extra", [{}, {"tools": HERMES_TOOLS}, {"prompt_cache_key": "kimi-sess"}])
def test_harness_identified_once_as_twice(headers: dict[str, str], extra: dict[str, Any]) -> None:
    """``take_body`` re-identifies with the body only when that can change the answer: the
    result is the one identifying with the headers and then with the body always gave."""
    from orchard_rec.harnesses import identify
    from orchard_rec.proxy.core import Call
    from orchard_rec.proxy.identity import public_headers
    from orchard_rec.records import Dialect

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    call = Call(Dialect.CHAT, "POST", "/v1/chat/completions", headers)
    call.identify(headers)
    call.read(orjson.dumps(body), "application/json", "passthrough")
    public = public_headers(headers)
    want = identify(public)
    if want[1] is None or want[1].startswith("trace:"):
        want = identify(public, body)
    assert (call.cap.harness, call.cap.harness_session) == want


def _base_url(proxy_url: str, sid: str | None, dialect: str) -> str:
    root = proxy_url + (f"/s/{sid}" if sid else "")
    return root if dialect == "messages" else root + "/v1"


def _unchanged(cache: RequestCache) -> int:
    """Every cached body's object still equals its bytes' parse (nothing mutated the shared
    objects); the number of bodies that were read from a base."""
    for e in cache.entries():
        assert orjson.dumps(e.obj) == orjson.dumps(orjson.loads(e.raw))
    return cache.hits


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("token", marks=pytest.mark.slow),  # token: translation, 8-14 s loaded
        pytest.param("passthrough", marks=pytest.mark.slow),  # 12 SDK sessions through a proxy: 1.5-3 s
    ],
)
def test_recording_leaves_shared_objects_unchanged(
    mode: str, upstream: Any, proxy_factory: Any, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions in every dialect (named and not, stream and not) through a real proxy: nothing on
    the recording path (translation, plan, harness identification, record, storage) mutates the
    request objects later calls of the session share; the recorded requests are the bodies sent."""
    from e2e.agents import AGENTS

    from orchard_rec.proxy import reqparse, tochat
    from orchard_rec.records import Dialect

    cache = RequestCache(1 << 26, min_bytes=0, min_reuse=0)
    monkeypatch.setattr(reqparse, "cache", cache)
    proxy = proxy_factory(upstream.url, sqlite_url, mode=mode)
    translated = tochat.translator.reused
    for dialect, agent in AGENTS.items():
        for named, stream in ((True, False), (True, True), (False, None)):  # None: alternating
            sid = f"{dialect}-{mode}-{stream}" if named else None
            agent(_base_url(proxy.url, sid, dialect), stream)
    hits = _unchanged(cache)
    assert hits >= 6
    assert (tochat.translator.reused > translated) == (mode == "token")
    proxy.flush()
    store = proxy.store()
    n = 0
    for s in store.sessions():
        for c in store.calls(s.id):
            if c.request_text is not None:
                assert c.request == orjson.loads(c.request_text)
                n += 1
            if mode == "token" and c.dialect in (Dialect.RESPONSES, Dialect.MESSAGES):
                # the translation reused across calls (proxy.tochat) is each call's own
                want = dialects.to_chat(c.dialect, c.request)
                assert c.upstream_request["messages"] == want["messages"]
    assert n >= 12
    assert _unchanged(cache) == hits


@pytest.mark.slow  # a Hugging Face tokenizer: several seconds on a loaded machine
def test_tito_leaves_shared_objects_unchanged(
    upstream: Any, proxy_factory: Any, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2e.agents import AGENTS

    from orchard_rec.proxy import reqparse

    cache = RequestCache(1 << 26, min_bytes=0, min_reuse=0)
    monkeypatch.setattr(reqparse, "cache", cache)
    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo")
    for dialect, agent in AGENTS.items():
        agent(_base_url(proxy.url, f"{dialect}-tito", dialect), None)
    assert _unchanged(cache) >= 3
    proxy.flush()
    assert _unchanged(cache) >= 3


def test_a_body_parsed_whole_is_located_only_when_a_later_one_may_repeat_it() -> None:
    """A miss costs the parse only (a cache that thrashes is no slower than none); another
    conversation with the same opening (the same hash key) does not get its offsets found."""
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    opening = [{"role": "system", "content": "s" * 500}]
    one = orjson.dumps({"messages": [*opening, {"role": "user", "content": "a" * 3000}]})
    other = orjson.dumps({"messages": [*opening, {"role": "user", "content": "b" * 3000}]})
    cache.parse(one)
    (entry,) = cache.entries()
    assert not entry.located
    assert cache.parse(other).base is None
    assert not entry.located and cache.misses == 2
    more = orjson.dumps({"messages": [*orjson.loads(one)["messages"], {"role": "assistant", "content": "x"}]})
    got, base = cache.parse(more)
    assert entry.located and base is not None and base[1] == len(one) - 2
    assert got == orjson.loads(more)


@pytest.mark.parametrize(
    ("base", "raw"),
    [
        # the new bytes close the array and go on with the object's keys
        (b'{"messages":[],"s":1}', b'{"messages":[1],"model":"m","messages":[],"s":1}'),
        (b'{"messages":[0],"s":1}', b'{"messages":[0,1],"model":"m","messages":[],"s":1}'),
        (b'{"messages":[0],"s":1}', b'{"messages":[0],"x":[1],"s":1}'),
        (b'{"input":[0]}', b'{"input":[0],"input":[1]}'),
        # a trailing comma, a missing one, nothing but a comma
        (b'{"messages":[0]}', b'{"messages":[0,1,]}'),
        (b'{"messages":[0]}', b'{"messages":[0 1]}'),
        (b'{"messages":[0]}', b'{"messages":[0,]}'),
        (b'{"messages":[]}', b'{"messages":[,1]}'),
    ],
)
def test_new_bytes_that_are_not_just_values(base: bytes, raw: bytes) -> None:
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    cache.parse(base, "s", "a")
    try:
        want = orjson.loads(raw)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            cache.parse(raw, "s", "b")
        return
    assert orjson.dumps(cache.parse(raw, "s", "b").obj) == orjson.dumps(want)


def test_capture_request_base_names_the_previous_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Capture.request_base``: the call whose body was the base, and the prefix/suffix it shares
    (what the wal spool writes only the bytes between of); after a compaction, only the bytes
    around the conversation."""
    from orchard_rec.proxy import reqparse
    from orchard_rec.proxy.core import Call
    from orchard_rec.records import Dialect

    monkeypatch.setattr(reqparse, "cache", RequestCache(1 << 24, min_bytes=0, min_reuse=0))
    headers = {"content-type": "application/json", "user-agent": "OpenAI/Python 1.99.0"}
    msgs: list[Any] = [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "go"}]
    raws: dict[str, bytes] = {}
    prev: str | None = None
    for turn in range(6):
        if turn == 4:
            msgs = [{"role": "user", "content": "compacted"}]  # history rewritten: no base
        body = {"model": "m", "messages": msgs, "tools": [{"type": "function", "function": {"name": "t"}}]}
        raw = json.dumps(body, ensure_ascii=False).encode()
        call = Call(Dialect.CHAT, "POST", "/s/cap/v1/chat/completions", headers)
        call.name_session("cap")
        call.identify(headers)
        assert call.read(raw, "application/json", "token") == orjson.loads(raw)
        base = call.cap.request_base
        if turn == 0:
            assert base is None
        else:
            assert base is not None and base[0] == prev
            b, (_, p, s) = raws[base[0]], base
            assert raw == b[:p] + raw[p : len(raw) - s] + b[len(b) - s :]
            assert p == raw.index(b"[") + 1 if turn == 4 else p + s > len(raw) // 2, (turn, p, s, len(raw))
        raws[call.cap.call_id] = raw
        prev = call.cap.call_id
        msgs = [*msgs, {"role": "assistant", "content": f"é{turn}"}, {"role": "user", "content": "more"}]


def test_conversations_sharing_an_opening_do_not_displace_each_other() -> None:
    """Unnamed sessions of one task (the same system prompt and first message, so the same hash
    key) alternate: each keeps its own base and reads only its new messages."""
    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    opening = [{"role": "system", "content": "s" * 2000}, {"role": "user", "content": "task"}]
    convos: dict[str, list[Any]] = {"a": list(opening), "b": list(opening)}
    for turn in range(6):
        for name, convo in convos.items():
            convo += [
                {"role": "assistant", "content": f"{name}{turn}" * 200},
                {"role": "user", "content": "ok"},
            ]
            raw = orjson.dumps({"model": "m", "messages": convo})
            got, base = cache.parse(raw)
            assert got == orjson.loads(raw)
            if turn >= 2:  # read from its own previous body: only the two new messages parsed
                assert base is not None and base[1] > len(raw) - 1000


def test_fill_interleaved_with_another_fill_keeps_offsets_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is the process's: two front doors (or two apps' loops in one process) may scan one
    entry's new elements at once. A ``fill`` that another completes meanwhile must not append
    offsets twice (the entry's ``fill`` then fails for good: no later body reuses it)."""
    import orchard_rec.proxy.reqparse as reqparse

    cache = RequestCache(1 << 24, min_bytes=0, min_reuse=0)
    hist = [{"role": "user", "content": f"m{i}"} for i in range(6)]
    cache.parse(orjson.dumps({"model": "m", "messages": hist}), "s", "a")
    more = [*hist, *({"role": "assistant", "content": f"n{i}"} for i in range(6))]
    cache.parse(orjson.dumps({"model": "m", "messages": more}), "s", "b")  # ends known up to 6 of 12
    (entry,) = [e for e in cache.entries() if e.call_id == "b"]
    assert len(entry.ends) < entry.count
    real = reqparse._elements
    nested = []

    def other_thread_first(s: str, i: int) -> Any:
        if not nested:
            nested.append(1)
            assert entry.fill()  # another thread's fill completes while this one scans
        return real(s, i)

    monkeypatch.setattr(reqparse, "_elements", other_thread_first)
    assert entry.fill()
    want = scan_offsets(entry.raw)
    assert want is not None and entry.ends == want[2] and len(entry.ends) == entry.count
    edited = [*more[:8], {"role": "user", "content": "edit"}]  # repeats 8 of the 12 elements
    raw = orjson.dumps({"model": "m", "messages": edited})
    hits = cache.hits
    got = cache.parse(raw, "s", "c")
    assert got.obj == orjson.loads(raw) and got.base is not None and cache.hits == hits + 1
