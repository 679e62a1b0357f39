"""The floor for our stack: a bare aiohttp + uvloop forwarder that records nothing.

python bench/floor.py --port 9001 --upstream http://127.0.0.1:9000/v1
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def build(upstream: str) -> web.Application:
    async def startup(app: web.Application) -> None:
        app["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def cleanup(app: web.Application) -> None:
        await app["s"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with request.app["s"].request(
            request.method,
            upstream + "/" + request.match_info["tail"],
            data=await request.read(),
            headers=headers,
        ) as up:
            out = {k: v for k, v in up.headers.items() if k.lower() not in HOP}
            if up.content_type == "text/event-stream":
                resp = web.StreamResponse(status=up.status, headers=out)
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
            return web.Response(status=up.status, body=await up.read(), headers=out)

    app = web.Application()
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    app.router.add_route("*", "/v1/{tail:.*}", forward)
    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    a = ap.parse_args()
    try:  # as the proxy does: uvloop when installed
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(build(a.upstream), host="127.0.0.1", port=a.port, access_log=None, print=None)
