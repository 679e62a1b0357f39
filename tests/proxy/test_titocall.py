"""Tito's per-call steps, sans-io (``proxy.titocall``): a request in, the token endpoint's bytes out,
its answer in, the client's bytes out; no socket, no event loop. Both front doors drive these."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from orchard_rec.errors import UpstreamProtocolError
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.tito import TitoSessions
from orchard_rec.proxy.titocall import TitoCall
from orchard_rec.records import CallOutcome, Dialect


@pytest.fixture(scope="module")
def tito(hf_tokenizer) -> TitoSessions:  # type: ignore[no-untyped-def]
    return TitoSessions(hf_tokenizer)


def _call(tito: TitoSessions, body: dict[str, Any], dialect: Dialect = Dialect.CHAT) -> TitoCall:
    path = {Dialect.CHAT: "/v1/chat/completions", Dialect.MESSAGES: "/v1/messages"}[dialect]
    cap = Capture(dialect, "POST", path, "tc-session")
    return TitoCall(cap, body, tito)


def _answer(tito: TitoSessions, text: str, prompt: list[int]) -> bytes:
    ids = tito.tok.encode(text, add_special_tokens=False)
    choice = {
        "text": text,
        "token_ids": ids,
        "finish_reason": "stop",
        "logprobs": {"token_logprobs": [-0.5] * len(ids)},
    }
    return orjson.dumps({"choices": [choice], "prompt_token_ids": prompt})


def test_two_turns_bytes_in_bytes_out(tito: TitoSessions) -> None:
    msgs = [{"role": "user", "content": "hello"}]
    call = _call(tito, {"model": "m", "messages": msgs, "temperature": 0})
    call.plan()
    path, wire = call.upstream()
    sent = orjson.loads(wire)
    assert path == "completions" and sent["prompt"] == list(call.prompt) and sent["temperature"] == 0
    assert call.cap.upstream_dialect is Dialect.COMPLETIONS and call.cap.upstream_raw == wire
    assert call.answer(200, _answer(tito, "hi there", list(call.prompt))) is None
    call.settle(call.first())
    call.commit()
    payload, ctype = call.reply()
    got = orjson.loads(payload)
    assert ctype == "application/json" and got["choices"][0]["message"]["content"] == "hi there"
    seen, ids, lps, finish = call.cap.tokens
    assert list(seen) == sent["prompt"] and lps == [-0.5] * len(ids) and finish == "stop"
    assert call.cap.metadata["tito"]["fresh"] is True and call.cap.bytes_out == len(payload)
    assert call.wait_durable("async")  # a session's call: in the database before the client has it
    tito.acknowledge(call.cap.session_id)

    # the next turn extends the session's exact ids: the prompt starts with this turn's prompt + ids
    nxt = _call(
        tito,
        {
            "model": "m",
            "messages": [*msgs, got["choices"][0]["message"], {"role": "user", "content": "more"}],
        },
    )
    nxt.plan()
    assert list(nxt.prompt)[: len(seen) + len(ids)] == list(seen) + list(ids)
    assert orjson.loads(nxt.upstream()[1])["prompt"] == list(nxt.prompt)


def test_a_stream_in_the_clients_dialect(tito: TitoSessions) -> None:
    body = {"model": "m", "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "yo"}]}
    call = _call(tito, body, Dialect.MESSAGES)
    call.plan()
    call.upstream()
    call.answer(200, _answer(tito, "ok", list(call.prompt)))
    call.settle(call.first())
    call.commit()
    payload, ctype = call.reply()
    assert ctype == "text/event-stream" and payload.startswith(b"event: message_start")
    assert payload.rstrip().endswith(b'{"type":"message_stop"}') and call.cap.stream
    assert [n for n, _ in call.cap.client_events][-1] == "message_stop"


def test_an_error_status_is_the_clients_error_and_bad_json_a_protocol_error(tito: TitoSessions) -> None:
    call = _call(tito, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    call.plan()
    call.upstream()
    err = call.answer(400, b'{"error": {"message": "prompt too long"}}')
    assert err is not None and b"prompt too long" in err
    assert call.cap.outcome is CallOutcome.UPSTREAM_ERROR and call.cap.status_code == 400
    bad = _call(tito, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    bad.plan()
    bad.upstream()
    with pytest.raises(UpstreamProtocolError):
        bad.answer(200, b"not json")
