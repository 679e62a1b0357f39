"""``jsonl``: one sample per line, the reference format every other exporter is checked against.

Row: ``session_id, index, group_index, tokens, response_length, loss_mask`` (len =
response_length, over ``tokens[-response_length:]``), ``rollout_log_probs`` (same length,
0.0 where mask 0), ``reward, status, metadata`` (call ids, ``token_source``, mismatch
decisions, turn spans as ``[call_id, start, end]`` in response coordinates), and
``token_weights`` when the credit policy set them, and ``policy_versions`` when versions were
recorded: ``[[version, start, end], ...]`` spans over the generated positions in response
coordinates (``unknown`` where an update could not be placed; observations have none), and
``routed_experts`` (MoE routing replay): ``{"dtype", "shape": [len(tokens) - 1, layers, top-k],
"data": base64 of the little-endian ids}``.

Images: a sample that shows images has ``images``, its image references in order
(``digest`` = SHA-256 of the bytes, ``mime``, ``width``, ``height``; ``url`` for a remote image),
each with ``path``: the image file relative to the jsonl's folder, in the sidecar folder
``<out>.images/`` (``samples.jsonl`` -> ``samples.jsonl.images/<digest>.png``), one file per
distinct image, written once. ``metadata.image_spans`` (when the image token was known) gives
each image's ``[start, end)`` run in ``tokens``. Written to stdout (``-``) there is no folder:
rows keep the references without ``path`` (a warning says so).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from orchard_rec.exporters.base import ExportStats, atomic_output
from orchard_rec.exporters.images import ImageSidecar, sidecar_folder
from orchard_rec.reconstruct import Sample

__all__ = ["JsonlExporter", "read_jsonl", "write_jsonl_rows"]

log = logging.getLogger(__name__)


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
        out = Path(out)
        if str(out) == "-" or (out.exists() and not out.is_file()):
            warned: list[bool] = []

            def row(s: Sample) -> dict[str, Any]:
                if s.images and not warned:
                    warned.append(True)
                    log.warning("jsonl to %s: images are written as references only (no sidecar folder)", out)
                return s.to_dict()

            return write_jsonl_rows(samples, out, row)
        resolved = out.resolve()
        sidecar = ImageSidecar(sidecar_folder(resolved), resolved.parent)

        def with_paths(s: Sample) -> dict[str, Any]:
            d = s.to_dict()
            for ref, entry in zip(s.images, d.get("images") or ()):
                path = sidecar.path_of(ref)
                if path is not None:
                    entry["path"] = path
            return d

        stats = write_jsonl_rows(samples, out, with_paths)
        if sidecar.used:
            stats.files.append(sidecar_folder(out))
        return stats


def read_jsonl(path: Path, *, images: bool = True) -> Iterator[Sample]:
    """The samples of a jsonl export, streamed; ``images``: each image ref with a ``path`` gets its
    bytes from the sidecar file (``ImageRef.data``), so the samples export again with their images."""
    base = Path(path).resolve().parent
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                row = orjson.loads(line)
                s = Sample.from_dict(row)
                if images and s.images:
                    s.images = [
                        dataclasses.replace(ref, data=(base / entry["path"]).read_bytes())
                        if entry.get("path") and (base / entry["path"]).is_file()
                        else ref
                        for ref, entry in zip(s.images, row["images"])
                    ]
                yield s
