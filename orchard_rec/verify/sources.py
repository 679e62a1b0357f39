"""Where ``verify`` reads samples: an export file (jsonl, parquet, slime ``.pt``) or the database.

Each yields ``SampleView``s in the file's (or the export's) order. The files keep what the check
needs: tokens, ``response_length``, ``loss_mask``, ``rollout_log_probs`` and the metadata with
``turns``, ``realigned`` and ``branch``; images come with them (jsonl: the sidecar files;
parquet: the ``images`` column; slime: ``multimodal_inputs["images"]``, PIL images).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import orjson

from orchard_rec.errors import UsageError
from orchard_rec.verify.compare import SampleView, sample_view

if TYPE_CHECKING:
    from orchard_rec.pipeline import Selection

__all__ = ["FILE_KINDS", "read_export", "samples_from_db"]

FILE_KINDS = (".jsonl", ".parquet", ".pt")


def read_export(path: Path) -> Iterator[SampleView]:
    """The samples of an export file, by its suffix."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no export file at {path}")
    if path.suffix == ".jsonl":
        from orchard_rec.exporters.jsonl import read_jsonl

        for s in read_jsonl(path):
            yield sample_view(s)
    elif path.suffix == ".parquet":
        yield from _parquet(path)
    elif path.suffix == ".pt":
        yield from _slime(path)
    else:
        raise UsageError(
            f"cannot read {path.name}: verify reads {', '.join(FILE_KINDS)} exports "
            "(export with --format jsonl, parquet or slime), or the database (no --input)"
        )


def _parquet(path: Path) -> Iterator[SampleView]:
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    missing = {"tokens", "response_length", "loss_mask", "rollout_log_probs"} - set(f.schema_arrow.names)
    if missing:
        raise UsageError(
            f"{path.name} has no {', '.join(sorted(missing))} column: not an orchard-rec parquet export"
        )
    for batch in f.iter_batches(batch_size=64):
        for row in batch.to_pylist():
            meta = orjson.loads(row.get("metadata_json") or "{}")
            images = [SimpleNamespace(data=im["bytes"]) for im in row.get("images") or () if im]
            yield sample_view({**row, "metadata": meta, "images": images})


def _slime(path: Path) -> Iterator[SampleView]:
    try:
        import torch
    except ImportError as exc:
        raise UsageError("reading a slime .pt export needs torch: pip install 'orchard-rec[train]'") from exc
    payload = torch.load(path, weights_only=False)  # slime's own loader does the same (pickled dicts)
    rows = payload.get("samples") if isinstance(payload, dict) else None
    if rows is None:
        raise UsageError(f"{path.name} holds no 'samples': not a slime rollout file")
    for row in rows:
        yield sample_view(row if isinstance(row, dict) else row.to_dict())


def samples_from_db(store: Any, selection: Selection | None = None, **options: Any) -> Iterator[SampleView]:
    """The samples reconstruction gives from the database (``pipeline.iter_samples`` with
    ``selection`` and ``options``), their images filled from the store."""
    from orchard_rec.exporters.pipeline import fill_images, select_samples

    for s in fill_images(store, select_samples(store, selection, **options)):
        yield sample_view(s)
