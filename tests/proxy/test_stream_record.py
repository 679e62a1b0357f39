"""A streamed call's record: its events and their arrival times are those of an SSE parser fed
the chunks one by one as they arrived, however the stream is chunked and whatever its line ends,
comments, names, multi-line data, malformed or non-UTF-8 data; the relay hands the client the
same bytes for a LF-only stream whatever its chunking."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_rec.dialects.sse import SSEParser
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.core import StreamRelay
from orchard_rec.proxy.token import plan_for
from orchard_rec.records import Dialect

CHUNK = {
    "id": "c",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "delta": {"content": "caf\u00e9 "},
            "finish_reason": None,
            "logprobs": {"content": [{"token": "x", "logprob": -0.25, "bytes": [120], "top_logprobs": []}]},
            "token_ids": [7],
        }
    ],
}
LF = (
    b"data: " + orjson.dumps({**CHUNK, "prompt_token_ids": [1, 2, 3]}) + b"\n\n"
    b": keep-alive\n\n"
    b"data: " + orjson.dumps(CHUNK) + b"\n\n"
    b'event: named\ndata: {"a":\ndata: 1}\n\n'
    b"data:" + orjson.dumps(CHUNK) + b"\n\n"
    b"data: {not json\n\n"
    b'data: {"bad":"\xff"}\n\n'
    b"data: \n\n\n\n"
    b"data: " + orjson.dumps({**CHUNK, "usage": {"prompt_tokens": 3}}) + b"\n\n"
    b"data: [DONE]\n\n"
)
STREAMS = [LF, LF[:-2], LF.replace(b"\n\n", b"\r\n\r\n", 3)]


def _reference(chunks: list[bytes], arrivals: list[float], started: float) -> tuple[list[Any], list[int]]:
    """Events and ms as the parser gives them chunk by chunk (and at the end, its flush)."""
    p = SSEParser()
    events: list[Any] = []
    at: list[int] = []
    for chunk, t in zip(chunks, arrivals, strict=True):
        for name, data in p.feed(chunk):
            try:
                obj = orjson.loads(data) if data and data != "[DONE]" else data
            except orjson.JSONDecodeError:
                obj = data
            events.append([name, obj])
            at.append(round((t - started) * 1e6) // 1000)
    for name, data in p.flush():  # a last event without its blank line: read as any other
        try:
            obj = orjson.loads(data) if data and data != "[DONE]" else data
        except orjson.JSONDecodeError:
            obj = data
        events.append([name, obj])
        at.append(round((arrivals[-1] - started) * 1e6) // 1000)
    return events, at


def _record(stream: bytes, cuts: list[int], mode: str) -> tuple[Capture, Any, bytes]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    plan = plan_for(mode, Dialect.CHAT, body)
    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", "s")
    cap.request, cap.upstream_request = body, plan.body if plan else None
    cap.stream, cap.status_code = True, 200
    relay = StreamRelay(cap, plan)
    points = sorted(set(cuts))
    sent = b""
    for k, (a, b) in enumerate(zip([0, *points], [*points, len(stream)], strict=True)):
        sent += relay.feed(stream[a:b])
        cap.arrivals[-1] = cap.started + 0.0037 * k
    sent += relay.finish()
    return cap, cap.to_record(), sent


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(
    st.sampled_from(range(len(STREAMS))),
    st.lists(st.integers(min_value=0, max_value=len(LF)), max_size=16),
    st.sampled_from(["token", "off"]),
)
def test_events_and_times_are_the_parsers_chunk_by_chunk(which: int, cuts: list[int], mode: str) -> None:
    stream = STREAMS[which]
    cap, rec, sent = _record(stream, [c for c in cuts if c <= len(stream)], mode)
    events, at = _reference(cap.chunks, cap.arrivals, cap.started)
    assert rec.events == events
    assert rec.metadata["event_ms"] == at
    assert rec.completion_ids == (7, 7, 7, 7) and rec.prompt_ids == (1, 2, 3)
    assert rec.response["choices"][0]["message"]["content"] == "caf\u00e9 " * 4
    if which == 0:  # the client's bytes do not depend on the chunking
        assert sent == _record(stream, [], mode)[2]


def test_relay_strips_what_token_mode_injected_from_every_event() -> None:
    _, rec, sent = _record(LF, list(range(0, len(LF), 7)), "token")
    assert b'token_ids":[' not in sent and b'"logprobs":{' not in sent
    assert sent.count(b'"token_ids":null') == 4 and sent.endswith(b"data: [DONE]\n\n")
    assert rec.events[0][1]["prompt_token_ids"] == [1, 2, 3]


def _frames(stream: bytes) -> list[int]:
    """Cuts at every blank line: an event a chunk, as servers write them."""
    cuts, at = [], 0
    while (i := stream.find(b"\n\n", at)) >= 0:
        at = i + 2
        cuts.append(at)
    return cuts


PLAIN = (
    b"data: "
    + orjson.dumps({**CHUNK, "prompt_token_ids": [1, 2, 3]})
    + b"\n\n"
    + b"".join(b"data: " + orjson.dumps(CHUNK) + b"\n\n" for _ in range(3))
    + b"data: "
    + orjson.dumps({**CHUNK, "usage": {"prompt_tokens": 3}})
    + b"\n\n"
    + b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    "stream",
    [
        PLAIN,  # every event one data line: parsed in bulk
        PLAIN[:-14],  # no [DONE] (an aborted stream)
        PLAIN[:-16],  # ... and the last event without its blank line
        PLAIN.replace(b'"logprob"', b'"logprob" ', 1),  # spaced: still one line
        PLAIN.replace(b"data: [DONE]", b"data: [DONE]\n\ndata: {not json"),  # past [DONE], malformed
        PLAIN.replace(b"\n\n", b"\n\n: ping\n\n", 1),  # a comment: one by one
        PLAIN.replace(b"data: ", b"data:", 2),  # no space after the colon
        PLAIN.replace(b"\n\n", b"\n\n\n\n", 1),  # an empty block
        b"data: "
        + orjson.dumps({**CHUNK, "prompt_token_ids": list(range(5000))})
        + b"\n\n"
        + PLAIN,  # the id parser's
        LF,
    ],
)
@pytest.mark.parametrize("mode", ["token", "off"])
def test_an_event_a_chunk_records_what_the_parser_gives(stream: bytes, mode: str) -> None:
    for cuts in (_frames(stream), _frames(stream)[::2]):  # an event a chunk, and two
        cap, rec, _ = _record(stream, cuts, mode)
        events, at = _reference(cap.chunks, cap.arrivals, cap.started)
        assert rec.events == events
        assert rec.metadata["event_ms"] == at
        assert rec.response["choices"][0]["message"]["content"].startswith("caf\u00e9 ")
