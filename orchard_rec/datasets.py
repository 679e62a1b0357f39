"""Reading a dataset ``export --out URL`` wrote (``orchard_rec.exporters.dataset``), from any
filesystem fsspec knows: its newest manifest decides which files are the dataset.

>>> ds = open_dataset("s3://bucket/prefix/", storage_options={"endpoint_url": "http://..."})
>>> ds.rows, ds.manifest["selection"]
>>> table = ds.table()                      # pyarrow, with the run / policy_version / date columns
>>> for s in ds.samples(): ...              # orchard_rec Samples, images with their bytes
>>> torch_ds = ds.torch()                   # the trainers' tensors (the ``train`` extra)

Files a failed or running export left behind are in no manifest, so they are never read here
(glob readers such as DuckDB's ``**/*.parquet`` see whatever parquet files are there).
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from orchard_rec.dialects.images import ImageRef
from orchard_rec.errors import UsageError
from orchard_rec.exporters.dataset import NULL_PARTITION, latest_manifest, open_fs
from orchard_rec.reconstruct import Sample, SampleStatus, TeacherData, Turn

__all__ = ["OrchardDataset", "open_dataset", "sample_of_row"]


def open_dataset(url: str, storage_options: dict[str, Any] | None = None) -> OrchardDataset:
    """The dataset at ``url`` as its newest manifest lists it (UsageError: no dataset there)."""
    fs, root = open_fs(url, storage_options)
    found = latest_manifest(fs, root)
    if found is None:
        raise UsageError(f"{url} holds no orchard-rec dataset (no committed manifest under _manifests/)")
    return OrchardDataset(fs, root, found[1])


def _partition_values(rel: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for part in rel.split("/")[:-1]:
        k, sep, v = part.partition("=")
        if sep:
            out[k] = None if v == NULL_PARTITION else v
    return out


def sample_of_row(row: dict[str, Any], images: list[ImageRef] | None = None) -> Sample:
    """A part file's row (the ``parquet`` format's columns) as the ``Sample`` it was written from."""
    meta = orjson.loads(row["metadata_json"]) if row.get("metadata_json") else {}
    turns = [Turn(c, s, e) for c, s, e in meta.pop("turns", [])]
    return Sample(
        session_id=row["session_id"],
        tokens=list(row["tokens"]),
        response_length=row["response_length"],
        loss_mask=list(row["loss_mask"]),
        rollout_log_probs=list(row["rollout_log_probs"]),
        turns=turns,
        status=SampleStatus(row["status"]),
        reward=None if row.get("reward_json") is None else orjson.loads(row["reward_json"]),
        index=row["index"],
        group_index=row["group_index"],
        token_weights=None if row.get("token_weights") is None else list(row["token_weights"]),
        metadata=meta,
        teacher=TeacherData.from_dict(row),
        images=images or [],
    )


class OrchardDataset:
    def __init__(self, fs: Any, root: str, manifest: dict[str, Any]) -> None:
        self.fs, self.root, self.manifest = fs, root, manifest

    @property
    def rows(self) -> int:
        return int(self.manifest["rows"])

    def files(self) -> list[str]:
        """The part files' full paths on the filesystem (``self.fs``)."""
        return [posixpath.join(self.root, f["path"]) for f in self.manifest["files"]]

    def iter_tables(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """One table per part file, with the partition columns; memory: one file at a time."""
        for f in self.manifest["files"]:
            with self.fs.open(posixpath.join(self.root, f["path"]), "rb") as fh:
                t = pq.read_table(fh, columns=columns)
            for k, v in _partition_values(f["path"]).items():
                t = t.append_column(k, pa.array([v] * t.num_rows, pa.string()))
            yield t

    def table(self, columns: list[str] | None = None) -> pa.Table:
        tables = list(self.iter_tables(columns))
        return pa.concat_tables(tables) if tables else pa.table({})

    def image_bytes(self, path: str) -> bytes:
        with self.fs.open(posixpath.join(self.root, path), "rb") as f:
            data: bytes = f.read()
        return data

    def samples(self, *, images: bool = True) -> Iterator[Sample]:
        """The samples, file by file; ``images``: each image ref gets its bytes from ``_images/``."""
        for t in self.iter_tables():
            for b in t.to_batches(max_chunksize=256):
                for row in b.to_pylist():
                    refs = []
                    for cell in row.get("images") or ():
                        ref = ImageRef.from_dict(cell)
                        if images and cell.get("path"):
                            ref = dataclasses.replace(ref, data=self.image_bytes(cell["path"]))
                        refs.append(ref)
                    yield sample_of_row(row, refs)

    def torch(self, advantage_fn: Any = None) -> Any:
        """A torch ``IterableDataset`` of the trainers' tensors (``trainers.dataset.sample_tensors``)."""
        from torch.utils.data import IterableDataset, get_worker_info

        from orchard_rec.trainers.dataset import sample_tensors

        outer = self

        class _Tensors(IterableDataset):
            def __iter__(self) -> Iterator[Any]:
                info = get_worker_info()
                for k, s in enumerate(outer.samples(images=False)):
                    if info is None or k % info.num_workers == info.id:
                        yield sample_tensors(s, advantage_fn)

        return _Tensors()
