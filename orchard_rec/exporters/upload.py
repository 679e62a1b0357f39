"""Any format's file(s) to object storage: ``export --format slime --out s3://bucket/rollout.pt``.

An ``--out`` URL whose last segment names a file (``.jsonl``, ``.parquet``, ``.pt``, a slime
``{rollout_id}`` template) is written by the format's own exporter into a local temporary
folder, then uploaded beside the URL: side data first (a jsonl's image folder, every slime
rollout file but the first), the named file last, so a reader that waits for that object
never sees a half-uploaded export (an object store shows an object only once its upload is
complete). A failed export uploads nothing; a failed upload removes what it uploaded. A URL
that names a folder (``s3://bucket/prefix/``) is a partitioned dataset instead
(``exporters.dataset``).
"""

from __future__ import annotations

import contextlib
import posixpath
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, cast

from orchard_rec.exporters.base import ExportStats
from orchard_rec.exporters.dataset import open_fs, storage_errors

__all__ = ["FILE_SUFFIXES", "names_a_file", "upload_export"]

FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".pt")


def names_a_file(url: str) -> bool:
    """The URL's last segment is a file name of some format (else: a dataset prefix)."""
    last = url.rstrip("/").rsplit("/", 1)[-1]
    return not url.endswith("/") and PurePosixPath(last).suffix.lower() in FILE_SUFFIXES


def upload_export(
    url: str, storage_options: dict[str, Any] | None, write: Callable[[Path], ExportStats]
) -> ExportStats:
    """``write(local_path)`` runs the export into a temp folder; its files are uploaded next to ``url``."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    with storage_errors(url):
        fs, remote = open_fs(url, storage_options)
    folder = posixpath.dirname(remote)
    work = Path(tempfile.mkdtemp(prefix="orchard-upload-"))
    uploaded: list[str] = []
    try:
        stats = write(work / name)
        local = [Path(p) for p in stats.files]
        first = local[0] if local else None
        with storage_errors(url):
            for p in [*local[1:], *local[:1]]:  # the named file last: the commit point
                target = posixpath.join(folder, p.name)
                uploaded.append(target)
                fs.put(str(p), target, recursive=p.is_dir())
        base = url.rstrip("/").rsplit("/", 1)[0]
        stats.files = [cast(Path, f"{base}/{p.name}") for p in local]
        if first is not None and first.name != name:  # a {rollout_id} template: the files it made
            stats.files.sort(key=str)
        return stats
    except BaseException:
        for target in uploaded:
            with contextlib.suppress(Exception):
                fs.rm(target, recursive=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
