"""A teacher with another tokenizer: student response tokens are mapped onto the teacher's by
text; exactly the tokens covering the same characters get the teacher's log-prob."""

from __future__ import annotations

import asyncio

from aiohttp import web
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from orchard_rec.demo.scoring import teacher_logprob, vllm_prompt_logprobs
from orchard_rec.demo.tokenizer import build_tokenizer
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.teacher import MemorySink, SampleRef, TeacherConfig, score_all
from orchard_rec.teacher.align import align

TEXT = "The quick brown fox runs ls -la and reads README.md before it edits setup.py again."


def teacher_tokenizer() -> Tokenizer:
    """Byte-level BPE trained on a few sentences: a vocabulary unlike the demo's."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT, "quick brown fox", "README.md setup.py", "reads edits runs"] * 20, trainer)
    return tok


async def _completions(request: web.Request) -> web.Response:
    body = await request.json()
    plp = vllm_prompt_logprobs(body["prompt"], 0, 400, lambda t: "x")
    return web.json_response({"model": "other-vocab", "choices": [{"index": 0, "prompt_logprobs": plp}]})


def test_alignment_by_characters() -> None:
    student, teacher = build_tokenizer(), teacher_tokenizer()
    ids = student.encode(TEXT, add_special_tokens=False).ids
    n = len(ids) // 2
    a = align(student, teacher, ids, n)
    t_enc = teacher.encode(TEXT, add_special_tokens=False)
    s_enc = student.encode(TEXT, add_special_tokens=False)
    assert a.teacher_ids == t_enc.ids
    for j, k in enumerate(a.positions):
        span = s_enc.offsets[len(ids) - n + j]
        assert (k is not None) == (span in t_enc.offsets)
        if k is not None:
            assert t_enc.offsets[k] == span
    assert any(k is not None for k in a.positions) and any(k is None for k in a.positions)


def test_score_with_a_teacher_of_another_vocabulary() -> None:
    student, teacher = build_tokenizer(), teacher_tokenizer()
    ids = student.encode(TEXT, add_special_tokens=False).ids
    n = len(ids) // 2
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    sink = MemorySink()
    with BackgroundServer(app) as srv:
        cfg = TeacherConfig(url=srv.url, model="m", retokenize=(student, teacher))
        summary = asyncio.run(score_all([SampleRef("s", "c", ids, n)], cfg, sink))
    assert summary.failed == 0, summary.errors
    result = sink.results[("s", "c")][0]
    a = align(student, teacher, ids, n)
    t_ids = a.teacher_ids
    for j, k in enumerate(a.positions):
        if k is None or k == 0:
            assert result.valid_mask[j] == 0 and result.log_probs[j] == 0.0
        else:
            assert result.valid_mask[j] == 1
            assert result.log_probs[j] == teacher_logprob(k, t_ids[k - 1], t_ids[k])
    assert 0 < sum(result.valid_mask) < n
