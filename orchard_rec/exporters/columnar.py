"""Streaming parquet output shared by the columnar formats (pyarrow, the ``parquet`` extra).

Rows are buffered ``batch`` at a time and written as row groups, zstd-compressed, into a
temp file that replaces the target only when the last row group is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchard_rec.exporters.base import ExportStats, atomic_output
from orchard_rec.reconstruct import Sample

__all__ = ["write_parquet"]


def write_parquet(
    samples: Iterable[Sample],
    out: Path,
    schema: pa.Schema,
    row: Callable[[Sample], dict[str, Any]],
    *,
    batch: int = 512,
) -> ExportStats:
    stats = ExportStats(files=[Path(out)])
    with atomic_output(Path(out)) as f:
        writer = pq.ParquetWriter(f, schema, compression="zstd")
        rows: list[dict[str, Any]] = []
        try:
            for s in samples:
                rows.append(row(s))
                stats.add(s)
                if len(rows) >= batch:
                    writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                    rows = []
            if rows or stats.samples == 0:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
        finally:
            writer.close()
    return stats
