"""``orchard-rec teacher`` against the real vLLM (the tiny model as its own teacher): every
response position of token-mode and tito samples gets exactly what a direct ``/v1/completions``
``prompt_logprobs`` call returns for those ids, observation positions included; top-k when asked."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.exporters import read_jsonl

from .conftest import MODEL, VLLMServer

TOOL = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}


def _session(client: openai.OpenAI) -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List the files."},
    ]
    for turn in range(3):
        r = client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            tools=[TOOL],
            max_tokens=48,
            seed=turn,  # type: ignore[arg-type, list-item]
        )
        m = r.choices[0].message
        msg: dict[str, Any] = {"role": "assistant", "content": m.content}
        if m.tool_calls:
            msg["tool_calls"] = [t.model_dump(include={"id", "type", "function"}) for t in m.tool_calls]
        msgs.append(msg)
        for t in m.tool_calls or ():
            msgs.append({"role": "tool", "tool_call_id": t.id, "content": "README.md setup.py"})
        msgs.append({"role": "user", "content": f"next {turn}"})


def _direct(base: str, ids: list[int], k: int) -> list[Any]:
    body = json.dumps(
        {"model": MODEL, "prompt": ids, "max_tokens": 1, "prompt_logprobs": k, "temperature": 0}
    ).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["prompt_logprobs"]


@pytest.mark.parametrize("mode", ["token", "tito"])
def test_teacher_logprobs_equal_vllms_prompt_logprobs(
    mode: str, vllm_server: VLLMServer, proxy_factory: Any, sqlite_url: str, tmp_path: Path
) -> None:
    kw: dict[str, Any] = {"mode": mode}
    if mode == "tito":
        kw["tokenizer"] = str(vllm_server.model_dir)
    proxy = proxy_factory(vllm_server.url, sqlite_url, **kw)
    _session(openai.OpenAI(base_url=f"{proxy.url}/s/teach-{mode}/v1", api_key="x", max_retries=0))
    proxy.flush()
    base = vllm_server.url.removesuffix("/v1")
    runner = CliRunner()
    r = runner.invoke(
        app, ["teacher", "--db", sqlite_url, "--url", base, "--top-k", "2", "--concurrency", "1"]
    )
    assert r.exit_code == 0, r.output
    out = tmp_path / "s.jsonl"
    r = runner.invoke(app, ["export", "--db", sqlite_url, "--out", str(out), "--require-teacher"])
    assert r.exit_code == 0, r.output
    samples = list(read_jsonl(out))
    assert samples and all(s.teacher is not None for s in samples)
    for s in samples:
        t = s.teacher
        assert t is not None and t.name == MODEL
        plp = _direct(base, s.tokens, 2)
        p = len(s.tokens) - s.response_length
        assert t.valid_mask == [1] * s.response_length  # observation positions too; the loss mask decides
        for j in range(s.response_length):
            entry = plp[p + j]
            assert t.log_probs[j] == pytest.approx(entry[str(s.tokens[p + j])]["logprob"], abs=1e-4)
            ranked = sorted((v["rank"], int(k)) for k, v in entry.items() if v["rank"] <= 2)
            assert t.topk_ids is not None and t.topk_ids[j] == [tid for _r, tid in ranked]
