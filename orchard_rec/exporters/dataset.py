"""A partitioned Parquet dataset on any filesystem fsspec knows: ``export --out s3://bucket/prefix/``.

Layout under the prefix (``file://``, a local folder, ``s3://``, ``gs://``, ...)::

    run=<run>/policy_version=<v>/date=<YYYY-MM-DD>/part-<export>-<n>.parquet
    _images/<sha256>.<ext>
    _manifests/manifest-<UTC time>-<export>.json

- Rows are the ``parquet`` format's (``exporters.parquet.SCHEMA``, the same row code), except
  that images are out of line: the ``images`` column holds references
  (``digest, mime, width, height, url, path``), ``path`` relative to the prefix, each image
  written once as ``_images/<digest>.<ext>`` (the name is the SHA-256 of the bytes). The ``_`` folders are
  skipped by pyarrow's and Ray Data's discovery; DuckDB's ``**/*.parquet`` matches no image.
- Hive partitions (``key=value`` folders, not columns in the files): ``run`` is the session's
  outcome metadata ``run`` (``orchard-rec outcome SID --metadata run=exp7``), ``policy_version``
  the newest policy version that generated the sample's tokens (when samples carry
  ``policy_versions``), ``date`` the session's start day (UTC). Unknown values are
  ``__HIVE_DEFAULT_PARTITION__``, which pyarrow and DuckDB read as null (Ray Data keeps the
  string); every file has all three levels, so the glob readers see one partitioning.
- The manifest is written last and is the commit point: a dataset is the files its newest
  manifest lists (every earlier export's files plus this one's), with row counts, sizes, the
  schema, the export's selection and the orchard-rec version. An export that fails or is
  interrupted removes the files it wrote and writes no manifest; a reader that goes by the
  manifest (``orchard_rec.datasets``) never sees a half-written export. Re-running into the
  same prefix (with ``--since``) adds part files under new names and a new manifest; nothing
  earlier is rewritten.

Memory: one buffered batch per open partition (``BATCH`` rows or ``BATCH_TOKENS`` tokens); at most ``MAX_OPEN`` part files are open (the
least recently used is closed, a later sample of its partition starts a new part).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import posixpath
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from orchard_rec import __version__
from orchard_rec.errors import ExportError
from orchard_rec.exporters.base import ExportStats
from orchard_rec.exporters.parquet import SCHEMA, _row
from orchard_rec.reconstruct import Sample

__all__ = [
    "DATASET_SCHEMA",
    "IMAGE_REF",
    "MANIFEST_DIR",
    "NULL_PARTITION",
    "PARTITIONS",
    "PARTITION_SCHEMA",
    "DatasetWriter",
    "finalize_part",
    "is_url",
    "latest_manifest",
    "open_fs",
    "parse_storage_options",
    "storage_errors",
    "write_dataset",
]

PARTITIONS = ("run", "policy_version", "date")
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
PARTITION_SCHEMA = pa.schema([(k, pa.string()) for k in PARTITIONS])
"""For pyarrow: ``pyarrow.dataset.partitioning(PARTITION_SCHEMA, flavor="hive")`` (its type inference
fails on a level that is null everywhere, e.g. ``policy_version`` before any policy was tracked)."""
MANIFEST_DIR = "_manifests"
STAGING_DIR = "_staging"
IMAGES_DIR = "_images"
MANIFEST_FORMAT = "orchard-rec-dataset/1"
MAX_OPEN = 32
BATCH = 512
BATCH_TOKENS = 1 << 18
"""A part's buffered rows are written as a row group at ``BATCH`` rows or this many tokens, so
memory stays bounded for long samples (Python lists of ids, mask and log-probs)."""

IMAGE_REF = pa.struct(
    [
        ("digest", pa.string()),
        ("mime", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("url", pa.string()),
        ("path", pa.string()),
    ]
)
DATASET_SCHEMA = SCHEMA.append(pa.field("images", pa.list_(IMAGE_REF)))
"""The part files' schema: the ``parquet`` format's columns plus image references."""


def is_url(out: str) -> bool:
    """``s3://...``, ``gs://...``, ``file://...``: an ``--out`` that names a dataset prefix."""
    scheme, sep, _ = out.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum() and len(scheme) > 1


