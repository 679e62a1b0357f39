"""A fast fake vLLM for benchmarks: raw asyncio (uvloop), HTTP/1.1 keep-alive, precomputed bodies.

POST /v1/chat/completions, non-stream or stream (``--chunks`` SSE chunks, ``--chunk-delay`` s
apart), with ``prompt_token_ids``/``token_ids`` when ``return_token_ids`` is asked, as vLLM.
    python bench/fakeupstream.py --port 9000 [--chunks 16] [--chunk-delay 0.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json

CONTENT = "orchard " * 8


def _bodies(chunks: int) -> dict[tuple[bool, bool], bytes]:
    def obj(ids: bool) -> dict:  # type: ignore[type-arg]
        o = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": CONTENT},
                    "logprobs": None,
                    "finish_reason": "stop",
                    "token_ids": list(range(100, 116)) if ids else None,
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
            "prompt_token_ids": list(range(12)) if ids else None,
        }
        if ids:
            o["choices"][0]["logprobs"] = {
                "content": [
                    {"token": "x", "logprob": -0.1, "bytes": [120], "top_logprobs": []} for _ in range(16)
                ]
            }
        return o

    def frames(ids: bool) -> list[bytes]:
        out = []
        first = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "prompt_token_ids": list(range(12)) if ids else None,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        out.append(b"data: " + json.dumps(first, separators=(",", ":")).encode() + b"\n\n")
        for k in range(chunks):
            c = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "orchard "},
                        "finish_reason": "stop" if k == chunks - 1 else None,
                        "logprobs": {
                            "content": [{"token": "x", "logprob": -0.1, "bytes": [120], "top_logprobs": []}]
                        }
                        if ids
                        else None,
                        "token_ids": [100 + k] if ids else None,
                    }
                ],
            }
            out.append(b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return out

    return {
        (False, False): json.dumps(obj(False), separators=(",", ":")).encode(),
        (False, True): json.dumps(obj(True), separators=(",", ":")).encode(),
        (True, False): frames(False),  # type: ignore[dict-item]
        (True, True): frames(True),  # type: ignore[dict-item]
    }


class Http(asyncio.Protocol):
    def __init__(self, bodies: dict, delay: float) -> None:  # type: ignore[type-arg]
        self.bodies, self.delay, self.buf = bodies, delay, b""
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v)
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        stream = b'"stream":true' in body or b'"stream": true' in body
        ids = b'"return_token_ids":true' in body or b'"return_token_ids": true' in body
        if head.startswith("GET"):
            payload = b'{"object":"list","data":[{"id":"m","object":"model"}]}'
            self.t.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(payload)
                + payload
            )  # type: ignore[attr-defined]
        elif not stream:
            payload = self.bodies[(False, ids)]
            self.t.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(payload)
                + payload
            )  # type: ignore[attr-defined]
        else:
            self.busy = True
            asyncio.get_running_loop().create_task(self._stream(self.bodies[(True, ids)]))
            return
        self._next()

    async def _stream(self, frames: list[bytes]) -> None:
        w = self.t.write  # type: ignore[attr-defined]
        w(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for f in frames:
            if self.t.is_closing():
                return
            w(b"%x\r\n" % len(f) + f + b"\r\n")
            if self.delay:
                await asyncio.sleep(self.delay)
        w(b"0\r\n\r\n")
        self.busy = False
        self._next()


async def serve(port: int, chunks: int, delay: float) -> None:
    bodies = _bodies(chunks)
    server = await asyncio.get_running_loop().create_server(
        lambda: Http(bodies, delay), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--chunk-delay", type=float, default=0.0)
    a = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(a.port, a.chunks, a.chunk_delay))
