"""Trainer glue: slime plug-ins, the torch dataset, the credit-assignment SFT loop, verl outputs.

slime's plug-in signatures are pinned as slime calls them: ``generate_rollout(args,
rollout_id, data_source, evaluation=False)`` (slime/ray/rollout.py) and
``await generate(args, sample, sampling_params)`` (slime/rollout/sglang_rollout.py).
"""

from __future__ import annotations

import asyncio
import inspect
from argparse import Namespace
from typing import TYPE_CHECKING

import pytest

from orchard_rec.exporters import read_jsonl
from orchard_rec.exporters.contracts import SlimeSample
from orchard_rec.exporters.pipeline import export
from orchard_rec.trainers import slime as slime_plugins
from orchard_rec.trainers.verl import RecordedAgentLoop, agent_loop_output

if TYPE_CHECKING:
    import torch  # imported where used (also trainers.dataset): collecting the fast tier should not load torch (~2-4 s)

pytestmark = pytest.mark.slow  # the session-scoped recorded_db fixture records sessions through a real proxy (~70 s on a loaded machine); torch training


def test_plugin_signatures_match_what_slime_calls() -> None:
    assert list(inspect.signature(slime_plugins.generate_rollout).parameters) == [
        "args",
        "rollout_id",
        "data_source",
        "evaluation",
    ]
    assert list(inspect.signature(slime_plugins.generate).parameters)[:3] == [
        "args",
        "sample",
        "sampling_params",
    ]
    assert inspect.iscoroutinefunction(slime_plugins.generate)


