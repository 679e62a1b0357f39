"""Token-id arrays cut at byte level (proxy/idcut.py): the same answer as parsing the whole body."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.idcut import ARROW_BYTES, MIN_BYTES, IdParser, cut, int_array
from orchard_rec.proxy.token import plan_for
from orchard_rec.records import Dialect

PROMPT = list(range(1000, 1000 + MIN_BYTES // 4))  # large enough to be cut


def answer(prompt: list[int] = PROMPT, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": {"content": [{"token": "]", "logprob": -0.5, "bytes": [93], "top_logprobs": []}]},
                "finish_reason": "stop",
                "token_ids": [7, 8],
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": 2, "total_tokens": len(prompt) + 2},
        "prompt_token_ids": prompt,
        **extra,
    }


def whole_strip(data: bytes, logprobs: bool = True) -> bytes:
    """The reference: parse everything, null what was injected, re-encode."""
    obj = orjson.loads(data)
    obj["prompt_token_ids"] = None
    for c in obj["choices"]:
        c["token_ids"] = None
        if logprobs:
            c["logprobs"] = None
    return orjson.dumps(obj)


def test_cut_finds_vllm_arrays_and_nothing_else() -> None:
    trap = 'the model wrote "prompt_token_ids": [1, 2] and "token_ids":[3] here'
    data = orjson.dumps(answer(content=trap))
    c = cut(data)
    assert c is not None
    rest, obj, spans = c
    assert obj["choices"][0]["message"]["content"] == trap
    assert obj["prompt_token_ids"] is None and obj["choices"][0]["token_ids"] is None
    assert [p for p, _, _ in spans] == [("choices", 0, "token_ids"), ("prompt_token_ids",)]
    for path, s, e in spans:
        assert orjson.loads(data[s:e]) == ([7, 8] if path[0] == "choices" else PROMPT)
    assert orjson.loads(rest) == obj


def test_other_keys_ending_like_ours_are_left_alone() -> None:
    data = orjson.dumps(answer(my_token_ids=[1, 2, 3], extra={"xprompt_token_ids": [4]}))
    c = cut(data)
    assert c is not None
    assert c[1]["my_token_ids"] == [1, 2, 3] and c[1]["extra"] == {"xprompt_token_ids": [4]}
    assert [p for p, _, _ in c[2]] == [("choices", 0, "token_ids"), ("prompt_token_ids",)]


@pytest.mark.parametrize(
    "data",
    [
        orjson.dumps(answer(usage2={"token_ids": [1]})),  # the key somewhere else
        orjson.dumps(answer(PROMPT[:10])),  # small: parsed whole
        orjson.dumps(answer()).replace(b'"prompt_token_ids":[', b'"prompt_token_ids":["x",'),  # not flat
        orjson.dumps(answer())[:-1] + b',"prompt_token_ids":[1]}',  # a duplicate key
        orjson.dumps(answer())[:-5],  # torn
    ],
)
def test_cut_declines_what_it_is_not_for(data: bytes) -> None:
    assert cut(data) is None


def test_whitespace_and_pretty_printing() -> None:
    import json

    data = json.dumps(answer(), indent=2).encode()
    c = cut(data)
    assert c is not None
    assert c[1]["prompt_token_ids"] is None and c[1]["choices"][0]["message"]["content"] == "hi"


@pytest.mark.parametrize("client_logprobs", [False, True])
def test_client_bytes_equal_the_whole_parse(client_logprobs: bool) -> None:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    if client_logprobs:
        body["logprobs"] = True
    plan = plan_for("token", Dialect.CHAT, body)
    assert plan is not None
    data = orjson.dumps(answer())
    out, _ = plan.client_body_bytes(data, 200)
    assert out == whole_strip(data, logprobs=not client_logprobs)
    if client_logprobs:  # nothing re-encoded: the upstream's bytes, less the arrays
        assert len(out) == len(data) - len(orjson.dumps(PROMPT)) - len(b"[7,8]") + 8


def test_stream_first_chunk_is_cut() -> None:
    plan = plan_for("token", Dialect.CHAT, {"model": "m", "messages": [], "stream": True})
    assert plan is not None
    first = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    first["prompt_token_ids"] = PROMPT
    f = plan.stream_filter()
    out = f.feed(b"data: " + orjson.dumps(first) + b"\n\n")
    assert out == b"data: " + orjson.dumps({**first, "prompt_token_ids": None}) + b"\n\n"


def record(data: bytes, ids: IdParser | None, session: str = "s") -> Any:
    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", session)
    cap.status_code, cap.body = 200, data
    return cap.to_record(ids)


def test_parser_reuses_the_sessions_prefix_and_gives_the_same_record() -> None:
    ids = IdParser()
    grown = [*PROMPT, 7, 8, 42, 43]
    forked = [*PROMPT[:100], 5, 6, *PROMPT[200:]]
    for prompt in (PROMPT, grown, grown, forked, [*forked, 1]):
        data = orjson.dumps(answer(prompt))
        got, want = record(data, ids), record(data, None)
        assert got.prompt_ids == want.prompt_ids == tuple(prompt)
        assert got.completion_ids == want.completion_ids == (7, 8)
        assert got.response == want.response
    assert ids.hits == 3 and ids.misses == 2  # grown, grown again, forked + 1 reuse; first and fork parse


def test_parser_boundary_is_a_whole_id() -> None:
    ids = IdParser()
    record(orjson.dumps(answer(PROMPT)), ids)
    longer_last = [*PROMPT[:-1], PROMPT[-1] * 10 + 1]  # the same bytes, then a digit: not the old last id
    assert record(orjson.dumps(answer(longer_last)), ids).prompt_ids == tuple(longer_last)


def test_parser_non_int_ids_are_converted_as_before() -> None:
    data = orjson.dumps(answer([float(i) for i in PROMPT]))
    assert record(data, IdParser()).prompt_ids == tuple(PROMPT)


def test_parser_cache_is_bounded() -> None:
    one = len(orjson.dumps(answer())) + 4 * len(PROMPT)  # the answer, the ids as 4-byte ints
    ids = IdParser(max_bytes=3 * one)
    for s in "abcd":
        record(orjson.dumps(answer()), ids, session=s)
    assert ids._bytes <= ids.max_bytes and len(ids._cache) < 4


@pytest.mark.parametrize("dialect", [Dialect.RESPONSES, Dialect.MESSAGES])
@pytest.mark.parametrize("stream", [False, True])
def test_translated_answers_equal_the_whole_parse(
    dialect: Dialect, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if dialect is Dialect.RESPONSES:
        body: dict[str, Any] = {"model": "m", "input": "x", "stream": stream}
    else:
        body = {
            "model": "m",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "x"}],
            "stream": stream,
        }
    first = {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    chunks = [
        {**first, "prompt_token_ids": PROMPT},
        {**first, "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [7]}]},
        {**first, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [8]}]},
        {**first, "choices": [], "usage": {"prompt_tokens": len(PROMPT), "completion_tokens": 2}},
    ]
    sse = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"

    def run() -> bytes:
        plan = plan_for("token", dialect, body)
        assert plan is not None
        if not stream:
            return plan.client_body_bytes(orjson.dumps({**answer(), "created": 1}), 200)[0]
        f = plan.stream_filter()
        return b"".join(f.feed(sse[i : i + 1000]) for i in range(0, len(sse), 1000)) + f.finish()

    def generated(b: bytes) -> bytes:  # ids and times the translation makes up
        b = re.sub(rb'"(resp|msg|rs|fc|call|toolu)_[A-Za-z0-9]+"', b'"ID"', b)
        return re.sub(rb'"created_at":[0-9.]+', b'"created_at":0', b)

    got = run()
    monkeypatch.setattr("orchard_rec.proxy.idcut.MIN_BYTES", 1 << 40)  # everything parsed whole
    assert generated(got) == generated(run())
    assert b"input_tokens" not in got or f'"input_tokens":{len(PROMPT)}'.encode() in got


@pytest.mark.parametrize(
    ("dialect", "body", "spliced"),
    [
        (Dialect.CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, True),
        (
            Dialect.CHAT,
            {"model": "m", "messages": [], "logprobs": False},
            False,
        ),  # the client's key: re-encoded
        (Dialect.COMPLETIONS, {"model": "m", "prompt": "x"}, True),
        (Dialect.RESPONSES, {"model": "m", "input": "x"}, False),  # translated
    ],
)
def test_upstream_body_is_the_clients_bytes_plus_the_keys(dialect: Dialect, body: Any, spliced: bool) -> None:
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n"
    plan = plan_for("token", dialect, orjson.loads(raw))
    assert plan is not None
    up = plan.upstream_bytes(raw)
    assert orjson.loads(up) == plan.body
    assert up.startswith(raw.rstrip()[:-1]) is spliced


def test_streamed_record_is_the_same_with_the_parser() -> None:
    first = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    rest = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": [7]}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [8]}]},
    ]

    def rec(prompt: list[int], ids: IdParser | None) -> Any:
        cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", "s")
        cap.status_code, cap.stream = 200, True
        events = [{**first, "prompt_token_ids": prompt}, *rest]
        sse = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        cap.chunks = [sse[i : i + 999] for i in range(0, len(sse), 999)]
        return cap.to_record(ids)

    ids = IdParser()
    for prompt in (PROMPT, [*PROMPT, 7, 8, 9]):
        got, want = rec(prompt, ids), rec(prompt, None)
        assert got.prompt_ids == want.prompt_ids == tuple(prompt) and got.completion_ids == (7, 8)
        assert got.events == want.events and got.response == want.response
    assert ids.hits == 1


def test_the_response_paths_cut_is_reused_for_the_record() -> None:
    from orchard_rec.proxy.core import Call

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    ids = IdParser()
    for prompt in (PROMPT, [*PROMPT, 1, 2]):
        call = Call(Dialect.CHAT, "POST", "/v1/chat/completions", {})
        call.name_session("s")
        call.read(orjson.dumps(body), "application/json", "token")
        call.response(200, "application/json")
        data = orjson.dumps(answer(prompt))
        call.body(data, 200)
        assert call.cap.id_cut is not None and call.cap.id_cut[0] == cut(data)[0]  # type: ignore[index]
        got, want = call.cap.to_record(ids), record(data, None)
        assert got.prompt_ids == want.prompt_ids and got.response == want.response
    assert ids.hits == 1


def test_ids_is_a_view_equal_to_its_tuple() -> None:
    from orchard_rec.storage.delta import Ids

    a = Ids([1, 2, 3])
    b = a.extend([4, 5])
    c = a.extend([9])  # ``a`` is no longer the list's end: a copy
    assert b._buf is a._buf and c._buf is not a._buf and b.base is a.mark and c.base is a.mark
    assert a == (1, 2, 3) == a and (1, 2, 3) == a and [1, 2, 3] == a and a != (1, 2)
    assert b == (1, 2, 3, 4, 5) and c == (1, 2, 3, 9) and b == Ids([1, 2, 3, 4, 5]) and a != b
    assert len(a) == 3 and list(a) == [1, 2, 3] and tuple(b) == (1, 2, 3, 4, 5)
    assert a[-1] == 3 and a[1:] == (2, 3) and a[::-1] == (3, 2, 1) and b[3:9] == (4, 5) and a[5:] == ()
    assert hash(a) == hash((1, 2, 3)) and a + (7,) == (1, 2, 3, 7) and (0,) + a == (0, 1, 2, 3)
    with pytest.raises(IndexError):
        a[3]
    # the buffer is 4-byte ints; an id that does not fit (no vocabulary's) makes a list, and an
    # extend that hits one leaves the shared buffer and the views on it as they were
    assert a.array() is not None and a.nbytes == 4 * 5  # the buffer ``b`` grew
    big = a.extend([2**40])
    assert big == (1, 2, 3, 2**40) and big.array() is None and big._buf is not a._buf
    assert b == (1, 2, 3, 4, 5) and len(b._buf) == 5
    d = b.extend([6, 2**33, 7])  # ``b`` is the end: its buffer was tried, then given back
    assert d == (1, 2, 3, 4, 5, 6, 2**33, 7) and len(b._buf) == 5 and b.extend([6]) == (1, 2, 3, 4, 5, 6)
    assert Ids([2**40, 1]) == (2**40, 1) and Ids([2**40]) != Ids([1]) and Ids([1, 2]) == Ids((1, 2))
    assert Ids([1, 2**40])[:1] == (1,) and big != Ids([1, 2, 3, 4])
    e = Ids([1, 2])
    held = memoryview(e._buf)  # the buffer exported: it cannot grow, so the new ids get a copy
    f = e.extend([3])
    assert f == (1, 2, 3) and f._buf is not e._buf and e == (1, 2) and f.base is e.mark
    held.release()


def capture(data: Any, stream: bool, injected: bool) -> Capture:
    """A chat call's capture: ``data`` an answer object (``stream``: sent as its events)."""
    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", "s")
    cap.status_code, cap.stream = 200, stream
    cap.request = {"model": "m", "messages": [], "stream": stream}
    if not injected:
        cap.request["return_token_ids"] = True
    cap.upstream_request = {**cap.request, "return_token_ids": True, "logprobs": True}
    if not stream:
        cap.body = orjson.dumps(data)
        return cap
    c0 = data["choices"][0]
    head = {"id": data["id"], "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [
        {
            **head,
            "prompt_token_ids": data["prompt_token_ids"],
            "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        },
        {**head, "choices": [{"index": 0, "delta": {"content": "hi"}, "token_ids": c0["token_ids"][:1]}]},
        {
            **head,
            "choices": [{"index": 0, "delta": {}, "token_ids": c0["token_ids"][1:], "finish_reason": "stop"}],
        },
    ]
    sse = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    cap.chunks = [sse[i : i + 4096] for i in range(0, len(sse), 4096)]
    return cap


@pytest.mark.parametrize("injected", [True, False])
@pytest.mark.parametrize("stream", [False, True])
def test_parsed_records_write_and_read_as_parsed_whole(tmp_path: Any, stream: bool, injected: bool) -> None:
    """The parser's records carry a prompt as ``Ids``, in the answer too (no list of it), and in a
    stream's events where storage strips them: the spool lines and what storage gives back are the
    same as for records parsed whole."""
    from orchard_rec.storage import Store
    from orchard_rec.storage.delta import Ids
    from orchard_rec.storage.spool import record_to_json

    grown = [*PROMPT, 7, 8, 42, 43]
    prompts = [PROMPT, grown, grown, [*PROMPT[:100], 5, *PROMPT[200:]], [*grown, 1, 2]]
    ids = IdParser()
    stores = {k: Store(f"sqlite:///{tmp_path / k}.db") for k in ("parsed", "whole")}
    for st in stores.values():
        st.upgrade()
    for k, prompt in enumerate(prompts):
        got = capture(answer(prompt), stream, injected).to_record(ids)
        want = capture(answer(prompt), stream, injected).to_record(None)
        assert isinstance(got.prompt_ids, Ids) and got.response["prompt_token_ids"] is got.prompt_ids
        if stream:
            first = got.events[0][1]["prompt_token_ids"]  # type: ignore[index]
            assert (first is got.prompt_ids) is injected and first == want.events[0][1]["prompt_token_ids"]  # type: ignore[index]
        for r in (got, want):
            for f, v in (("call_id", f"c{k}"), ("received_at", 1.0), ("done_at", 2.0)):
                object.__setattr__(r, f, v)
        assert record_to_json(got) == record_to_json(want)
        stores["parsed"].write_batch([got])
        stores["whole"].write_batch([want])
    back = {
        k: [
            orjson.dumps(c.response) + orjson.dumps(c.events) + orjson.dumps(c.prompt_ids)
            for c in s.calls("s")
        ]
        for k, s in stores.items()
    }
    assert back["parsed"] == back["whole"] and len(back["whole"]) == len(prompts)


def test_an_ids_anywhere_else_is_a_list_in_the_record() -> None:
    """Completions with n=2: both choices carry the prompt; only choice 0's may stay an ``Ids``."""
    from orchard_rec.storage.spool import record_from_json, record_to_json

    obj = {
        "id": "c",
        "object": "text_completion",
        "choices": [
            {"index": i, "text": "x", "finish_reason": "stop", "prompt_token_ids": PROMPT, "token_ids": [i]}
            for i in range(2)
        ],
    }
    cap = Capture(Dialect.COMPLETIONS, "POST", "/v1/completions", "s")
    cap.status_code, cap.body = 200, orjson.dumps(obj)
    rec = cap.to_record(IdParser())
    assert rec.prompt_ids == tuple(PROMPT) and type(rec.response["choices"][1]["prompt_token_ids"]) is list
    assert record_from_json(record_to_json(rec)).response == obj


# -- a long prompt parsed whole: Arrow's kernels, without the interpreter lock -------------------

LONG = [(i * 7919) % 151_000 for i in range(ARROW_BYTES // 3)]  # ~6 bytes an id: past ARROW_BYTES


def _ref(span: bytes) -> list[int] | None:
    """What ``int_array`` must equal when it answers: orjson's ints, if they fit 4 bytes."""
    try:
        got = orjson.loads(span)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(got, list) or not all(type(x) is int and -(2**31) <= x < 2**31 for x in got):
        return None
    return got


@settings(max_examples=400, deadline=None)
@given(hs.lists(hs.integers(0, 2**31 - 1), max_size=50))
def test_int_array_reads_every_compact_array_of_ids(xs: list[int]) -> None:
    got = int_array(orjson.dumps(xs))
    assert got is not None and got.itemsize == 4 and list(got) == xs


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
@settings(max_examples=1500, deadline=None)
@given(hs.text(alphabet="0123456789,- ", max_size=16))
def test_int_array_answers_only_what_json_says(body: str) -> None:
    """Any bytes of digits, commas, minus signs and spaces: an answer equals orjson's parse
    (leading zeros, empty elements, signs, an id past 4 bytes: None, never another value)."""
    span = b"[" + body.encode() + b"]"
    got = int_array(span)
    ref = _ref(span)
    if got is not None:
        assert list(got) == ref
    elif ref is not None:
        assert " " in body or "-" in body  # left to orjson; every compact array of ids is read


@pytest.mark.parametrize(
    "span", [b"[01]", b"[1,00]", b"[2147483648]", b"[-1]", b"[1,,2]", b"[1,]", b"[1 ]", b""]
)
def test_int_array_declines(span: bytes) -> None:
    assert int_array(span) is None


def test_long_prompt_parsed_whole_then_grown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's first long prompt goes through ``int_array`` (a 4-byte buffer of its own), the
    next is parsed past it as before; both records equal the whole parse."""
    from orchard_rec.proxy import idcut

    read: list[int] = []

    def spy(span: bytes) -> Any:
        got = int_array(span)
        read.append(-1 if got is None else len(got))
        return got

    monkeypatch.setattr(idcut, "int_array", spy)
    ids = IdParser()
    grown = [*LONG, 7, 8, 42]
    for prompt in (LONG, grown):
        data = orjson.dumps(answer(prompt))
        got, want = record(data, ids), record(data, None)
        assert got.prompt_ids == want.prompt_ids == tuple(prompt)
        assert got.response == want.response
    assert (ids.hits, ids.misses) == (1, 1) and read == [len(LONG)]
    _, held, _ = ids._cache["s"]
    assert held._buf.itemsize == 4 and len(held) == len(grown)


@pytest.mark.parametrize(
    "prompt",
    [[*LONG[:-1], 2**31], [*LONG[:-1], -1], [float(x) for x in LONG[:20_000]]],
    ids=["past-int32", "negative", "floats"],
)
def test_long_prompt_arrow_cannot_read_is_parsed_as_before(prompt: list[Any]) -> None:
    data = orjson.dumps(answer(prompt))
    assert (
        record(data, IdParser()).prompt_ids == record(data, None).prompt_ids == tuple(int(x) for x in prompt)
    )


def test_long_pretty_printed_prompt_is_parsed_as_before() -> None:
    data = orjson.dumps(answer(LONG)).replace(b",", b", ")
    assert record(data, IdParser()).prompt_ids == tuple(LONG)
