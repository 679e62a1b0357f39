"""The teacher runner against a teacher server on loopback that fails on purpose:
retries, failures stored with an all-zero mask, a re-run fills only those, shards split."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from orchard_rec.demo.scoring import vllm_prompt_logprobs
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.teacher import SampleRef, TeacherConfig, TeacherResult, in_shard, score_all, score_live


class Teacher:
    """vLLM-shaped /v1/completions with prompt_logprobs; ids containing 666 always 500, ids
    containing 777 fail once (a retry succeeds)."""

    def __init__(self) -> None:
        self.requests: list[list[int]] = []
        self.flaky_seen: set[tuple[int, ...]] = set()
        self.broken = True

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = body["prompt"]
        self.requests.append(ids)
        if 666 in ids and self.broken:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if 777 in ids and tuple(ids) not in self.flaky_seen:
            self.flaky_seen.add(tuple(ids))
            return web.json_response({"error": {"message": "flaky"}}, status=503)
        plp = vllm_prompt_logprobs(ids, int(body.get("prompt_logprobs") or 0), 1000, lambda t: f"<{t[0]}>")
        return web.json_response(
            {"model": "teach", "choices": [{"index": 0, "text": "", "prompt_logprobs": plp}]}
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "teach-model"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        return app


class DictSink:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], tuple[str, bool, TeacherResult, str]] = {}

    def stored_hash(self, session_id: str, sample_key: str) -> tuple[str, bool] | None:
        row = self.rows.get((session_id, sample_key))
        return None if row is None else (row[0], row[1])

    def save(self, ref: SampleRef, result: TeacherResult, *, failed: bool, teacher: str, top_k: int) -> None:
        self.rows[(ref.session_id, ref.sample_key)] = (ref.content_hash, failed, result, teacher)


def _refs() -> list[SampleRef]:
    return [
        SampleRef("s1", "c1", [1, 2, 3, 4, 5], 2),
        SampleRef("s2", "c2", [1, 2, 666, 4], 1),
        SampleRef("s3", "c3", [9, 777, 8, 7, 6], 3),
    ]


def test_failures_retries_and_resume() -> None:
    teacher = Teacher()
    sink = DictSink()
    with BackgroundServer(teacher.app()) as srv:
        cfg = TeacherConfig(url=srv.url, kind="vllm", concurrency=2, retries=1, top_k=1)
        summary = asyncio.run(score_all(_refs(), cfg, sink))
        assert (summary.samples, summary.scored, summary.failed) == (3, 2, 1)
        _hash, failed, result, name = sink.rows[("s2", "c2")]
        assert failed and result.valid_mask == [0] and name == "teach-model"
        ok = sink.rows[("s1", "c1")][2]
        assert ok.valid_mask == [1, 1] and len(ok.log_probs) == 2
        assert ok.topk_ids is not None and all(len(t) == 1 for t in ok.topk_ids)
        assert sink.rows[("s3", "c3")][2].valid_mask == [1, 1, 1]  # the 503 was retried
        # a re-run fills the failed sample and recomputes nothing else
        teacher.broken = False
        before = len(teacher.requests)
        summary = asyncio.run(score_all(_refs(), cfg, sink))
        assert (summary.scored, summary.skipped, summary.failed) == (1, 2, 0)
        assert teacher.requests[before:] == [[1, 2, 666, 4]]
        # a changed sample (new ids under the same key) is redone
        changed = [SampleRef("s1", "c1", [1, 2, 3, 4, 6], 2)]
        assert asyncio.run(score_all(changed, cfg, sink)).scored == 1


def test_shards_partition_the_samples() -> None:
    keys = [f"call-{i}" for i in range(200)]
    parts = [[k for k in keys if in_shard(k, (i, 4))] for i in range(4)]
    assert sorted(k for p in parts for k in p) == sorted(keys) and all(parts)
    assert all(in_shard(k, None) for k in keys)


def test_score_live_attaches_teacher_data() -> None:
    class S:
        def __init__(self, sid: str, tokens: list[int], n: int) -> None:
            self.session_id, self.sample_key, self.tokens, self.response_length = sid, sid, tokens, n
            self.teacher: Any = None

    samples = [S("a", [1, 2, 3], 1), S("b", [4, 666, 6], 2)]
    with BackgroundServer(Teacher().app()) as srv:
        summary = score_live(samples, TeacherConfig(url=srv.url, kind="vllm", retries=0))
    assert summary.failed == 1
    assert samples[0].teacher.valid_mask == [1] and samples[0].teacher.name == "teach-model"
    assert samples[1].teacher.valid_mask == [0, 0]


def test_max_len_is_asked_of_the_server_when_not_given() -> None:
    """As Orchard's ``on_policy_distillation._fetch_teacher_max_len`` (MSR-Orchard/slime 331efaa):
    SGLang's ``/get_server_info`` ``max_req_input_len`` minus one (SGLang rejects an input of
    exactly that length), else ``/v1/models`` ``max_model_len`` minus one; ``--max-len`` wins."""
    teacher = Teacher()
    app = teacher.app()
    info = {"max_req_input_len": 4}

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response(info)

    app.router.add_get("/get_server_info", server_info)
    long = [SampleRef("s9", "c9", [1, 2, 3, 4, 5, 6], 2)]
    with BackgroundServer(app) as srv:
        sink = DictSink()
        asyncio.run(score_all(long, TeacherConfig(url=srv.url, kind="vllm"), sink))
        assert teacher.requests[-1] == [4, 5, 6]  # 3 = 4 - 1 ids: the prompt's head dropped
        assert sink.rows[("s9", "c9")][2].valid_mask == [1, 1]
        asyncio.run(score_all(long, TeacherConfig(url=srv.url, kind="vllm", max_len=5), DictSink()))
        assert teacher.requests[-1] == [2, 3, 4, 5, 6]
        info.clear()  # no max_req_input_len: /v1/models has no max_model_len here: nothing cut
        asyncio.run(score_all(long, TeacherConfig(url=srv.url, kind="vllm"), DictSink()))
        assert teacher.requests[-1] == [1, 2, 3, 4, 5, 6]
