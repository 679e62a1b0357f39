"""SSE parsing is the same whatever the chunking; encoding parses back to what was encoded."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_rec.dialects.sse import DONE_FRAME, SSEParser, encode, encode_data, parse_sse

STREAM = (
    b": keep-alive comment\n\n"
    b'event: message_start\ndata: {"type":"message_start"}\n\n'
    b'data: {"text":"a\\nb"}\r\n\r\n'
    b"event: x\r\ndata: line one\r\ndata: line two\r\n\r\n"
    b"data: caf\xc3\xa9\r\r"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    ("message_start", '{"type":"message_start"}'),
    (None, '{"text":"a\\nb"}'),
    ("x", "line one\nline two"),
    (None, "café"),
    (None, "[DONE]"),
]


def test_parses_every_line_ending_and_multiline_data() -> None:
    assert parse_sse([STREAM]) == EXPECTED


def test_every_two_way_split_gives_the_same_events() -> None:
    for i in range(len(STREAM) + 1):
        assert parse_sse([STREAM[:i], STREAM[i:]]) == EXPECTED, i


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)])]
    assert parse_sse(chunks) == EXPECTED


def test_byte_by_byte() -> None:
    p = SSEParser()
    got = []
    for b in STREAM:
        got += p.feed(bytes([b]))
    assert got == EXPECTED and not p.pending


def test_a_last_event_without_blank_line_is_flushed() -> None:
    assert parse_sse([b"data: tail"]) == [(None, "tail")]


@pytest.mark.slow  # 100 random event lists: ~0.5 s (test_done_frame_and_unnamed_data stays fast)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["response.completed", "message_stop", "ping"])),
            st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=3),
        ),
        max_size=6,
    )
)
def test_encode_parses_back(events: list[tuple[str | None, dict[str, str]]]) -> None:
    frames = b"".join(encode(n, d) for n, d in events)
    assert [(n, orjson.loads(d)) for n, d in parse_sse([frames])] == events


def test_done_frame_and_unnamed_data() -> None:
    assert encode_data({"a": 1}) == b'data: {"a":1}\n\n'
    assert encode(None, "[DONE]") == DONE_FRAME


def test_stream_end_at_every_split_only_after_the_last_event() -> None:
    from orchard_rec.dialects import StreamEnd
    from orchard_rec.records import Dialect

    trap = encode(None, {"choices": [{"delta": {"content": "data: [DONE]\n\n"}}]})
    stream = b": hi\r\n\r\n" + trap + b"data: [DONE]\r\n\r\n"
    for i in range(len(stream) + 1):  # the end is known once [DONE]'s blank line is complete
        e = StreamEnd(Dialect.CHAT)
        assert e.feed(stream[:i]) == (i == len(stream)), i
        assert e.feed(stream[i:]), i
    e = StreamEnd(Dialect.CHAT)
    assert [e.feed(bytes([b])) for b in stream].index(True) == len(stream) - 1
    named = encode("content_block_delta", {"text": "event: message_stop\n\n"}) + encode("message_stop", {})
    for i in range(len(named) + 1):
        e = StreamEnd(Dialect.MESSAGES)
        assert not e.feed(named[:i]) or i == len(named)
        assert e.feed(named[i:])


def test_last_boundary() -> None:
    from orchard_rec.dialects.sse import last_boundary

    assert last_boundary(b"data: x") == 0
    assert last_boundary(b"a\n\nb") == 3
    assert last_boundary(b"a\r\n\r\nbc") == 5
    assert last_boundary(b"a\n\nb\r\rc") == 6


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"data: x", b"\n", b"\r", b"\n\n", b": c", b"event: e", b"{}"]), max_size=6))
def test_single_is_what_blocks_gives_for_one_whole_event(parts: list[bytes]) -> None:
    """``SSEParser.single``: the one block ``blocks`` would give for a one-line event ending the
    chunk, and then the parser's state as ``blocks`` leaves it; None (nothing consumed) otherwise."""
    chunk = b"".join(parts)
    for pending in (b"", b"data: pend"):
        fast, slow = SSEParser(), SSEParser()
        if pending:
            assert fast.blocks(pending) == slow.blocks(pending) == []
        one = fast.single(chunk)
        want = slow.blocks(chunk)
        if one is None:
            assert fast.blocks(chunk) == want
        else:
            assert not pending and b"\n" not in one and b"\r" not in one
            assert [one] == want
        assert fast.pending == slow.pending and fast.flush() == slow.flush()
