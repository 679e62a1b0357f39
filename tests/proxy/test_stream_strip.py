"""Token mode's stream filter hands the client exactly what the upstream sent, less the injected fields.

A property test against an independent reading of the stream (stdlib ``json``, events split by
hand): every event without an injected field reaches the client as its own bytes; one with an
injected field reaches it as the same object with exactly those fields null; and how the upstream's
bytes are cut into chunks changes nothing (issue 39: the relay passes raw blocks on).
"""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_rec.proxy.token import plan_for
from orchard_rec.records import Dialect

CLIENT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}

text = st.text(alphabet=st.sampled_from('ab "\\\n:é☃😀[]{}DONE'), max_size=12)


@st.composite
def chunk_obj(draw: st.DrawFn) -> dict:  # type: ignore[type-arg]
    choice: dict = {"index": 0, "delta": {"content": draw(text)}, "finish_reason": None}  # type: ignore[type-arg]
    if draw(st.booleans()):
        choice["logprobs"] = draw(
            st.sampled_from([None, {"content": [{"token": "x", "logprob": -0.5, "top_logprobs": []}]}])
        )
    if draw(st.booleans()):
        choice["token_ids"] = draw(st.sampled_from([None, [], [7, 8]]))
    obj = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    if draw(st.booleans()):
        obj["prompt_token_ids"] = draw(st.sampled_from([None, [1, 2, 3]]))
    return obj


@st.composite
def stream(draw: st.DrawFn) -> tuple[list[bytes], list[int], bytes]:
    objs = draw(st.lists(chunk_obj(), min_size=1, max_size=6))
    events = []
    for o in objs:
        spaced = draw(st.booleans())  # the upstream's own formatting is kept
        ascii_only = draw(st.booleans())  # "\u00e9" or the UTF-8 bytes
        sep = (", ", ": ") if spaced else (",", ":")
        events.append(json.dumps(o, separators=sep, ensure_ascii=ascii_only).encode())
    events.append(b"[DONE]")
    blank = draw(st.sampled_from([b"\n\n", b"\r\n\r\n"]))
    frames = [b"data: " + e + blank for e in events]
    wire = b"".join(frames)
    if draw(st.booleans()):  # an event a chunk, as servers write them
        ends = [sum(map(len, frames[: i + 1])) for i in range(len(frames))]
        return events, [0, *ends], blank
    cuts = sorted(draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    return events, [0, *cuts, len(wire)], blank


def _stripped(obj: dict) -> dict:  # type: ignore[type-arg]
    """What the client should see: exactly the injected fields as vLLM writes them when not asked."""
    out = dict(obj)
    if out.get("prompt_token_ids") is not None:
        out["prompt_token_ids"] = None
    choices = []
    for c in out["choices"]:
        c = dict(c)
        for k in ("token_ids", "logprobs"):
            if c.get(k) is not None:
                c[k] = None
        choices.append(c)
    out["choices"] = choices
    return out


@settings(max_examples=300, deadline=None)
@given(stream())
def test_client_gets_the_upstream_bytes_less_the_injected_fields(
    case: tuple[list[bytes], list[int], bytes],
) -> None:
    events, cuts, blank = case
    wire = b"".join(b"data: " + e + blank for e in events)
    plan = plan_for("token", Dialect.CHAT, CLIENT)
    assert plan is not None and plan.inject_ids and plan.inject_logprobs
    f = plan.stream_filter()
    got = b"".join(f.feed(wire[a:b]) for a, b in itertools.pairwise(cuts)) + f.finish()
    assert f.ended
    frames = got.split(b"\n\n")
    assert frames[-1] == b""
    assert len(frames) - 1 == len(events)
    for frame, sent in zip(frames, events, strict=False):
        assert frame.startswith(b"data: ")
        data = frame[len(b"data: ") :]
        if sent == b"[DONE]":
            assert data == sent
            continue
        obj = json.loads(sent)
        want = _stripped(obj)
        if want == obj:
            assert data == sent  # nothing injected: the very bytes
        else:
            assert json.loads(data) == want


def test_events_the_fast_path_does_not_take_are_relayed_as_before() -> None:
    """Named events, CRLF, comments and several data lines: the general path (normalised frames)."""
    plan = plan_for("token", Dialect.CHAT, CLIENT)
    assert plan is not None
    f = plan.stream_filter()
    up = (
        b": keep-alive\r\n\r\n"
        b'data: {"choices":[{"index":0,"token_ids":[5],"delta":{}}]}\r\n\r\n'
        b"event: x\ndata: 1\n\n"
        b"data: [DONE]\r\n\r\n"
    )
    out = f.feed(up)
    assert out == (
        b'data: {"choices":[{"index":0,"token_ids":null,"delta":{}}]}\n\n'
        b"event: x\ndata: 1\n\n"
        b"data: [DONE]\n\n"
    )
    assert f.ended
