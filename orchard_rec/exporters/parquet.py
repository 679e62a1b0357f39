"""``parquet``: the generic columnar export, one row per sample.

Schema (zstd, row groups of 512 samples):

| column | type | meaning |
|---|---|---|
| session_id | string | |
| index | int64 | running sample index of the export |
| group_index | int64, null | group (``--group-by``) |
| tokens | list<int32> | prompt + response ids |
| response_length | int32 | |
| loss_mask | list<int8> | over ``tokens[-response_length:]`` |
| rollout_log_probs | list<float64> | same length, 0.0 where mask 0 |
| token_weights | list<float64>, null | credit weights when the policy sets them |
| reward | float64, null | numeric reward |
| reward_json | string, null | the reward as JSON (named rewards) |
| status | string | completed, truncated, aborted, failed |
| metadata_json | string | metadata as in the jsonl export |
| teacher_log_probs | list<float32>, null | teacher log-prob per response token (``orchard-rec teacher``) |
| teacher_valid_mask | list<int8>, null | 1 where the teacher scored the token |
| teacher_topk_ids / teacher_topk_logprobs | list<list<...>>, null | the teacher's top-k per response token |
| teacher | string, null | the teacher's model name |
| policy_versions | list<string>, null | the policy version that sampled each response token (null on observations; ``unknown`` where an update could not be placed); null when no version was recorded |
| routed_experts | binary, null | MoE routing replay (``--routed-experts``): ``.npy`` bytes, shape (len(tokens) - 1, layers, top-k), uint8/uint16 (``np.load(io.BytesIO(b))``) |
| images | list<struct<bytes, path>> | only when the export has images: the sample's images in order, a ``datasets`` ``List(Image())`` feature (``columnar``); ``load_dataset`` gives PIL images |
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from orchard_rec import routing
from orchard_rec.exporters.base import ExportStats
from orchard_rec.exporters.columnar import write_parquet
from orchard_rec.exporters.teacher_columns import TEACHER_FIELDS, teacher_columns
from orchard_rec.reconstruct import Sample, numeric_reward

__all__ = ["SCHEMA", "ParquetExporter"]

SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("index", pa.int64()),
        ("group_index", pa.int64()),
        ("tokens", pa.list_(pa.int32())),
        ("response_length", pa.int32()),
        ("loss_mask", pa.list_(pa.int8())),
        ("rollout_log_probs", pa.list_(pa.float64())),
        ("token_weights", pa.list_(pa.float64())),
        ("reward", pa.float64()),
        ("reward_json", pa.string()),
        ("status", pa.string()),
        ("metadata_json", pa.string()),
        *TEACHER_FIELDS,
        ("policy_versions", pa.list_(pa.string())),
        ("routed_experts", pa.binary()),
    ]
)


def _row(s: Sample) -> dict[str, Any]:
    d = s.to_dict()
    return {
        "session_id": s.session_id,
        "index": s.index,
        "group_index": s.group_index,
        "tokens": s.tokens,
        "response_length": s.response_length,
        "loss_mask": s.loss_mask,
        "rollout_log_probs": s.rollout_log_probs,
        "token_weights": s.token_weights,
        "reward": numeric_reward(s.reward),
        "reward_json": None if s.reward is None else orjson.dumps(s.reward).decode(),
        "status": str(s.status),
        "metadata_json": orjson.dumps(d["metadata"]).decode(),
        **teacher_columns(s),
        "policy_versions": s.versions_per_token(),
        "routed_experts": None
        if s.routed_experts is None
        else routing.to_npy(routing.unpack(s.routed_experts)),
    }


class ParquetExporter:
    name = "parquet"
    includes_auxiliary = True
    """Side-conversation samples are kept (flagged ``metadata.auxiliary``) unless ``--no-auxiliary``."""

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_parquet(samples, out, SCHEMA, _row, images=True)
