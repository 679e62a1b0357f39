"""The floor for our stack: a bare aiohttp + uvloop forwarder that records nothing.

python bench/floor.py --port 9001 --upstream http://127.0.0.1:9000/v1

``--client orchard``: the same forwarder on orchard-rec's own upstream client
(``orchard_rec.proxy.upclient``) instead of aiohttp's ``ClientSession``: what that client saves a
forwarder (``bench/PROFILE.md`` round 15). The default, aiohttp's client, is the floor the
benchmarks compare against.
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def build_orchard(upstream: str) -> web.Application:
    """The forwarder on ``orchard_rec.proxy.upclient.UpstreamClient`` (its relay is ``build``'s,
    written out again: the floor's own code stays as every earlier round measured it)."""
    from orchard_rec.proxy.upclient import UpstreamClient

    client = UpstreamClient()

    async def cleanup(app: web.Application) -> None:
        await client.close()

    async def forward(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        tail = request.match_info["tail"] + (("?" + request.query_string) if request.query_string else "")
        async with await client.request(
            request.method, upstream + "/" + tail, data=await request.read(), headers=headers
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
    app.on_cleanup.append(cleanup)
    app.router.add_route("*", "/v1/{tail:.*}", forward)
    return app


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
    ap.add_argument("--client", choices=("aiohttp", "orchard"), default="aiohttp")
    a = ap.parse_args()
    try:  # as the proxy does: uvloop when installed
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    app = build(a.upstream) if a.client == "aiohttp" else build_orchard(a.upstream)
    web.run_app(app, host="127.0.0.1", port=a.port, access_log=None, print=None)
