"""``trl`` and ``trl-grpo``: datasets TRL's trainers take as they are (TRL 1.16 on the index).

``trl``: pre-tokenized SFT rows. TRL's ``SFTTrainer`` treats a dataset with an
``input_ids`` column as processed and builds ``labels`` from ``assistant_masks`` (always
applied) and ``completion_mask`` (with ``completion_only_loss``) — trl/trainer/sft_trainer.py
``_prepare_dataset``. ``assistant_masks`` is 0 on the prompt and the loss mask on the
response; ``completion_mask`` is 0 on the prompt and 1 on the whole response.

``trl-grpo``: the dict a ``GRPOTrainer`` ``rollout_func`` returns, one row per sample:
``prompt_ids``, ``completion_ids`` (the response, observations included), ``logprobs``
(per completion token) and ``env_mask`` (1 model tokens, 0 environment tokens), the
extra field GRPO reads as its tool mask (trl/trainer/grpo_trainer.py).

Both carry ``teacher_logprobs`` + ``teacher_mask`` (GKD-style distillation) when
``orchard-rec teacher`` scored the sample (null otherwise): aligned to ``input_ids`` for
``trl``, to ``completion_ids`` for ``trl-grpo``.
Both carry ``policy_versions``: the policy version that sampled each generated token (null on
the prompt and observations), for off-policy correction; null when no version was recorded.
Both load with ``datasets.load_dataset("parquet", data_files=...)``.

Images: an ``images`` column (``datasets`` ``List(Image())``, PIL images once loaded; present
when the export has images), the column TRL's vision trainers read (``SFTTrainer`` /
``DataCollatorForVisionLanguageModeling``, ``GRPOTrainer``'s prompt images). TRL has no
pre-tokenized vision path: with an ``images`` column its ``SFTTrainer`` renders ``messages`` /
``prompt`` itself with the processor and drops ``input_ids``, and GRPO recomputes
``pixel_values`` from the dataset's ``images``. So with a VLM, keep these rows' exact ids and
hand ``images`` to the model's image processor in your collator (its ``image_grid_thw`` matches
the image runs in ``input_ids``: t·h·w/4 tokens per image for Qwen2-VL), or let TRL re-render
(it then re-tokenizes, losing the recorded ids).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from orchard_rec.exporters.base import ExportStats
from orchard_rec.exporters.columnar import write_parquet
from orchard_rec.exporters.teacher_columns import TRL_TEACHER_FIELDS, trl_teacher_columns
from orchard_rec.reconstruct import Sample, numeric_reward

__all__ = ["TrlExporter", "TrlGrpoExporter"]

TRL_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("assistant_masks", pa.list_(pa.int8())),
        ("completion_mask", pa.list_(pa.int8())),
        ("reward", pa.float64()),
        ("session_id", pa.string()),
        ("index", pa.int64()),
        *TRL_TEACHER_FIELDS,
        ("policy_versions", pa.list_(pa.string())),
    ]
)

GRPO_SCHEMA = pa.schema(
    [
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float64())),
        ("env_mask", pa.list_(pa.int8())),
        ("reward", pa.float64()),
        ("group_index", pa.int64()),
        ("session_id", pa.string()),
        ("index", pa.int64()),
        *TRL_TEACHER_FIELDS,
        ("policy_versions", pa.list_(pa.string())),
    ]
)


def _sft_row(s: Sample) -> dict[str, Any]:
    p = s.prompt_length
    return {
        "input_ids": s.tokens,
        "assistant_masks": [0] * p + s.loss_mask,
        "completion_mask": [0] * p + [1] * s.response_length,
        "reward": numeric_reward(s.reward),
        "session_id": s.session_id,
        "index": s.index,
        **trl_teacher_columns(s, full=True),
        "policy_versions": _versions(s, full=True),
    }


def _grpo_row(s: Sample) -> dict[str, Any]:
    generated = [0] * s.response_length
    for t in s.turns:
        for i in range(t.start, t.end):
            generated[i] = 1
    return {
        "prompt_ids": s.prompt_ids,
        "completion_ids": s.response_ids,
        "logprobs": s.rollout_log_probs,
        "env_mask": [g & m for g, m in zip(generated, s.loss_mask)],
        "reward": numeric_reward(s.reward),
        "group_index": s.group_index,
        "session_id": s.session_id,
        "index": s.index,
        **trl_teacher_columns(s, full=False),
        "policy_versions": _versions(s, full=False),
    }


def _versions(s: Sample, *, full: bool) -> list[str | None] | None:
    """The version of each generated token (None elsewhere), aligned to ``input_ids`` (``full``)
    or ``completion_ids``; None when the sample has no versions."""
    per = s.versions_per_token()
    if per is None:
        return None
    head: list[str | None] = [None] * s.prompt_length if full else []
    return head + per


class TrlExporter:
    name = "trl"

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_parquet(samples, out, TRL_SCHEMA, _sft_row, images=True)


class TrlGrpoExporter:
    name = "trl-grpo"

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_parquet(samples, out, GRPO_SCHEMA, _grpo_row, images=True)
