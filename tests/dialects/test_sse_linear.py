"""The SSE parser's linear-time feed (boundaries searched in new bytes only, parts joined once per
event) gives the events of a plain whole-buffer parse, for any bytes and any chunking."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_rec.dialects.sse import SSEParser

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(rb"\r\n|\n|\r")


def reference(data: bytes) -> tuple[list[tuple[str | None, str]], bytes]:
    """The WHATWG split the parser follows, on the whole buffer at once: events, and what is left."""
    out: list[tuple[str | None, str]] = []
    while (m := _BOUNDARY.search(data)) is not None:
        block, data = data[: m.start()], data[m.end() :]
        name, lines = None, []
        for raw in _LINE.split(block):
            line = raw.decode("utf-8", errors="replace")
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                lines.append(value)
        if name is not None or lines:
            out.append((name, "\n".join(lines)))
    return out, data


@pytest.mark.slow  # 300 random streams: ~0.7 s (the long-event examples stay fast)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(
    st.lists(
        st.sampled_from([b"a", b"data: x", b"event: e", b":", b" ", b"\r", b"\n", b"\xc3"]), max_size=60
    ),
    st.lists(st.integers(min_value=0, max_value=200), max_size=15),
)
def test_any_bytes_any_chunking_as_a_whole_parse(pieces: list[bytes], cuts: list[int]) -> None:
    data = b"".join(pieces)
    points = sorted({c for c in cuts if c <= len(data)})
    p = SSEParser()
    got = []
    for a, b in zip([0, *points], [*points, len(data)]):
        got += p.feed(data[a:b])
    want, rest = reference(data)
    assert got == want and p._buf == rest and p.pending == bool(rest)


def test_a_long_event_is_kept_in_parts_until_it_ends() -> None:
    p = SSEParser()
    body = b"data: [" + b"1," * 200_000 + b"1]"
    for i in range(0, len(body), 4096):
        assert p.feed(body[i : i + 4096]) == []
    assert len(p._parts) == -(-len(body) // 4096)  # not joined per chunk
    assert p.feed(b"\n\n") == [(None, body[6:].decode())] and not p.pending


def test_stream_end_keeps_a_long_event_in_parts() -> None:
    """``StreamEnd`` watches every byte a client receives on the event loop: a 1 MB event (a
    relayed answer with its prompt's ids) in 4 kB chunks is kept aside chunk by chunk, not
    re-joined and re-searched whole per chunk (195 ms per such event before)."""
    from orchard_rec.dialects import StreamEnd
    from orchard_rec.records import Dialect

    body = b'data: {"prompt_token_ids":[' + b"12345," * 160_000 + b'1],"choices":[]}'
    e = StreamEnd(Dialect.CHAT)
    for i in range(0, len(body), 4096):
        assert not e.feed(body[i : i + 4096])
    assert len(e._parts) == -(-len(body) // 4096)  # not joined per chunk
    assert not e.feed(b"\n\ndata: [DONE]")
    assert e.feed(b"\n\n")


@pytest.mark.slow  # 300 random streams: ~0.7 s
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(
    st.sampled_from(["chat", "messages", "responses"]),
    st.lists(
        st.sampled_from(
            [b"data: x", b"data: [DONE]", b"event: message_stop", b"event: response.completed", b"DONE]"]
            + [b"\r", b"\n", b"\n\n", b"[", b":", b" ", b"data: {}", b'data: {"type":"message_stop"}']
        ),
        max_size=40,
    ),
    st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_stream_end_any_chunking_as_a_whole_parse(dialect: str, pieces: list[bytes], cuts: list[int]) -> None:
    """Ended exactly once a terminal event is complete in the bytes fed, however they are cut."""
    from orchard_rec.dialects import StreamEnd, is_terminal
    from orchard_rec.records import Dialect

    d = Dialect(dialect)
    data = b"".join(pieces)
    points = sorted({c for c in cuts if c <= len(data)})
    e = StreamEnd(d)
    for a, b in zip([0, *points], [*points, len(data)]):
        got = e.feed(data[a:b])
        want = any(is_terminal(d, n, x) for n, x in reference(data[:b])[0])
        assert got == want
