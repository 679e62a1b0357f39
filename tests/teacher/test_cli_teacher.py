"""``orchard-rec teacher`` end to end: sessions recorded through the proxy by the real SDK agents,
scored by the demo upstream as a vLLM and as an SGLang teacher, stored, resumed, exported."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from factories import copy_db
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.exporters import read_jsonl
from orchard_rec.proxy.server import BackgroundServer

pytestmark = pytest.mark.slow
runner = CliRunner()


def _direct_vllm(url: str, ids: list[int], k: int) -> list[Any]:
    body = json.dumps({"prompt": ids, "max_tokens": 1, "prompt_logprobs": k, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())["choices"][0]["prompt_logprobs"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_teacher_scores_every_sample_and_exports_carry_it(
    kind: str, recorded_db: str, tmp_path: Path
) -> None:
    db = copy_db(recorded_db, tmp_path)
    with BackgroundServer(DemoUpstream().app()) as teacher:
        r = runner.invoke(app, ["teacher", "--db", db, "--url", teacher.url, "--kind", kind, "--top-k", "2"])
        assert r.exit_code == 0, r.output
        assert "0 failed" in r.output
        # a re-run has nothing to do
        r = runner.invoke(app, ["teacher", "--db", db, "--url", teacher.url, "--kind", kind, "--top-k", "2"])
        assert r.exit_code == 0 and "0 scored" in r.output and "already done" in r.output
        out = tmp_path / "s.jsonl"
        r = runner.invoke(app, ["export", "--db", db, "--out", str(out), "--require-teacher"])
        assert r.exit_code == 0, r.output
        samples = list(read_jsonl(out))
        assert len(samples) >= 6
        for s in samples:
            t = s.teacher
            assert (
                t is not None
                and len(t.log_probs) == s.response_length
                and t.valid_mask == [1] * s.response_length
            )
            assert t.name == "demo-model" or t.name
            # the same numbers a direct prompt_logprobs call gives for these exact ids
            plp = _direct_vllm(teacher.url, s.tokens, 2)
            p = len(s.tokens) - s.response_length
            for j in range(s.response_length):
                want = plp[p + j][str(s.tokens[p + j])]["logprob"]
                assert t.log_probs[j] == pytest.approx(want, abs=1e-6)
            assert t.topk_ids is not None and all(len(x) == 2 for x in t.topk_ids)


def test_max_len_truncation_and_failures(recorded_db: str, tmp_path: Path) -> None:
    db = copy_db(recorded_db, tmp_path)
    with BackgroundServer(DemoUpstream().app()) as teacher:
        out = tmp_path / "s.jsonl"
        runner.invoke(app, ["export", "--db", db, "--out", str(out)])
        longest = max(read_jsonl(out), key=lambda s: len(s.tokens))
        cut = len(longest.tokens) - 5  # suffix truncation drops the last 5 response tokens
        r = runner.invoke(
            app,
            [
                "teacher",
                "--db",
                db,
                "--url",
                teacher.url,
                "--max-len",
                str(cut),
                "--truncation",
                "suffix",
                "--session",
                longest.session_id,
            ],
        )
        assert r.exit_code == 0, r.output
        runner.invoke(app, ["export", "--db", db, "--out", str(out), "--session", longest.session_id])
        s = next(x for x in read_jsonl(out) if x.tokens == longest.tokens)
        assert (
            s.teacher is not None
            and s.teacher.valid_mask[-5:] == [0] * 5
            and s.teacher.log_probs[-5:] == [0.0] * 5
        )
        assert all(s.teacher.valid_mask[:-5])
    # a teacher that is not there: every sample stored as failed (all-zero mask), exit 1, a re-run retries
    other = "sess-1" if longest.session_id != "sess-1" else "sess-2"
    r = runner.invoke(
        app, ["teacher", "--db", db, "--url", "http://127.0.0.1:9", "--retries", "0", "--session", other]
    )
    assert r.exit_code == 1 and "failed" in r.output
    r = runner.invoke(app, ["export", "--db", db, "--out", str(out), "--session", other])
    assert all(x.teacher is not None and sum(x.teacher.valid_mask) == 0 for x in read_jsonl(out))


def test_usage_errors(recorded_db: str) -> None:
    for args, msg in [
        (["--url", "127.0.0.1:8000"], "--url"),
        (["--url", "http://127.0.0.1:1", "--shard", "4/4"], "--shard takes I/N"),
        (["--url", "http://127.0.0.1:1", "--top-k", "-1"], "--top-k"),
    ]:
        r = runner.invoke(app, ["teacher", "--db", recorded_db, *args])
        assert r.exit_code == 2 and msg in r.output, (args, r.output)


def test_retokenize_teacher_through_the_cli(recorded_db: str, tmp_path: Path) -> None:
    from .test_retokenize import teacher_tokenizer

    db = copy_db(recorded_db, tmp_path)
    path = tmp_path / "teacher-tokenizer.json"
    teacher_tokenizer().save(str(path))
    r = runner.invoke(
        app, ["teacher", "--db", db, "--url", "http://127.0.0.1:1", "--retokenize-teacher", str(path)]
    )
    assert r.exit_code == 2 and "go together" in r.output
    with BackgroundServer(DemoUpstream().app()) as teacher:
        r = runner.invoke(
            app,
            [
                "teacher",
                "--db",
                db,
                "--url",
                teacher.url,
                "--session",
                "sess-0",
                "--tokenizer",
                "demo",
                "--retokenize-teacher",
                str(path),
            ],
        )
        assert r.exit_code == 0, r.output
    out = tmp_path / "s.jsonl"
    runner.invoke(app, ["export", "--db", db, "--out", str(out), "--session", "sess-0"])
    for s in read_jsonl(out):
        assert s.teacher is not None and len(s.teacher.valid_mask) == s.response_length
        assert 0 < sum(s.teacher.valid_mask) <= s.response_length  # aligned positions only
