"""``value``: one row per assistant-turn boundary, read back with Hugging Face ``datasets``."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_rec.exporters import read_jsonl
from orchard_rec.exporters.pipeline import export

pytestmark = (
    pytest.mark.slow
)  # the session-scoped recorded_db fixture records sessions through a real proxy (~70 s on a loaded machine)


def test_value_rows_are_the_turn_prefixes_of_the_jsonl_samples(recorded_db: str, tmp_path: Path) -> None:
    import datasets

    export(recorded_db, "jsonl", tmp_path / "ref.jsonl", group_by="task")
    ref = list(read_jsonl(tmp_path / "ref.jsonl"))
    export(recorded_db, "value", tmp_path / "v.parquet", group_by="task")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "v.parquet"), split="train")
    rows = list(ds)
    expected = []
    for s in ref:
        base = len(s.tokens) - s.response_length
        for k, t in enumerate(s.turns):
            expected.append(
                {
                    "session_id": s.session_id,
                    "sample_index": s.index,
                    "group_index": s.group_index,
                    "turn": k,
                    "prefix_ids": s.tokens[: base + t.end],
                    "turn_start": base + t.start,
                    "is_last": k == len(s.turns) - 1,
                    "reward": s.reward,
                    "status": s.status,
                }
            )
    assert len(rows) == len(expected) > len(ref)  # multi-turn sessions give several rows each
    for got, want in zip(rows, expected):
        assert {k: got[k] for k in want} == want
    for s in ref:  # each turn's own ids are generated ones: the jsonl mask is 1 on them
        for t in s.turns:
            assert all(s.loss_mask[i] == 1 for i in range(t.start, t.end))


def test_value_rows_carry_the_stored_step_values() -> None:
    """Issue 41: a stored per-step value (``Outcome.step_values``) goes with its turn's row."""
    from orchard_rec.exporters.value import value_rows
    from orchard_rec.reconstruct import Sample, Turn
    from orchard_rec.records import Outcome

    s = Sample("s", [1, 2, 3, 4, 5], 3, [1, 0, 1], [0.0] * 3, [Turn("a", 0, 1), Turn("b", 2, 3)])
    s.metadata["turn_steps"] = [1, 2]  # a split sample: its turns are the session's steps 1 and 2
    assert [r["value"] for r in value_rows(s)] == [None, None]
    s.outcome = Outcome(step_values=(0.5, 1.5, -2.0))
    assert [r["value"] for r in value_rows(s)] == [1.5, -2.0]
