"""Teacher log-probs in every format, read back with each consumer's loader, equal the jsonl row;
a sample without teacher data carries none (never zeros pretending to be data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_rec.exporters import get, read_jsonl
from orchard_rec.reconstruct import Sample, TeacherData, Turn

pytestmark = pytest.mark.slow  # torch and pyarrow round trips, 7-27 s each on a loaded machine


def _samples() -> list[Sample]:
    with_teacher = Sample(
        session_id="s1",
        tokens=[1, 2, 3, 4, 5, 6],
        response_length=4,
        loss_mask=[1, 1, 0, 1],
        rollout_log_probs=[-0.5, -0.25, 0.0, -0.125],
        turns=[Turn("c1", 0, 2), Turn("c2", 3, 4)],
        reward=1.0,
        metadata={"call_ids": ["c1", "c2"]},
        teacher=TeacherData(
            [-0.75, -0.5, -2.0, 0.0],
            [1, 1, 1, 0],
            "teach-1",
            [[7, 8], [9, 10], [11, 12], []],
            [[-0.5, -1.5], [-0.25, -3.0], [-1.0, -2.5], []],
        ),
    )
    without = Sample(
        session_id="s2",
        tokens=[1, 2, 9],
        response_length=1,
        loss_mask=[1],
        rollout_log_probs=[-0.5],
        turns=[Turn("c3", 0, 1)],
        reward=0.0,
        index=1,
        metadata={"call_ids": ["c3"]},
    )
    return [with_teacher, without]


def test_jsonl_round_trip(tmp_path: Path) -> None:
    get("jsonl").write(_samples(), tmp_path / "a.jsonl")
    a, b = list(read_jsonl(tmp_path / "a.jsonl"))
    assert a.teacher == _samples()[0].teacher and b.teacher is None
    raw = (tmp_path / "a.jsonl").read_text().splitlines()
    assert '"teacher_log_probs"' in raw[0] and "teacher" not in raw[1]


@pytest.mark.parametrize("fmt", ["parquet", "verl"])
def test_parquet_and_verl(fmt: str, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    get(fmt).write(_samples(), tmp_path / "a.parquet")
    rows = pq.read_table(tmp_path / "a.parquet").to_pylist()
    t = _samples()[0].teacher
    assert t is not None
    assert rows[0]["teacher_log_probs"] == t.log_probs and rows[0]["teacher_valid_mask"] == t.valid_mask
    assert rows[0]["teacher_topk_ids"] == t.topk_ids and rows[0]["teacher"] == "teach-1"
    assert rows[0]["teacher_topk_logprobs"] == t.topk_logprobs
    assert rows[1]["teacher_log_probs"] is None and rows[1]["teacher_valid_mask"] is None


def test_trl_formats(tmp_path: Path) -> None:
    import datasets

    get("trl").write(_samples(), tmp_path / "t.parquet")
    get("trl-grpo").write(_samples(), tmp_path / "g.parquet")
    t = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    g = datasets.load_dataset("parquet", data_files=str(tmp_path / "g.parquet"), split="train")
    teacher = _samples()[0].teacher
    assert teacher is not None
    assert t[0]["teacher_logprobs"] == [0.0, 0.0, *teacher.log_probs]  # aligned to input_ids
    assert t[0]["teacher_mask"] == [0, 0, *teacher.valid_mask]
    assert g[0]["teacher_logprobs"] == teacher.log_probs  # aligned to completion_ids
    assert t[1]["teacher_logprobs"] is None and g[1]["teacher_mask"] is None


def test_slime_as_orchards_fork_loads_it(tmp_path: Path) -> None:
    import torch

    from orchard_rec.exporters.contracts import SlimeSample

    get("slime").write(_samples(), tmp_path / "r.pt")
    payload = torch.load(tmp_path / "r.pt", weights_only=False)
    a, b = (SlimeSample.from_dict(d) for d in payload["samples"])
    assert isinstance(a.teacher_log_probs, torch.Tensor) and a.teacher_log_probs.dtype == torch.float32
    assert a.teacher_log_probs.tolist() == [-0.75, -0.5, -2.0, 0.0]
    assert a.teacher_valid_mask == [1, 1, 1, 0]
    assert b.teacher_log_probs is None and b.teacher_valid_mask is None
