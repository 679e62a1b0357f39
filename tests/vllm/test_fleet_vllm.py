"""A fleet of two real vLLM CPU servers (tiny model) behind one proxy: under ``--route session`` each
session's calls stay on one server, and vLLM's own prefix-cache hit counters (its ``/metrics``,
``vllm:prefix_cache_hits_total``) are higher than under ``round-robin`` for the same workload."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from orchard_rec.proxy.fleet import Fleet
from orchard_rec.records import CallOutcome

from .conftest import MODEL, VLLMServer, _served, _vllm_process

SESSIONS = 8
TURNS = 6


@pytest.fixture(scope="module")
def second_vllm(vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A second server on the same model (the first is the shared ``vllm_server``)."""
    logs = tmp_path_factory.mktemp("vllm-second")
    args = ["--max-model-len", "4096"]
    with _vllm_process(vllm_server.model_dir, MODEL, args, logs) as (url, startup):
        yield _served(url, vllm_server.model_dir, startup)


def _counters(urls: list[str]) -> tuple[float, float]:
    """vLLM's ``vllm:prefix_cache_hits_total`` and ``vllm:prefix_cache_queries_total`` (prompt
    tokens served from the cache, prompt tokens looked up), summed over ``urls``."""
    hits = queries = 0.0
    for url in urls:
        text = urllib.request.urlopen(url[: -len("/v1")] + "/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def _run(base: str, sessions: list[str]) -> None:
    """``SESSIONS`` chat sessions of ``TURNS`` turns at once, each with a long prompt of its own."""
    errors: list[BaseException] = []

    def one(sid: str) -> None:
        try:
            client = openai.OpenAI(base_url=f"{base}/s/{sid}/v1", api_key="k", max_retries=0, timeout=300)
            messages: list[dict[str, Any]] = [{"role": "system", "content": f"Session {sid}."}]
            for turn in range(TURNS):  # each turn brings a long tool output, as an agent's do
                output = " ".join(f"line {sid}-{turn}-{i} = {i * 7 % 13}" for i in range(30))
                messages.append({"role": "user", "content": f"turn {turn}: {output}"})
                r = client.chat.completions.create(
                    model=MODEL,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=8,
                    temperature=0,
                )
                messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_session_routing_is_sticky_and_warms_vllms_prefix_cache(
    vllm_server: VLLMServer,
    second_vllm: VLLMServer,
    proxy_factory: Any,
    tmp_path: Path,
) -> None:
    urls = [vllm_server.url, second_vllm.url]
    ring = Fleet(urls)
    hits: dict[str, float] = {}
    queries: dict[str, float] = {}
    for route in ("session", "round-robin"):
        names = [f"{route[0]}-{k:03d}" for k in range(400)]  # the same length under both routes
        sessions = [n for n in names if ring.home(n).url == urls[0]][: SESSIONS // 2]
        sessions += [n for n in names if ring.home(n).url == urls[1]][: SESSIONS // 2]
        db = f"sqlite:///{tmp_path / (route + '.db')}"
        proxy = proxy_factory(urls[0], db, fleet=(urls[1],), route=route, mode="passthrough")
        h0, q0 = _counters(urls)
        _run(proxy.url, sessions)
        h1, q1 = _counters(urls)
        hits[route], queries[route] = h1 - h0, q1 - q0
        proxy.flush()
        store = proxy.store()
        for s in sessions:
            calls = store.calls(s)
            assert len(calls) == TURNS and all(c.outcome is CallOutcome.OK for c in calls)
            where = [c.metadata["upstream"] for c in calls]
            if route == "session":  # >= 99 %: here every call of a session on its one server
                assert where == [ring.home(s).url] * TURNS, (s, where)
    print(f"vLLM prefix-cache hits / queries (tokens): {hits} / {queries}")
    assert queries["session"] == pytest.approx(queries["round-robin"], rel=0.1)  # the same work
    assert hits["session"] > 1.1 * hits["round-robin"], (hits, queries)
