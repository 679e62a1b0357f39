"""``value``: a value-model / verifier dataset, one row per assistant-turn boundary.

For every sample, one row per generation turn: the token prefix up to the end of that
turn (the prompt, every earlier turn and observation, and the turn itself), where the
turn starts inside it, the turn's index, and the session's final reward and status —
the (state, return) pairs a value model or a reranking verifier trains on.

Schema (zstd parquet, ``datasets.load_dataset("parquet", data_files=...)`` reads it):

| column | type | meaning |
|---|---|---|
| session_id | string | |
| sample_index | int64 | the sample's ``index`` in the jsonl export |
| group_index | int64, null | group (``--group-by``) |
| turn | int32 | 0-based generation turn within the sample |
| prefix_ids | list<int32> | ``tokens[:turn_end]`` |
| turn_start | int32 | where the turn's generated ids start in ``prefix_ids`` |
| is_last | bool | the sample's last turn |
| reward | float64, null | the session's numeric reward |
| reward_json | string, null | the reward as JSON (named rewards) |
| status | string | completed, truncated, aborted, failed |
| value | float64, null | the stored value after this turn's step (the outcome's ``step_values``, e.g. ``orchard-rec reward``'s running process reward), when stored |

Images are not carried (a prefix's image runs stay in ``prefix_ids``; a warning says so):
export ``parquet`` alongside for the pixels.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from orchard_rec.exporters.base import ExportStats, atomic_output
from orchard_rec.exporters.columnar import signed
from orchard_rec.exporters.images import warn_images_dropped
from orchard_rec.reconstruct import Sample, numeric_reward

__all__ = ["SCHEMA", "ValueExporter", "value_rows"]

SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("sample_index", pa.int64()),
        ("group_index", pa.int64()),
        ("turn", pa.int32()),
        ("prefix_ids", pa.list_(pa.int32())),
        ("turn_start", pa.int32()),
        ("is_last", pa.bool_()),
        ("reward", pa.float64()),
        ("reward_json", pa.string()),
        ("status", pa.string()),
        ("value", pa.float64()),
    ]
)


def value_rows(s: Sample) -> list[dict[str, Any]]:
    """The rows of one sample, in turn order."""
    base = s.prompt_length
    reward_json = None if s.reward is None else orjson.dumps(s.reward).decode()
    values = s.outcome.step_values if s.outcome is not None else None
    steps = s.metadata.get("turn_steps") or list(range(len(s.turns)))
    rows = []
    for k, turn in enumerate(s.turns):
        rows.append(
            {
                "session_id": s.session_id,
                "sample_index": s.index,
                "group_index": s.group_index,
                "turn": k,
                "prefix_ids": s.tokens[: base + turn.end],
                "turn_start": base + turn.start,
                "is_last": k == len(s.turns) - 1,
                "reward": numeric_reward(s.reward),
                "reward_json": reward_json,
                "status": str(s.status),
                "value": float(values[steps[k]]) if values is not None and steps[k] < len(values) else None,
            }
        )
    return rows


class ValueExporter:
    name = "value"

    def __init__(self, batch_tokens: int = 4_000_000) -> None:
        self.batch_tokens = batch_tokens
        """Flush a row group once this many prefix ids are buffered (memory is bounded in ids)."""

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        stats = ExportStats(files=[Path(out)])
        with atomic_output(Path(out)) as f:
            schema = signed(SCHEMA)
            writer = pq.ParquetWriter(f, schema, compression="zstd")
            rows: list[dict[str, Any]] = []
            held = 0
            warned: list[bool] = []
            try:
                for s in samples:
                    stats.add(s)
                    warn_images_dropped(self.name, s, warned)
                    for row in value_rows(s):
                        rows.append(row)
                        held += len(row["prefix_ids"])
                        if held >= self.batch_tokens:
                            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                            rows, held = [], 0
                if rows or stats.samples == 0:
                    writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            finally:
                writer.close()
        return stats
