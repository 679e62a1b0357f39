"""``verl`` and ``verl-sft``.

``verl``: parquet rows of verl's ``AgentLoopOutput`` fields, built by
``contracts.agent_loop_fields`` (the contract and its source are described there).
``AgentLoopOutput(**row)`` validates each row (pinned by a test).

``verl-sft``: parquet rows ``messages`` + ``tools`` (JSON text) for verl's multi-turn SFT
dataset, assistant messages flagged with ``loss`` by the credit policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from orchard_rec.errors import ExportError
from orchard_rec.exporters.base import ExportStats
from orchard_rec.exporters.columnar import write_parquet
from orchard_rec.exporters.contracts import agent_loop_fields
from orchard_rec.exporters.conversation import turn_flagged_messages
from orchard_rec.exporters.teacher_columns import TEACHER_FIELDS, teacher_columns
from orchard_rec.reconstruct import Sample, numeric_reward

__all__ = ["VERL_SCHEMA", "VerlExporter", "VerlSftExporter"]

VERL_SCHEMA = pa.schema(
    [
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float64())),
        ("reward_score", pa.float64()),
        ("num_turns", pa.int32()),
        ("metrics", pa.struct([("generate_sequences", pa.float64()), ("tool_calls", pa.float64())])),
        (
            "extra_fields",
            pa.struct(
                [
                    ("session_id", pa.string()),
                    ("index", pa.int64()),
                    ("group_index", pa.int64()),
                    ("status", pa.string()),
                    ("call_ids", pa.list_(pa.string())),
                    ("token_source", pa.string()),
                    ("reward_json", pa.string()),
                ]
            ),
        ),
        *TEACHER_FIELDS,
    ]
)


def _verl_row(s: Sample) -> dict[str, Any]:
    return {**agent_loop_fields(s), **teacher_columns(s)}


class VerlExporter:
    name = "verl"

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_parquet(samples, out, VERL_SCHEMA, _verl_row)


VERL_SFT_SCHEMA = pa.schema(
    [
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("session_id", pa.string()),
        ("index", pa.int64()),
        ("reward", pa.float64()),
    ]
)


def _sft_row(s: Sample) -> dict[str, Any]:
    if s.messages is None:
        raise ExportError(f"sample {s.index} of session {s.session_id} has no messages to export")
    return {
        "messages": orjson.dumps(turn_flagged_messages(s, "loss")).decode(),
        "tools": orjson.dumps(s.tools or []).decode(),
        "session_id": s.session_id,
        "index": s.index,
        "reward": numeric_reward(s.reward),
    }


class VerlSftExporter:
    name = "verl-sft"
    needs_messages = True

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_parquet(samples, out, VERL_SFT_SCHEMA, _sft_row)
