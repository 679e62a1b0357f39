"""Every format, read back with its consumer's own loader, equals the jsonl export sample by sample.

Sessions are recorded through the proxy (token mode) from the fake vLLM upstream by the
three SDK agents, graded with outcomes, then exported. Each consumer contract is pinned
to the trainer's source (see each exporter's docstring).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from orchard_rec.errors import UsageError
from orchard_rec.exporters import ExportError, get, read_jsonl
from orchard_rec.exporters.contracts import SLIME_FIELDS, SlimeSample
from orchard_rec.exporters.pipeline import export

pytestmark = (
    pytest.mark.slow
)  # the session-scoped recorded_db fixture records sessions through a real proxy (~70 s on a loaded machine)


@pytest.fixture(scope="module")
def recorded(recorded_db: str) -> str:
    return recorded_db


def _jsonl(db: str, tmp: Path, **sel: Any) -> list:  # type: ignore[type-arg]
    stats = export(db, "jsonl", tmp / "ref.jsonl", **sel)
    return list(read_jsonl(tmp / "ref.jsonl")) if stats.samples else []  # an empty export writes nothing


def test_slime_torch_file_matches_slimes_loader(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    ref = _jsonl(recorded, tmp_path)
    stats = export(recorded, "slime", tmp_path / "rollout.pt")
    assert stats.samples == len(ref) == 6
    data = torch.load(tmp_path / "rollout.pt", weights_only=False)  # as slime/ray/rollout.py loads it
    assert data["rollout_id"] == 0
    assert (
        b"orchard_rec" not in (tmp_path / "rollout.pt").read_bytes()
    )  # loads where orchard-rec is not installed
    for d, r in zip(data["samples"], ref):
        assert set(d) == set(SLIME_FIELDS)  # no unknown keys, none missing
        assert type(d["status"]) is str
        s = SlimeSample.from_dict(d)
        assert s.tokens == r.tokens and s.response_length == r.response_length
        assert s.loss_mask == r.loss_mask and len(s.loss_mask) == s.response_length
        assert s.rollout_log_probs == r.rollout_log_probs and s.reward == r.reward
        assert s.status is SlimeSample.Status.COMPLETED and s.index == r.index
        assert s.tokens[-s.response_length :] == r.response_ids  # the mask covers the response


def test_slime_rollout_size_splits_files_with_rollout_ids(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    stats = export(recorded, "slime", tmp_path / "r_{rollout_id}.pt", format_options={"rollout_size": 4})
    assert [p.name for p in stats.files] == ["r_0.pt", "r_1.pt"]
    a, b = (torch.load(p, weights_only=False) for p in stats.files)
    assert (a["rollout_id"], len(a["samples"]), b["rollout_id"], len(b["samples"])) == (0, 4, 1, 2)
    stats = export(recorded, "slime", tmp_path / "plain.pt", format_options={"rollout_size": 3})
    assert [p.name for p in stats.files] == ["plain_0.pt", "plain_1.pt"]


def test_parquet_generic(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = _jsonl(recorded, tmp_path)
    export(recorded, "parquet", tmp_path / "s.parquet")
    t = pq.read_table(tmp_path / "s.parquet")
    assert str(t.schema.field("tokens").type) == "list<element: int32>"
    assert pq.ParquetFile(tmp_path / "s.parquet").metadata.row_group(0).column(0).compression == "ZSTD"
    for row, r in zip(t.to_pylist(), ref):
        assert row["tokens"] == r.tokens and row["loss_mask"] == r.loss_mask
        assert row["rollout_log_probs"] == r.rollout_log_probs and row["reward"] == r.reward
        assert json.loads(row["metadata_json"])["call_ids"] == r.metadata["call_ids"]


class AgentLoopMetrics(BaseModel):  # verl/experimental/agent_loop/agent_loop.py
    generate_sequences: float = 0.0
    tool_calls: float = 0.0


class AgentLoopOutput(BaseModel):  # verl/experimental/agent_loop/agent_loop.py (fields as in verl)
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    routed_experts: Any | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}


def test_verl_rows_validate_as_agent_loop_outputs(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = _jsonl(recorded, tmp_path)
    export(recorded, "verl", tmp_path / "v.parquet")
    for row, r in zip(pq.read_table(tmp_path / "v.parquet").to_pylist(), ref):
        out = AgentLoopOutput(**row)
        assert out.prompt_ids + out.response_ids == r.tokens
        assert out.response_mask == r.loss_mask and out.response_logprobs == r.rollout_log_probs
        assert out.reward_score == r.reward and out.num_turns == 2 * len(r.turns)
        assert out.extra_fields["session_id"] == r.session_id


def test_trl_datasets_and_labels_as_trl_builds_them(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import datasets

    ref = _jsonl(recorded, tmp_path)
    export(recorded, "trl", tmp_path / "trl.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "trl.parquet"), split="train")
    assert {"input_ids", "assistant_masks", "completion_mask"} <= set(ds.column_names)
    for ex, r in zip(ds, ref):
        # TRL's SFTTrainer: labels = input_ids where every applicable mask is 1, else -100
        labels = [t if m else -100 for t, m in zip(ex["input_ids"], ex["assistant_masks"])]
        assert ex["input_ids"] == r.tokens
        assert labels[r.prompt_length :] == [t if m else -100 for t, m in zip(r.response_ids, r.loss_mask)]
        assert set(labels[: r.prompt_length]) == {-100}
    export(recorded, "trl-grpo", tmp_path / "grpo.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "grpo.parquet"), split="train")
    for ex, r in zip(ds, ref):  # the keys a GRPOTrainer rollout_func returns
        assert ex["prompt_ids"] == r.prompt_ids and ex["completion_ids"] == r.response_ids
        assert ex["logprobs"] == r.rollout_log_probs and ex["env_mask"] == r.loss_mask


def test_openrlhf_rows_make_the_experience_openrlhf_builds(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = _jsonl(recorded, tmp_path)
    export(recorded, "openrlhf", tmp_path / "o.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    for row, r in zip(rows, ref):
        # as openrlhf/trainer/ppo_utils/samples_generator.py _process_response_into_experience
        seq = row["observation_tokens"]
        action_mask = [0] * len(seq)
        for a, b in row["action_ranges"]:
            action_mask[a:b] = [1] * (b - a)
        assert seq == r.tokens
        assert action_mask[1:] == ([0] * r.prompt_length + r.loss_mask)[1:]
        assert row["rollout_log_probs"][1:] == ([0.0] * r.prompt_length + r.rollout_log_probs)[1:]
        assert row["reward"] == r.reward and row["truncated"] is False


def test_sft_formats_flag_credited_assistant_turns(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = _jsonl(recorded, tmp_path)
    export(recorded, "slime-sft", tmp_path / "sft.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    for row, r in zip(rows, ref):
        assistants = [m for m in row["messages"] if m["role"] == "assistant"]
        assert len(assistants) == len(r.turns) and all(m["step_loss_mask"] == 1 for m in assistants)
        assert all(m["step_loss_mask"] == 0 for m in row["messages"] if m["role"] != "assistant")
        assert row["tools"] and row["messages"][-1]["content"].startswith("Done.")
    export(recorded, "slime-sft", tmp_path / "last.jsonl", credit="last-turn")
    rows = [json.loads(line) for line in (tmp_path / "last.jsonl").read_text().splitlines()]
    assert [m["step_loss_mask"] for m in rows[0]["messages"] if m["role"] == "assistant"] == [0] * (
        len(ref[0].turns) - 1
    ) + [1]
    export(recorded, "verl-sft", tmp_path / "vsft.parquet")
    t = pq.read_table(tmp_path / "vsft.parquet").to_pylist()
    assert len(t) == len(ref) and t[0]["messages"][-1]["loss"] == 1


def test_group_by_and_filters(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = _jsonl(recorded, tmp_path, group_by="task")
    groups = [r.group_index for r in rows]
    assert groups == sorted(groups) and len(set(groups)) == 3  # contiguous groups
    # rewards by task: t0 = [1, 1] all pass, t1 = [0, 0] all fail, t2 = [1, 0] mixed
    kept = _jsonl(recorded, tmp_path, group_by="task", pass_rate=(0.25, 0.75))
    assert sorted(r.session_id for r in kept) == ["sess-2", "sess-5"]
    assert [r.session_id for r in _jsonl(recorded, tmp_path, min_reward=0.5)] == [
        "sess-0",
        "sess-2",
        "sess-3",
    ]
    assert _jsonl(recorded, tmp_path, statuses=["failed"]) == []
    with pytest.raises(UsageError, match="needs --group-by"):
        _jsonl(recorded, tmp_path, pass_rate=(0.2, 0.8))


def test_errors_and_atomic_output(recorded, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ExportError, match="unknown format 'nope'; known formats: jsonl, openrlhf, parquet"):
        get("nope")
    with pytest.raises(ExportError, match="does not exist"):
        export(recorded, "jsonl", tmp_path / "missing" / "x.jsonl")

    class Boom(Exception):
        pass

    def failing():  # type: ignore[no-untyped-def]
        from orchard_rec.exporters.pipeline import select_samples
        from orchard_rec.storage import Store

        for k, s in enumerate(select_samples(Store(recorded))):
            if k == 3:
                raise Boom()
            yield s

    target = tmp_path / "never.parquet"
    with pytest.raises(Boom):
        get("parquet").write(failing(), target)
    assert not target.exists() and not list(tmp_path.glob(".never.parquet*"))


def test_missing_torch_names_the_install_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None\nfrom orchard_rec.exporters import get\ntry:\n    get('slime')\nexcept Exception as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert "pip install 'orchard-rec[train]'" in out


def test_jsonl_formats_need_neither_pyarrow_nor_torch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """jsonl, openrlhf and slime-sft import and write with pyarrow and torch unimportable."""
    import subprocess
    import sys

    code = f"""
import sys
sys.modules["pyarrow"] = None
sys.modules["torch"] = None
from pathlib import Path
from orchard_rec.exporters import get
from orchard_rec.reconstruct import SampleBuilder
b = SampleBuilder("s", [1, 2])
b.append_generation([3, 4], [-0.5, -0.25], "c1")
s = b.build()
s.messages = [{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": "yo"}}]
for fmt in ("jsonl", "openrlhf", "slime-sft"):
    stats = get(fmt).write([s], Path({str(tmp_path)!r}) / (fmt + ".jsonl"))
    print(fmt, stats.samples)
print(sorted(m for m in ("pyarrow", "torch") if sys.modules.get(m) is not None))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split("\n")[:4] == ["jsonl 1", "openrlhf 1", "slime-sft 1", "[]"], out.stderr
    row = json.loads((tmp_path / "openrlhf.jsonl").read_text())
    assert row["observation_tokens"] == [1, 2, 3, 4] and row["action_ranges"] == [[2, 4]]