def test_slime_rollout_function_serves_groups_equal_to_the_slime_export(recorded_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    torch_file = tmp_path / "r.pt"
    export(recorded_db, "slime", torch_file, group_by="task")
    exported = torch.load(torch_file, weights_only=False)["samples"]
    args = Namespace(orchard_db=recorded_db, rollout_batch_size=2, orchard_group_by="task")
    r0 = slime_plugins.generate_rollout(args, 0, None)
    r1 = slime_plugins.generate_rollout(args, 1, None)
    assert [len(g) for g in r0] == [2, 2] and [len(g) for g in r1] == [2]
    served = [s for group in r0 + r1 for s in group]
    assert all(isinstance(s, SlimeSample) for s in served)
    assert [s.to_dict() for s in served] == exported
    assert all(len({s.group_index for s in g}) == 1 for g in r0 + r1)


def test_slime_generate_runs_a_harness_against_the_rollout_server(upstream, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from orchard_rec.harnesses import CODEX, install

    install(CODEX)
    host, port = upstream.server.host, upstream.server.port
    args = Namespace(
        sglang_router_ip=host,
        sglang_router_port=port,
        orchard_db=f"sqlite:///{tmp_path / 'g.db'}",
        orchard_harness="codex",
        orchard_model="fake-model",
    )
    monkeypatch.chdir(tmp_path)
    sample = SlimeSample(prompt="Please run `echo orchard > marker.txt` and report.", index=3)
    out = asyncio.run(slime_plugins.generate(args, sample, {"temperature": 1.0}))
    assert out is sample and out.status is SlimeSample.Status.COMPLETED
    assert out.response_length == len(out.loss_mask) == len(out.rollout_log_probs) > 0
    assert sum(out.loss_mask) > 0 and out.metadata["harness_exit_code"] == 0
    assert len(out.metadata["call_ids"]) == 2 and out.metadata["samples_in_session"] == 1
    assert any(
        path == "/v1/chat/completions" for path, _ in upstream.fake.log
    )  # Codex's Responses calls, translated


def test_dataset_tensors_equal_the_jsonl_export(recorded_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from orchard_rec.trainers.dataset import OrchardDataset, OrchardIterableDataset, collate, collate_packed

    export(recorded_db, "jsonl", tmp_path / "s.jsonl")
    ref = list(read_jsonl(tmp_path / "s.jsonl"))
    ds = OrchardDataset(tmp_path / "s.jsonl", advantage_fn=lambda s: s.reward - 0.5)
    assert len(ds) == len(ref)
    for item, r in zip(ds, ref):
        p = r.prompt_length
        assert item["input_ids"].tolist() == r.tokens
        assert item["loss_mask"].tolist() == [0] * p + r.loss_mask
        assert item["labels"].tolist() == [t if m else -100 for t, m in zip(r.tokens, [0] * p + r.loss_mask)]
        assert item["rollout_log_probs"][p:].tolist() == pytest.approx(r.rollout_log_probs)
        assert item["position_ids"].tolist() == list(range(len(r.tokens)))
        assert item["advantages"][p:].tolist() == [r.reward - 0.5] * r.response_length
    streamed = list(OrchardIterableDataset(db=recorded_db))
    assert [it["input_ids"].tolist() for it in streamed] == [r.tokens for r in ref]

    batch = collate([ds[0], ds[1]], pad_token_id=0)
    n0, n1 = len(ref[0].tokens), len(ref[1].tokens)
    width = max(n0, n1)
    assert batch["input_ids"].shape == (2, width)
    short = 0 if n0 < n1 else 1
    assert (
        batch["labels"][short, min(n0, n1) :].eq(-100).all()
        and batch["attention_mask"][short, min(n0, n1) :].eq(0).all()
    )
    packed = collate_packed([ds[0], ds[1]])
    assert packed["input_ids"].shape == (1, n0 + n1)
    assert packed["position_ids"][0].tolist() == list(range(n0)) + list(range(n1))
    assert packed["cu_seqlens"].tolist() == [[0, n0, n0 + n1]]
    rows = collate_packed([ds[0], ds[1], ds[2]], max_tokens=max(n0, n1, len(ref[2].tokens)) + 1)
    assert rows["input_ids"].shape[0] >= 2


def _tiny_model(vocab: int) -> torch.nn.Module:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=65536,
    )
    return LlamaForCausalLM(cfg)


def test_sft_trains_only_credited_tokens_and_the_loss_falls(recorded_db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    from orchard_rec.demo.tokenizer import build_tokenizer
    from orchard_rec.reconstruct import Sample, SampleBuilder
    from orchard_rec.trainers.dataset import collate, sample_tensors
    from orchard_rec.trainers.sft import credited_loss, train_sft

    vocab = build_tokenizer().get_vocab_size()
    model = _tiny_model(vocab)
    # a fixed tiny dataset: short samples cut from the recorded ones (prompt tail + response)
    export(recorded_db, "jsonl", tmp_path / "s.jsonl")
    data: list[Sample] = []
    for r in list(read_jsonl(tmp_path / "s.jsonl"))[:4]:
        b = SampleBuilder(r.session_id, r.prompt_ids[-24:])
        t = r.turns[0]
        b.append_generation(r.response_ids[t.start : t.end], r.rollout_log_probs[t.start : t.end], t.call_id)
        b.append_observation(r.response_ids[t.end : t.end + 6])
        data.append(b.build())

    # the gradient reaching the logits is exactly zero wherever the target is not credited
    batch = collate([sample_tensors(s) for s in data])
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    grads: list[torch.Tensor] = []
    logits.register_hook(lambda g: grads.append(g))
    loss, n = credited_loss(logits, batch)
    loss.backward()
    g = grads[0]
    target_credited = torch.zeros_like(batch["labels"], dtype=torch.bool)
    target_credited[:, :-1] = batch["labels"][:, 1:] != -100
    assert n == int(target_credited.sum()) > 0
    assert g[~target_credited].abs().max().item() == 0.0
    assert g[target_credited].abs().sum().item() > 0

    model.zero_grad()
    result = train_sft(model, data, steps=20, batch_size=4, lr=3e-3, out=tmp_path / "ckpt")
    assert len(result.losses) == 20 and result.losses[-1] < result.losses[0] * 0.7
    assert (tmp_path / "ckpt" / "config.json").exists()


def test_verl_agent_loop_outputs(recorded_db) -> None:  # type: ignore[no-untyped-def]
    from orchard_rec.pipeline import iter_samples
    from orchard_rec.storage import Store

    [s] = list(iter_samples(Store(recorded_db), sessions=["sess-0"]))
    out = agent_loop_output(s)
    assert out["prompt_ids"] + out["response_ids"] == s.tokens and out["response_mask"] == s.loss_mask
    assert out["reward_score"] == 1.0 and out["num_turns"] == 2 * len(s.turns)
    loop = RecordedAgentLoop(recorded_db)
    assert asyncio.run(loop.run({}, session_id="sess-0"))["response_ids"] == s.response_ids
