"""``orchard-rec verify`` on a tiny random Qwen2 built here: exact samples pass, a mask shifted by
one position and one changed prompt token are caught (exit 1), from jsonl, parquet and slime files.

The recorded log-probs are the model's own, computed by this test's plain forward pass (not
the scorer's code), so every difference the check finds was put there by the test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.demo.tokenizer import save_tokenizer
from orchard_rec.exporters import get
from orchard_rec.reconstruct import Sample, Turn

pytestmark = pytest.mark.slow  # transformers' import and a model build: ~5 s

PROMPT = [1, 30, 31, 32, 33, 34, 35, 2, 207, 1, 11, 207]
GEN1 = [60, 61, 62, 63, 64, 65, 66, 2]
OBS = [207, 1, 10, 207, 70, 71, 2, 207, 1, 11, 207]
GEN2 = [80, 81, 82, 83, 84, 2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("tiny-qwen2")
    save_tokenizer(d)
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    cfg = transformers.Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(str(d))
    return d


def _recorded(model_dir: Path) -> Sample:
    import torch
    from transformers import AutoModelForCausalLM

    tokens = PROMPT + GEN1 + OBS + GEN2
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logp = model(torch.tensor([tokens])).logits[0].log_softmax(-1)
    mask = [1] * len(GEN1) + [0] * len(OBS) + [1] * len(GEN2)
    n = len(PROMPT)
    lps = [float(logp[n + r - 1, tokens[n + r]]) if m else 0.0 for r, m in enumerate(mask)]
    a, b = len(GEN1), len(GEN1) + len(OBS)
    turns = [Turn("c1", 0, a, "stop"), Turn("c2", b, b + len(GEN2), "stop")]
    meta: dict[str, Any] = {"branch": 0, "call_ids": ["c1", "c2"]}
    return Sample("sess", tokens, len(tokens) - n, mask, lps, turns, metadata=meta)


def _verify(model_dir: Path, path: Path, *extra: str) -> Any:
    return CliRunner().invoke(app, ["verify", "--model", str(model_dir), "-i", str(path), "--json", *extra])


def _lines(out: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_exact_samples_pass_from_every_export_format(model_dir: Path, tmp_path: Path) -> None:
    s = _recorded(model_dir)
    for fmt, name in (("jsonl", "o.jsonl"), ("parquet", "o.parquet"), ("slime", "o.pt")):
        get(fmt).write([dataclasses.replace(s)], tmp_path / name)
        r = _verify(model_dir, tmp_path / name)
        assert r.exit_code == 0, r.output
        *checks, summary = _lines(r.output)
        assert [c["status"] for c in checks] == ["ok"], fmt
        assert checks[0]["checked"] == len(GEN1) + len(GEN2)
        assert summary["summary"]["max_abs"] < 1e-5


def test_a_shifted_mask_and_a_changed_prompt_token_are_caught(model_dir: Path, tmp_path: Path) -> None:
    s = _recorded(model_dir)
    shifted = dataclasses.replace(s, loss_mask=[0] + s.loss_mask[:-1])
    both = dataclasses.replace(  # mask and log-probs one late together: an exporter's off-by-one
        s, loss_mask=[0] + s.loss_mask[:-1], rollout_log_probs=[0.0] + s.rollout_log_probs[:-1]
    )
    changed = dataclasses.replace(s, tokens=[*PROMPT[:4], 40, *s.tokens[5:]])
    for bad in (shifted, both, changed):
        path = tmp_path / "bad.jsonl"
        get("jsonl").write([s, bad], path)
        r = _verify(model_dir, path)
        assert r.exit_code == 1, r.output
        checks = _lines(r.output)[:-1]
        assert [c["status"] for c in checks] == ["ok", "misaligned"]


def test_skipped_samples_and_limits(model_dir: Path, tmp_path: Path) -> None:
    s = _recorded(model_dir)
    none = dataclasses.replace(s, metadata={**s.metadata, "missing_logprobs": True})
    path = tmp_path / "o.jsonl"
    get("jsonl").write([none, s, s], path)
    r = _verify(model_dir, path, "--max-samples", "2")
    assert r.exit_code == 0, r.output
    summary = _lines(r.output)[-1]["summary"]
    assert (summary["samples"], summary["skipped"], summary["ok"]) == (2, 1, 1)
    r = CliRunner().invoke(app, ["verify", "--model", str(model_dir), "-i", str(tmp_path / "x.csv")])
    assert r.exit_code == 2 and "Traceback" not in r.output
