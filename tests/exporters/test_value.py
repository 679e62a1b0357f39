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
