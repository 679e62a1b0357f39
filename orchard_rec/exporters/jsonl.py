"""``jsonl``: one sample per line, the reference format every other exporter is checked against.

Row: ``session_id, index, group_index, tokens, response_length, loss_mask`` (len =
response_length, over ``tokens[-response_length:]``), ``rollout_log_probs`` (same length,
0.0 where mask 0), ``reward, status, metadata`` (call ids, ``token_source``, mismatch
decisions, turn spans as ``[call_id, start, end]`` in response coordinates), and
``token_weights`` when the credit policy set them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from orchard_rec.exporters.base import ExportStats, atomic_output
from orchard_rec.reconstruct import Sample

__all__ = ["JsonlExporter", "read_jsonl", "write_jsonl_rows"]


def write_jsonl_rows(
    samples: Iterable[Sample], out: Path, row: Callable[[Sample], dict[str, Any]]
) -> ExportStats:
    """One JSON object per sample and line, streamed, written atomically."""
    stats = ExportStats(files=[Path(out)])
    with atomic_output(Path(out)) as f:
        for s in samples:
            f.write(orjson.dumps(row(s)))
            f.write(b"\n")
            stats.add(s)
    return stats


class JsonlExporter:
    name = "jsonl"
    includes_auxiliary = True
    """Side-conversation samples are kept (flagged ``metadata.auxiliary``) unless ``--no-auxiliary``."""

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_jsonl_rows(samples, out, Sample.to_dict)


def read_jsonl(path: Path) -> Iterator[Sample]:
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield Sample.from_dict(orjson.loads(line))