def parse_storage_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``key=value`` pairs (``--storage-option``); values that are JSON (numbers, true) keep their type."""
    opts: dict[str, Any] = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise ExportError(
                f"--storage-option {p!r}: use KEY=VALUE, e.g. endpoint_url=http://127.0.0.1:9000"
            )
        try:
            opts[k] = orjson.loads(v)
        except orjson.JSONDecodeError:
            opts[k] = v
    return opts


def open_fs(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the prefix inside it (credentials, endpoint: the
    options, else the environment, e.g. ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``)."""
    import fsspec

    opts = dict(storage_options or {})
    if url.startswith("file://") or not is_url(url):
        opts.setdefault("auto_mkdir", True)
    try:
        fs, root = fsspec.core.url_to_fs(url, **opts)
    except ImportError as exc:
        scheme = url.partition("://")[0]
        package = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
        raise ExportError(
            f"--out {url}: the filesystem for {scheme}:// is not installed "
            f"(pip install {package.get(scheme, 'its fsspec implementation')}): {exc}"
        ) from None
    except (ValueError, TypeError) as exc:
        raise ExportError(f"--out {url}: {exc}") from None
    return fs, root.rstrip("/")


def latest_manifest(fs: Any, root: str) -> tuple[str, dict[str, Any]] | None:
    """The newest committed manifest under ``root`` (its path and content), or None."""
    folder = posixpath.join(root, MANIFEST_DIR)
    fs.invalidate_cache()  # s3fs and others cache listings; another process may have committed
    try:
        names = sorted(p for p in fs.ls(folder, detail=False) if p.rstrip("/").endswith(".json"))
    except FileNotFoundError:
        return None
    if not names:
        return None
    with fs.open(names[-1], "rb") as f:
        return names[-1], orjson.loads(f.read())


def _partition_value(v: Any) -> str:
    if v is None or v == "":
        return NULL_PARTITION
    text = str(v)
    return "".join(c if c.isalnum() or c in "-_.:@+" else f"%{ord(c):02X}" for c in text)


def sample_policy_version(s: Sample) -> Any:
    """The newest policy version that generated the sample's tokens (last span), when known."""
    spans = getattr(s, "policy_versions", None)
    if not spans:
        return None
    versions = [sp[0] for sp in spans if sp[0] is not None]
    return versions[-1] if versions else None


@dataclass
class _Part:
    path: str
    file: Any
    writer: pq.ParquetWriter
    rows: list[dict[str, Any]] = field(default_factory=list)
    count: int = 0
    tokens: int = 0


