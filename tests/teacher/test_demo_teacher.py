"""The runner against the demo upstream as a vLLM and as an SGLang teacher: the stored log-prob
of every response position is what the server says for that token after that prefix."""

from __future__ import annotations

import asyncio

import pytest

from orchard_rec.demo.scoring import teacher_logprob
from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.teacher import MemorySink, SampleRef, TeacherConfig, score_all

TOKENS = [100 + (k * 37) % 400 for k in range(40)]
RESPONSE = 12


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize(("max_len", "truncation"), [(None, "prefix"), (30, "prefix"), (34, "suffix")])
def test_demo_teacher_values(kind: str, max_len: int | None, truncation: str) -> None:
    ref = SampleRef("s", "c", TOKENS, RESPONSE)
    sink = MemorySink()
    with BackgroundServer(DemoUpstream().app()) as up:
        cfg = TeacherConfig(
            url=up.url, kind=kind, top_k=2, max_len=max_len, truncation=truncation, model="demo"
        )
        summary = asyncio.run(score_all([ref], cfg, sink))
    assert summary.failed == 0, summary.errors
    result, _failed, _name = sink.results[("s", "c")]
    p = len(TOKENS) - RESPONSE
    start = 0 if max_len is None or truncation == "suffix" else len(TOKENS) - max_len
    end = len(TOKENS) if max_len is None or truncation == "prefix" else max_len
    for j in range(RESPONSE):
        pos = p + j
        if start < pos < end:
            # positions are counted within what was sent, as a server sees them
            assert result.valid_mask[j] == 1
            assert result.log_probs[j] == pytest.approx(
                teacher_logprob(pos - start, TOKENS[pos - 1], TOKENS[pos])
            )
            assert result.topk_ids is not None and len(result.topk_ids[j]) == 2
        else:
            assert result.valid_mask[j] == 0 and result.log_probs[j] == 0.0
    if truncation == "suffix" and max_len is not None:
        assert result.valid_mask[-(len(TOKENS) - max_len) :] == [0] * (len(TOKENS) - max_len)
