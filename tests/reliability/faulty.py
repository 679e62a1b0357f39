"""An upstream that misbehaves on demand, chosen by the request's ``model``."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'


class FaultyUpstream:
    def __init__(self) -> None:
        self.cancelled = 0
        self.started = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        fault = body.get("model")
        self.started += 1
        try:
            if fault == "fault-500":
                return web.json_response(
                    {"error": {"message": "engine crashed", "type": "InternalServerError", "code": 500}},
                    status=500,
                )
            if fault == "fault-hang":
                await asyncio.sleep(30)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if fault == "fault-reset":
                await resp.write(CHUNK)
                await resp.write(CHUNK)
                await asyncio.sleep(0.05)
                request.transport.abort()  # type: ignore[union-attr]
                return resp
            if fault == "fault-malformed":
                await resp.write(b"data: {not json at all\n\n: a comment\n\nevent: weird\ndata: [1, 2\n\n")
                await resp.write(CHUNK)
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if fault == "fault-hang-midstream":
                await resp.write(CHUNK)
                await asyncio.sleep(30)
            if fault == "fault-slow":
                for _ in range(5):
                    await resp.write(CHUNK)
                    await asyncio.sleep(0.2)
                await resp.write(b"data: [DONE]\n\n")
                return resp
            await resp.write(CHUNK)
            await resp.write(b"data: [DONE]\n\n")
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app
