"""Three proxy replicas writing to one PostgreSQL: sequence numbers stay gap-free per
session, no duplicates, and reconstruction equals what a single proxy gives.

Replicas here are proxies in this process (each a whole proxy, like a worker); ``serve
--workers 2`` on PostgreSQL is ``test_workers``'s kill -9 test."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from orchard_rec.pipeline import iter_samples
from orchard_rec.records import CallOutcome

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.network,
]  # three proxy replicas on one PostgreSQL

SESSIONS = 30
TURNS = 4


async def _drive(bases: list[str], rotate: bool) -> None:
    async with aiohttp.ClientSession() as http:

        async def session(i: int) -> None:
            messages = [
                {"role": "system", "content": "agent"},
                {"role": "user", "content": f"task {i}: run `echo {i}`"},
            ]
            for turn in range(TURNS):
                base = bases[(i + turn) % len(bases)] if rotate else bases[0]
                body = {
                    "model": "m",
                    "messages": messages,
                    "stream": turn % 2 == 0,
                    "tools": [
                        {
                            "type": "function",
                            "function": {
                                "name": "exec_command",
                                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
                            },
                        }
                    ],
                }
                async with http.post(
                    f"{base}/s/rep-{i}/v1/chat/completions", json={**body, "stream": False}
                ) as r:
                    msg = (await r.json())["choices"][0]["message"]
                messages = messages + [
                    {"role": "assistant", "content": msg["content"], "tool_calls": msg["tool_calls"] or None}
                ]
                if msg["tool_calls"]:
                    messages.append(
                        {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"out {i}"}
                    )
                else:
                    messages.append({"role": "user", "content": f"again {turn}"})

        await asyncio.gather(*(session(i) for i in range(SESSIONS)))


def test_three_replicas_share_one_postgres(upstream, proxy_factory, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    shared = pg.new_database()
    replicas = [
        proxy_factory(upstream.url, shared, mode="token", spool=str(tmp_path / f"replica-{k}.spool"))
        for k in range(3)
    ]
    asyncio.run(_drive([r.url for r in replicas], rotate=True))
    for r in replicas:
        r.flush()
    single_db = pg.new_database()
    single = proxy_factory(upstream.url, single_db, mode="token", spool=str(tmp_path / "single.spool"))
    asyncio.run(_drive([single.url], rotate=False))
    single.flush()

    store, ref = replicas[0].store(), single.store()
    assert store.count_calls() == SESSIONS * TURNS
    ids = [c.call_id for c in store.calls()]
    assert len(ids) == len(set(ids))
    for i in range(SESSIONS):
        recs = store.calls(f"rep-{i}")
        assert [c.seq for c in recs] == list(range(1, TURNS + 1))
        assert all(c.outcome is CallOutcome.OK for c in recs)
    got = [(s.session_id, s.tokens, s.loss_mask) for s in iter_samples(store)]
    want = [(s.session_id, s.tokens, s.loss_mask) for s in iter_samples(ref)]
    assert got == want and len(got) == SESSIONS, _debug_diff(got, want)


def _debug_diff(got, want):  # type: ignore[no-untyped-def]
    from orchard_rec.demo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    for (sa, ta, _), (sb, tb, _) in zip(got, want):
        if ta != tb:
            n = next(k for k, (x, y) in enumerate(zip(ta, tb)) if x != y)
            return (
                sa,
                sb,
                tok.decode(ta[n - 20 : n + 60], skip_special_tokens=False),
                tok.decode(tb[n - 20 : n + 60], skip_special_tokens=False),
            )
    return None
