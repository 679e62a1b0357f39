"""MoE routing replay (R3) against a real vLLM, where it can run: vLLM refuses
``--enable-return-routed-experts`` on CPU (it needs Model Runner V2, which needs Triton), so this
test runs where the vLLM venv sees a GPU, or against a server already running with routing on
(``ORCHARD_VLLM_R3_URL="http://HOST:PORT;MODEL_DIR"``); elsewhere it is skipped, and
``tests/proxy/test_routed_experts.py`` checks the same against vLLM's exact answer shape.

It builds a tiny random Qwen2-MoE offline (2 layers, 4 experts, top-2), starts vLLM with
``--enable-scale-out --enable-return-routed-experts``, runs a tito session through the proxy
and checks that what was recorded and exported is what vLLM answered.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard_rec import routing
from orchard_rec.demo.tokenizer import save_tokenizer

from .conftest import VENV, Tap, VLLMServer, _served, _tap_on, _vllm_process

_MOE = """
import sys
from transformers import AutoTokenizer, Qwen2MoeConfig, Qwen2MoeForCausalLM
import torch
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
cfg = Qwen2MoeConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
    shared_expert_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    num_experts=4, num_experts_per_tok=2, max_position_embeddings=4096, tie_word_embeddings=False,
    eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), torch_dtype="float32")
torch.manual_seed(0)
Qwen2MoeForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
"""


def _gpu() -> bool:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        out = subprocess.run(
            [str(VENV / "bin" / "python"), "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "True"


@pytest.fixture(scope="module")
def moe_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    running = os.environ.get("ORCHARD_VLLM_R3_URL")
    if running:
        url, _, folder = running.partition(";")
        yield _served(url, Path(folder), 0.0)
        return
    if not (VENV / "bin" / "python").exists() or not _gpu():
        pytest.skip("vLLM returns routed experts only with Model Runner V2 (a GPU build); none here")
    model_dir = tmp_path_factory.mktemp("moe-model")
    save_tokenizer(model_dir)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(VENV / "bin" / "python"), "-c", _MOE, str(model_dir)], check=True, env=env)
    args = ["--max-model-len", "4096", "--enable-scale-out", "--enable-return-routed-experts"]
    with _vllm_process(model_dir, "tiny-qwen2-moe", args, model_dir) as (url, startup):
        yield _served(url, model_dir, startup)


@pytest.fixture
def moe_tap(moe_server: VLLMServer) -> Iterator[Tap]:
    with _tap_on(moe_server) as t:
        yield t


def test_tito_records_vllms_routing_exactly(moe_server, moe_tap, proxy_factory, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import openai

    proxy = proxy_factory(
        moe_tap.url,
        sqlite_url,
        mode="tito",
        tokenizer=str(moe_server.model_dir),
        tito_endpoint="generate",
        routed_experts=True,
    )
    client = openai.OpenAI(base_url=f"{proxy.url}/s/r3/v1", api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "hello"}]
    for turn in range(2):
        out = client.chat.completions.create(model="m", messages=messages, max_tokens=16)  # type: ignore[arg-type]
        messages += [{"role": "assistant", "content": out.choices[0].message.content or ""}]
        messages += [{"role": "user", "content": f"go on {turn}"}]
    proxy.flush()
    calls = proxy.store().calls("r3")
    answers = [e.json() for e in moe_tap.log if e.path == "/inference/v1/generate"]
    assert len(calls) == len(answers) == 2
    for c, a in zip(calls, answers, strict=True):
        sent = np.load(io.BytesIO(base64.b64decode(a["choices"][0]["routed_experts"])))
        assert sent.shape == (len(c.prompt_ids or ()) + len(c.completion_ids or ()) - 1, 2, 2)
        assert routing.unpack(c.routed_experts or b"").to_lists() == sent.tolist()
    out_file = tmp_path / "s.jsonl"
    from typer.testing import CliRunner

    from orchard_rec.cli import app as cli_app

    r = CliRunner().invoke(cli_app, ["export", "--db", sqlite_url, "--out", str(out_file)])
    assert r.exit_code == 0, r.output
    row = json.loads(out_file.read_text().splitlines()[0])
    assert row["routed_experts"]["shape"][0] == len(row["tokens"]) - 1
