"""Streaming parquet output shared by the columnar formats (pyarrow, the ``parquet`` extra).

Rows are buffered ``batch`` at a time (fewer when their images pass ``IMAGE_BATCH_BYTES``) and
written as row groups, zstd-compressed, into a temp file that replaces the target only when the
last row group is written.

Images (``images=``): a format that carries them gets an ``images`` column,
``list<struct<bytes: binary, path: string>>`` (``IMAGES_FIELD``), the storage of a Hugging Face
``datasets`` ``List(Image())`` feature, declared in the file's ``huggingface`` schema metadata
so ``datasets.load_dataset("parquet", data_files=...)`` gives ``PIL.Image`` lists (the metadata
describes every column, in the list notation both old and new ``datasets`` read). The column
is present only when the export holds a sample with images: a text-only export keeps the
format's text schema (TRL, say, treats any dataset with an ``images`` column as a
vision-language one). Rows are written without it until the first sample with images; the
part already written is then rewritten once with an empty ``images`` cell per row. Written
to stdout or a device (no rewrite possible), the column is always present.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from orchard_rec import __version__
from orchard_rec.exporters.base import ExportStats, atomic_output
from orchard_rec.exporters.images import hf_image_cells
from orchard_rec.outputs import PARQUET_SIGNATURE
from orchard_rec.reconstruct import Sample

__all__ = ["IMAGES_FIELD", "IMAGE_BATCH_BYTES", "hf_features", "signed", "with_images", "write_parquet"]

IMAGES_FIELD = pa.field("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())])))
"""A ``datasets`` ``List(Image())`` column: each image's bytes and a name (or a remote URL)."""

IMAGE_BATCH_BYTES = 16 << 20
"""A row group is written early once the buffered rows' images pass this many bytes."""

_HF_DTYPES = {"double": "float64", "float": "float32", "halffloat": "float16"}


def _hf_feature(t: pa.DataType) -> Any:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_hf_feature(t.value_type)]
    if pa.types.is_struct(t):
        return {t.field(i).name: _hf_feature(t.field(i).type) for i in range(t.num_fields)}
    name = str(t)
    return {"dtype": _HF_DTYPES.get(name, name), "_type": "Value"}


def hf_features(schema: pa.Schema, image_columns: Iterable[str] = ("images",)) -> bytes:
    """The ``huggingface`` schema metadata: every column's feature, ``image_columns`` as image lists."""
    images = set(image_columns)
    features = {f.name: [{"_type": "Image"}] if f.name in images else _hf_feature(f.type) for f in schema}
    return orjson.dumps({"info": {"features": features}})


def with_images(schema: pa.Schema) -> pa.Schema:
    """``schema`` plus the ``images`` column and the metadata that makes it a ``datasets`` feature."""
    full = schema.append(IMAGES_FIELD)
    return full.with_metadata({b"huggingface": hf_features(full)})


def signed(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the ``orchard_rec`` footer key that marks the file as our output
    (``orchard_rec.outputs``: only our own earlier output is replaced without ``--force``)."""
    return schema.with_metadata({**(schema.metadata or {}), PARQUET_SIGNATURE: __version__.encode()})


class _Sink:
    """A ParquetWriter on ``f`` that can gain the ``images`` column after rows were written."""

    def __init__(self, f: IO[bytes], schema: pa.Schema, *, images: bool, rewritable: bool) -> None:
        self.f = f
        self.text_schema = schema
        self.images = images and not rewritable  # unknown yet when the file can be rewritten
        self.can_add = images and rewritable
        self.writer: pq.ParquetWriter | None = None

    @property
    def schema(self) -> pa.Schema:
        return signed(with_images(self.text_schema) if self.images else self.text_schema)

    def write(self, rows: list[dict[str, Any]]) -> None:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.f, self.schema, compression="zstd")
        self.writer.write_table(pa.Table.from_pylist(rows, schema=self.schema))

    def need_images(self) -> None:
        if self.images or not self.can_add:
            return
        self.images = True
        if self.writer is None:
            return
        self.writer.close()
        self.writer = None
        with tempfile.TemporaryFile() as scratch:
            self.f.seek(0)
            shutil.copyfileobj(self.f, scratch)
            self.f.seek(0)
            self.f.truncate()
            scratch.seek(0)
            self.writer = pq.ParquetWriter(self.f, self.schema, compression="zstd")
            empty = pa.array([], IMAGES_FIELD.type)
            for b in pq.ParquetFile(scratch, pre_buffer=False).iter_batches(batch_size=512):
                column = pa.array([[]] * b.num_rows, IMAGES_FIELD.type) if b.num_rows else empty
                self.writer.write_table(pa.Table.from_arrays([*b.columns, column], schema=self.schema))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def write_parquet(
    samples: Iterable[Sample],
    out: Path,
    schema: pa.Schema,
    row: Callable[[Sample], dict[str, Any]],
    *,
    batch: int = 512,
    images: bool = False,
) -> ExportStats:
    """``images``: the format carries the samples' images (``IMAGES_FIELD``, see the module docstring)."""
    out = Path(out)
    stats = ExportStats(files=[out])
    rewritable = str(out) != "-" and (
        not out.exists() or (out.is_file() and not str(out).startswith("/dev/"))
    )
    with atomic_output(out, mode="w+b" if rewritable else "wb") as f:
        sink = _Sink(f, schema, images=images, rewritable=rewritable)
        rows: list[dict[str, Any]] = []
        weight = 0
        try:
            for s in samples:
                r = row(s)
                if images:
                    cells = hf_image_cells(s)
                    if cells:
                        sink.need_images()
                        weight += sum(len(c["bytes"] or b"") for c in cells)
                    r["images"] = cells
                rows.append(r)
                stats.add(s)
                if len(rows) >= batch or weight >= IMAGE_BATCH_BYTES:
                    sink.write(rows)
                    rows = []
                    weight = 0
            if rows or stats.samples == 0:
                sink.write(rows)
        finally:
            sink.close()
    return stats
