"""A model whose reply spells the end markers (``[DONE]``, ``message_stop``, ``response.completed``)
streams through every dialect and is recorded complete: the end of a stream is its last event,
never those bytes inside a delta. ``wal`` durability records a stream the moment its end passes,
so an end detected too early would record a cut reply."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from orchard_rec.dialects import assemble
from orchard_rec.dialects.sse import parse_sse
from orchard_rec.records import CallOutcome, Dialect

TRAP = "[DONE] message_stop response.completed data: [DONE]"
REPLY = f"Hello! You said: {TRAP}"  # the demo model echoes the user's message


def _body(dialect: Dialect) -> tuple[str, dict[str, Any]]:
    if dialect is Dialect.CHAT:
        return "chat/completions", {"model": "m", "messages": [{"role": "user", "content": TRAP}]}
    if dialect is Dialect.COMPLETIONS:  # a prompt the demo server reads as a chat
        prompt = f"<|im_start|>user\n{TRAP}<|im_end|>\n<|im_start|>assistant\n"
        return "completions", {"model": "m", "prompt": prompt, "max_tokens": 200}
    if dialect is Dialect.RESPONSES:
        return "responses", {"model": "m", "input": TRAP}
    return "messages", {"model": "m", "max_tokens": 200, "messages": [{"role": "user", "content": TRAP}]}


def _text(dialect: Dialect, obj: Any) -> str:
    if dialect is Dialect.CHAT:
        return str(obj["choices"][0]["message"]["content"])
    if dialect is Dialect.COMPLETIONS:
        return str(obj["choices"][0]["text"])
    if dialect is Dialect.RESPONSES:
        return "".join(
            c["text"] for item in obj["output"] if item["type"] == "message" for c in item["content"]
        )
    return "".join(b["text"] for b in obj["content"] if b["type"] == "text")


@pytest.mark.parametrize("mode", ["passthrough", "token"])
@pytest.mark.parametrize("dialect", [Dialect.CHAT, Dialect.COMPLETIONS, Dialect.RESPONSES, Dialect.MESSAGES])
def test_a_reply_spelling_the_end_markers_is_recorded_whole(
    upstream_factory, proxy_factory, sqlite_url, dialect, mode
) -> None:  # type: ignore[no-untyped-def]
    # the whole reply in one delta (the markers unsplit), and each frame its own read
    upstream = upstream_factory(stream_interval=1000, chunk_delay=0.01)
    proxy = proxy_factory(upstream.url, sqlite_url, mode=mode, durability="wal")
    route, body = _body(dialect)
    req = urllib.request.Request(
        f"{proxy.url}/s/trap/v1/{route}",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        data = r.read()
    events = [(n, d if d == "[DONE]" else json.loads(d)) for n, d in parse_sse([data])]
    assert _text(dialect, assemble(dialect, events)).endswith(REPLY)  # the client got it all
    proxy.flush()
    (rec,) = proxy.store().calls("trap")
    assert rec.outcome is CallOutcome.OK and rec.stream and rec.bytes_out == len(data)
    assert _text(dialect, rec.response).endswith(REPLY), rec.response
    assert rec.events is not None and len(rec.events) >= len(events)
    name, last = rec.events[-1]
    assert (name, last) == (None, "[DONE]") or name in ("response.completed", "message_stop"), rec.events[-3:]
    if mode == "token" and dialect in (Dialect.CHAT, Dialect.COMPLETIONS):
        assert rec.completion_ids  # the ids of the whole reply
