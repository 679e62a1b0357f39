"""Teacher columns for the columnar formats (``orchard-rec teacher`` results).

A sample without teacher data gets nulls, never zeros pretending to be data.
``response`` alignment (parquet, verl, trl-grpo): ``len = response_length``; ``full``
alignment (trl's pre-tokenized SFT rows): ``len = len(input_ids)``, the prompt positions
0.0 / mask 0.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from orchard_rec.reconstruct import Sample

__all__ = ["TEACHER_FIELDS", "TRL_TEACHER_FIELDS", "teacher_columns", "trl_teacher_columns"]

TEACHER_FIELDS = [
    ("teacher_log_probs", pa.list_(pa.float32())),
    ("teacher_valid_mask", pa.list_(pa.int8())),
    ("teacher_topk_ids", pa.list_(pa.list_(pa.int32()))),
    ("teacher_topk_logprobs", pa.list_(pa.list_(pa.float32()))),
    ("teacher", pa.string()),
]
TRL_TEACHER_FIELDS = [
    ("teacher_logprobs", pa.list_(pa.float32())),
    ("teacher_mask", pa.list_(pa.int8())),
]


def teacher_columns(s: Sample) -> dict[str, Any]:
    t = s.teacher
    if t is None:
        return {name: None for name, _ in TEACHER_FIELDS}
    return {
        "teacher_log_probs": t.log_probs,
        "teacher_valid_mask": t.valid_mask,
        "teacher_topk_ids": t.topk_ids,
        "teacher_topk_logprobs": t.topk_logprobs,
        "teacher": t.name,
    }


def trl_teacher_columns(s: Sample, *, full: bool) -> dict[str, Any]:
    """TRL's ``teacher_logprobs`` (GKD-style) and its mask; ``full`` aligns them to ``input_ids``."""
    t = s.teacher
    if t is None:
        return {"teacher_logprobs": None, "teacher_mask": None}
    pad = s.prompt_length if full else 0
    return {
        "teacher_logprobs": [0.0] * pad + list(t.log_probs),
        "teacher_mask": [0] * pad + list(t.valid_mask),
    }
