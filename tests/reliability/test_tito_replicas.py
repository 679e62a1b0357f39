"""tito across replicas and restarts: any replica serves any turn of any session.

Two tito proxies on one PostgreSQL behind a round-robin balancer (each call of a session
goes to the other replica), one of them restarted mid-session (its memory gone), against
the upstream in drift mode (re-rendering the model's text would re-tokenize it differently).
Real SDK sessions in every dialect, stream and not: every session's calls continue one
branch (only the first is fresh), the prompts extend each other exactly, one sample each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from e2e.agents import AGENTS
from factories import session_base

from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.records import CallOutcome

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


class Balancer:
    """Round robin over ``targets``; ``before(n)`` runs before the n-th request is forwarded."""

    def __init__(self, targets: list[str], before: Callable[[int], None]) -> None:
        self.targets = targets
        self.before = before
        self.n = 0

    async def forward(self, request: web.Request) -> web.StreamResponse:
        n = self.n
        self.n += 1
        await asyncio.to_thread(self.before, n)
        target = self.targets[n % len(self.targets)]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as http,
            http.request(
                request.method, target + request.path_qs, data=await request.read(), headers=headers
            ) as up,
        ):
            resp = web.StreamResponse(
                status=up.status,
                headers={
                    k: v
                    for k, v in up.headers.items()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")
                },
            )
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app


def test_sessions_continue_across_two_replicas_and_a_restart(upstream_factory, proxy_factory, pg) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(drift=True)
    db = pg.new_database()
    replicas = [proxy_factory(up.url, db, mode="tito", tokenizer="demo") for _ in range(2)]
    targets = [r.url for r in replicas]
    restarted: list[Any] = []

    def before(n: int) -> None:
        if n == 7:  # mid-session: replica 0 goes away, a fresh process takes its place
            replicas[0].server.stop()
            fresh = proxy_factory(up.url, db, mode="tito", tokenizer="demo")
            restarted.append(fresh)
            targets[0] = fresh.url

    with BackgroundServer(Balancer(targets, before).app()) as lb:
        runs = []
        for dialect in ("chat", "responses", "messages"):
            sid = f"rr-{dialect}"
            before_log = len(up.fake.log)
            n = AGENTS[dialect](session_base(lb.url, sid, dialect), None)
            runs.append((sid, n, [b["prompt"] for _, b in up.fake.log[before_log:]]))
    assert restarted, "the restart happened mid-run"
    store = replicas[1].store()
    for sid, n, sent in runs:
        calls = store.calls(sid)
        assert len(calls) == n and all(c.outcome is CallOutcome.OK for c in calls)
        assert [c.metadata["tito"]["fresh"] for c in calls] == [True] + [False] * (n - 1), sid
        assert len({c.metadata["tito"]["branch"] for c in calls}) == 1
        for a, prompt_b in zip(calls, sent[1:]):  # each prompt extends the last exactly
            assert prompt_b[: len(a.prompt_ids) + len(a.completion_ids)] == list(a.prompt_ids) + list(
                a.completion_ids
            )
        [sample] = reconstruct_session(calls)  # one sample per session
        assert sample.tokens == list(calls[-1].prompt_ids) + list(calls[-1].completion_ids)
