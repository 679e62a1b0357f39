"""The fake upstream of the front-contract tests (``test_front_*.py``): a small OpenAI- and
Anthropic-speaking server whose answers a test shapes from the request body.

Chat completions (``/v1/chat/completions``): a whole JSON answer, or with ``"stream": true`` a
server-sent-event stream of ``x_chunks`` chunks (default 3) of ``x_size`` content bytes each, with
``x_delay`` seconds between them; the content of chunk ``i`` is :func:`piece` ``(i, x_size)``, so a
test knows every byte it must receive. ``x_hold`` seconds of silence before a whole answer (a call
in flight). Every answer carries ``x-upstream-thing: kept`` and a hop-by-hop ``Keep-Alive`` header.
Also ``/v1/messages`` (an Anthropic answer) and ``GET /v1/models``. ``seen`` counts the calls that
reached a handler, ``targets`` is every POST's path and query as it arrived. It is an aiohttp app
but shares no code with the proxy's modules; what judges the proxy's answers is ``rawclient``.

``running_front(tmp_path, **config)`` starts it and a ``RecordingProxy`` in front of it (passthrough
mode: every byte relayed is the upstream's), as users start a proxy; ``Front.calls`` reads what was
recorded. ``chat``, ``ok_call`` and ``healthz_time`` are the tests' usual request and checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.server import BackgroundServer, RecordingProxy
from orchard_rec.records import CallRecord
from orchard_rec.storage.store import Store

from .rawclient import RawClient, RawResponse, post_json, request

HEADERS = {"x-upstream-thing": "kept", "Keep-Alive": "timeout=7, max=100"}
MODEL = "front-model"


def piece(i: int, size: int) -> str:
    """Chunk ``i``'s content: ``size`` printable bytes that differ from chunk to chunk."""
    stamp = f"[{i:07d}]"
    return (stamp * (size // len(stamp) + 1))[:size]


def chat_object(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-front",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def chunk_object(content: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {
        "id": "chatcmpl-front",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def stream_bytes(chunks: int, size: int) -> bytes:
    """Every byte of the stream :class:`FrontUpstream` sends for ``x_chunks``/``x_size``."""
    out = [sse(chunk_object(piece(i, size))) for i in range(chunks)]
    return b"".join(out) + sse(chunk_object(None, "stop")) + b"data: [DONE]\n\n"


class FrontUpstream:
    def __init__(self) -> None:
        self.seen = 0
        self.streams_done = 0  # streams written to their end
        self.targets: list[str] = []  # each POST's path and query as it arrived

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen += 1
        if not body.get("stream"):
            if body.get("x_hold"):
                await asyncio.sleep(float(body["x_hold"]))
            text = "hello from upstream"
            return web.json_response(chat_object(text), headers=HEADERS)
        chunks, size = int(body.get("x_chunks", 3)), int(body.get("x_size", 8))
        delay = float(body.get("x_delay", 0))
        resp = web.StreamResponse(headers={**HEADERS, "Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(chunks):
            await resp.write(sse(chunk_object(piece(i, size))))
            if delay:
                await asyncio.sleep(delay)
        await resp.write(sse(chunk_object(None, "stop")) + b"data: [DONE]\n\n")
        await resp.write_eof()
        self.streams_done += 1
        return resp

    async def messages(self, request: web.Request) -> web.Response:
        await request.json()
        self.seen += 1
        answer = {
            "id": "msg_front",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "text", "text": "hello"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 1},
        }
        return web.json_response(answer, headers=HEADERS)

    async def models(self, request: web.Request) -> web.Response:
        data = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "front"}]}
        return web.json_response(data, headers=HEADERS)

    def app(self) -> web.Application:
        @web.middleware
        async def note(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.method == "POST":  # not the proxy's health and policy checks
                self.targets.append(request.raw_path)
            return await handler(request)

        app = web.Application(middlewares=[note], client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_get("/v1/models", self.models)
        return app


# -- the proxy in front of it ---------------------------------------------------------------------------

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = chat_object("hello from upstream")


@dataclass
class Front:
    proxy: RecordingProxy
    fake: FrontUpstream
    config: ProxyConfig

    @property
    def port(self) -> int:
        return self.proxy.port

    def calls(self, sid: str | None = None, *, at_least: int = 0, wait: float = 5.0) -> list[CallRecord]:
        """The recorded calls (of session ``sid``), once at least ``at_least`` are in."""
        deadline = time.monotonic() + wait
        while True:
            assert self.proxy.flush(10), "recorder did not drain"
            recs = stored_calls(self.config.db, sid)
            if len(recs) >= at_least or time.monotonic() > deadline:
                return recs
            time.sleep(0.05)


def stored_calls(db: str, sid: str | None = None) -> list[CallRecord]:
    store = Store(db)
    try:
        return store.calls(sid)
    finally:
        store.close()


def upstream(fake: FrontUpstream) -> BackgroundServer:
    return BackgroundServer(fake.app()).start()


@contextlib.contextmanager
def running_front(tmp_path: Path, **config: Any) -> Iterator[Front]:
    fake = FrontUpstream()
    up = upstream(fake)
    cfg = ProxyConfig(
        upstream=up.url + "/v1",
        db=f"sqlite:///{tmp_path / 'front.db'}",
        mode="passthrough",
        spool=str(tmp_path / "front.spool"),
        **config,
    )
    proxy = RecordingProxy(cfg)
    proxy.start()
    try:
        yield Front(proxy, fake, cfg)
    finally:
        proxy.stop()
        up.stop()


def chat(sid: str, **extra: Any) -> bytes:
    """A chat completion request of session ``sid`` (``extra``: body fields, ``x_*`` shape the answer)."""
    return post_json(f"/s/{sid}/v1/chat/completions", {**CHAT, **extra})


def ok_call(r: RawResponse) -> None:
    """``r`` is the upstream's whole answer to ``chat``, framed by its length, over HTTP/1.1."""
    assert (r.version, r.status, r.framing) == ("HTTP/1.1", 200, "length"), r.raw[:300]
    assert r.json() == ANSWER and r.header("x-upstream-thing") == "kept"


def healthz_time(port: int) -> float:
    """Seconds a fresh connection's ``GET /healthz`` took (asserting it is a 200)."""
    t = time.monotonic()
    with RawClient(port) as c:
        c.send(request("GET", "/healthz"))
        r = c.response()
    assert r.status == 200 and r.json()["status"] == "ok"
    return time.monotonic() - t
