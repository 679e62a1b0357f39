"""50 interleaved concurrent sessions: no cross-talk, gap-free sequence numbers, nothing lost."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from orchard_rec.records import CallOutcome

SESSIONS = 50
TURNS = 4


async def _session(http: aiohttp.ClientSession, base: str, sid: str) -> int:
    sent = 0
    for turn in range(TURNS):
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": f"session {sid} turn {turn}"}],
            "stream": turn % 2 == 1,
        }
        async with http.post(f"{base}/s/{sid}/v1/chat/completions", json=body) as r:
            data = await r.read()
            assert r.status == 200
            if body["stream"]:
                assert data.endswith(b"data: [DONE]\n\n")
            else:  # the answer quotes this session's prompt
                assert f"session {sid} turn {turn}".encode() in data
        sent += 1
        await asyncio.sleep(0)
    return sent


@pytest.mark.slow  # fifty sessions through a real proxy: ~7 s on SQLite
def test_fifty_interleaved_sessions(upstream, proxy_factory, db_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, db_url, mode="passthrough")

    async def main() -> int:
        async with aiohttp.ClientSession() as http:
            counts = await asyncio.gather(*(_session(http, proxy.url, f"c{i}") for i in range(SESSIONS)))
        return sum(counts)

    sent = asyncio.run(main())
    proxy.flush()
    store = proxy.store()
    assert store.count_calls() == sent == SESSIONS * TURNS
    for i in range(SESSIONS):
        sid = f"c{i}"
        recs = store.calls(sid)
        assert [r.seq for r in recs] == list(range(1, TURNS + 1))
        assert all(r.outcome is CallOutcome.OK for r in recs)
        for r in recs:  # no cross-talk: every recorded request and response belongs to this session
            assert r.request["messages"][0]["content"].startswith(f"session {sid} turn")
            assert f"session {sid} turn" in r.response["choices"][0]["message"]["content"]
        assert [r.request["messages"][0]["content"] for r in recs] == [
            f"session {sid} turn {t}" for t in range(TURNS)
        ]