class DatasetWriter:
    """Writes samples into the dataset under ``url``; ``commit`` writes the manifest.

    ``session_info(session_id)`` gives ``(run, created_at)`` of a session (None when unknown).
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        session_info: Callable[[str], tuple[Any, float | None]] | None = None,
        export_id: str | None = None,
        shard: int | None = None,
    ) -> None:
        """``shard``: a worker of a sharded export (``--engine ray``): parts are staged under
        ``_staging/<export>/`` (``.staged``, no reader's glob matches them) until the driver
        moves them into place with the export's running sample index (``finalize_part``)."""
        self.url = url
        self.fs, self.root = open_fs(url, storage_options)
        self.session_info = session_info or (lambda _sid: (None, None))
        now = dt.datetime.now(dt.UTC)  # the names sort in commit order: newest manifest last
        self.export_id = export_id or now.strftime("%Y%m%dT%H%M%S.%fZ-") + secrets.token_hex(4)
        self.shard = shard
        self.previous = self._check_prefix() if shard is None else None
        self.open: OrderedDict[tuple[str, ...], _Part] = OrderedDict()
        self.parts: dict[str, int] = {}
        """Part file path (relative to the root) -> rows, for every part this export wrote."""
        self.images_written: list[str] = []
        self.images_seen: set[str] = set()
        self.counter = 0
        self._cached: tuple[str, tuple[Any, float | None]] | None = None

    # -- the prefix ------------------------------------------------------------------------------------------

    def _check_prefix(self) -> tuple[str, dict[str, Any]] | None:
        """The previous manifest; refuses a prefix that holds files but no orchard-rec dataset."""
        found = latest_manifest(self.fs, self.root)
        if found is not None:
            if found[1].get("format") != MANIFEST_FORMAT:
                raise ExportError(f"{self.url}: {found[0]} is not an orchard-rec dataset manifest")
            return found
        try:
            entries = [p for p in self.fs.ls(self.root, detail=False) if posixpath.basename(p.rstrip("/"))]
        except (FileNotFoundError, NotADirectoryError):
            return None
        if entries:
            raise ExportError(
                f"--out {self.url} holds files but no orchard-rec dataset (no {MANIFEST_DIR}/); "
                "give an empty prefix or one an earlier export wrote"
            )
        return None

    # -- rows ------------------------------------------------------------------------------------------------

    def _info(self, sid: str) -> tuple[Any, float | None]:
        if self._cached is None or self._cached[0] != sid:
            self._cached = (sid, self.session_info(sid))
        return self._cached[1]

    def partition_of(self, s: Sample) -> tuple[str, ...]:
        run, created = self._info(s.session_id)
        day = dt.datetime.fromtimestamp(created, dt.UTC).strftime("%Y-%m-%d") if created else None
        values = (run, sample_policy_version(s), day)
        return tuple(f"{k}={_partition_value(v)}" for k, v in zip(PARTITIONS, values, strict=True))

    def _image_refs(self, s: Sample) -> list[dict[str, Any]]:
        refs = []
        for ref in s.images:
            path = None
            if ref.data is not None:
                path = f"{IMAGES_DIR}/{ref.digest}.{ref.extension}"
                if ref.digest not in self.images_seen:
                    self.images_seen.add(ref.digest)
                    full = posixpath.join(self.root, path)
                    if not self.fs.exists(full):
                        with self.fs.open(full, "wb") as f:
                            f.write(ref.data)
                        self.images_written.append(full)
            refs.append({**ref.to_dict(), "url": ref.url, "path": path})
        return refs

    def add(self, s: Sample) -> None:
        key = self.partition_of(s)
        part = self.open.get(key)
        if part is None:
            part = self._open(key)
        else:
            self.open.move_to_end(key)
        r = _row(s)
        r["images"] = self._image_refs(s)
        part.rows.append(r)
        part.tokens += len(s.tokens)
        if len(part.rows) >= BATCH or part.tokens >= BATCH_TOKENS:
            self._flush(part)

    def _open(self, key: tuple[str, ...]) -> _Part:
        if len(self.open) >= MAX_OPEN:
            _, oldest = self.open.popitem(last=False)
            self._close(oldest)
        if self.shard is None:
            rel = posixpath.join(*key, f"part-{self.export_id}-{self.counter:05d}.parquet")
        else:
            name = f"part-{self.export_id}-s{self.shard:05d}-{self.counter:05d}.parquet.staged"
            rel = posixpath.join(STAGING_DIR, self.export_id, *key, name)
        self.counter += 1
        full = posixpath.join(self.root, rel)
        self.parts[rel] = 0  # known before the first byte, so a failure removes it
        f = self.fs.open(full, "wb")
        part = _Part(rel, f, pq.ParquetWriter(f, DATASET_SCHEMA, compression="zstd"))
        self.open[key] = part
        return part

    def _flush(self, part: _Part) -> None:
        if part.rows:
            part.writer.write_table(pa.Table.from_pylist(part.rows, schema=DATASET_SCHEMA))
            part.count += len(part.rows)
            part.rows = []
            part.tokens = 0

    def _close(self, part: _Part) -> None:
        self._flush(part)
        part.writer.close()
        part.file.close()
        self.parts[part.path] = part.count

    # -- commit / abort --------------------------------------------------------------------------------------

    def close_parts(self) -> None:
        while self.open:
            self._close(self.open.popitem(last=False)[1])

    def commit(self, selection: dict[str, Any]) -> str:
        """Close every part and write the manifest (the commit point); its path."""
        self.close_parts()
        files = list(self.previous[1]["files"]) if self.previous else []
        for rel, rows in sorted(self.parts.items()):
            size = self.fs.size(posixpath.join(self.root, rel))
            files.append({"path": rel, "rows": rows, "bytes": size, "export": self.export_id})
        manifest = {
            "format": MANIFEST_FORMAT,
            "orchard_rec": __version__,
            "export": self.export_id,
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "previous": posixpath.basename(self.previous[0]) if self.previous else None,
            "partitioning": {"flavor": "hive", "keys": list(PARTITIONS), "null": NULL_PARTITION},
            "schema": [{"name": f.name, "type": str(f.type)} for f in DATASET_SCHEMA],
            "selection": selection,
            "rows": sum(f["rows"] for f in files),
            "added_rows": sum(self.parts.values()),
            "images": {"folder": IMAGES_DIR, "added": len(self.images_written)},
            "files": files,
        }
        name = posixpath.join(self.root, MANIFEST_DIR, f"manifest-{self.export_id}.json")
        with self.fs.open(name, "wb") as f:
            f.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        return name

    def abort(self) -> None:
        """Remove everything this export wrote (no manifest was written)."""
        for part in self.open.values():
            with contextlib.suppress(Exception):
                part.writer.close()
            with contextlib.suppress(Exception):
                part.file.close()
        self.open.clear()
        for path in [*(posixpath.join(self.root, rel) for rel in self.parts), *self.images_written]:
            with contextlib.suppress(Exception):
                self.fs.rm(path)


def write_dataset(
    samples: Iterable[Sample],
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    session_info: Callable[[str], tuple[Any, float | None]] | None = None,
    selection: dict[str, Any] | None = None,
) -> ExportStats:
    """Write ``samples`` as a new export into the dataset at ``url``; the manifest last."""
    with storage_errors(url):
        w = DatasetWriter(url, storage_options=storage_options, session_info=session_info)
    stats = ExportStats()
    try:
        with storage_errors(url):
            for s in samples:
                w.add(s)
                stats.add(s)
            if stats.samples == 0:
                w.abort()
                return stats
            manifest = w.commit(selection or {})
    except BaseException:
        w.abort()
        raise
    rel = manifest[len(w.root) :].lstrip("/")
    stats.files = [cast(Path, url.rstrip("/") + "/" + rel)]  # shown as given: s3://bucket/prefix/...
    return stats


_STORAGE_LIBRARIES = (
    "botocore",
    "aiobotocore",
    "s3fs",
    "gcsfs",
    "google",
    "adlfs",
    "azure",
    "fsspec",
    "aiohttp",
)


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """A filesystem's failure (no such bucket, refused credentials, unreachable endpoint) as an
    ``ExportError`` naming ``url``; anything else passes through."""
    try:
        yield
    except ExportError:
        raise
    except Exception as exc:
        if not isinstance(exc, OSError) and type(exc).__module__.split(".")[0] not in _STORAGE_LIBRARIES:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ExportError(
            f"cannot write the dataset at {url}: {first} (check the bucket, the credentials: "
            "--storage-option key=... secret=... or AWS_*, and the endpoint: endpoint_url=... or AWS_ENDPOINT_URL)"
        ) from exc


def iter_files(manifest: dict[str, Any]) -> Iterator[str]:
    """The part files of a manifest, relative to the dataset's root."""
    for f in manifest["files"]:
        yield f["path"]


def finalize_part(fs: Any, root: str, staged: str, offset: int) -> tuple[str, int]:
    """Move a shard's staged part into its partition, its ``index`` column shifted by ``offset``
    (the samples of earlier shards): ``(path relative to root, rows)``."""
    _, _export, *rest = staged.split("/")
    final = posixpath.join(*rest[:-1], rest[-1].removesuffix(".staged"))
    rows = 0
    i = DATASET_SCHEMA.get_field_index("index")
    shift = pa.scalar(offset, pa.int64())
    with (
        fs.open(posixpath.join(root, staged), "rb") as src,
        fs.open(posixpath.join(root, final), "wb") as dst,
    ):
        writer = pq.ParquetWriter(dst, DATASET_SCHEMA, compression="zstd")
        for b in pq.ParquetFile(src).iter_batches(batch_size=BATCH):  # one batch in memory
            b = b.set_column(i, "index", pc.add(b.column(i), shift))
            writer.write_batch(b)
            rows += b.num_rows
        writer.close()
    fs.rm(posixpath.join(root, staged))
    return final, rows
