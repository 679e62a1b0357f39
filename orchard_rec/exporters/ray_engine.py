"""``export --engine ray``: a dataset export (``exporters.dataset``) sharded over a Ray cluster.

The driver lists the selected sessions (in the order a single-process export takes them) and
cuts them into contiguous shards, one Ray task each (``pipeline.write_shard``): the task opens
its own read-only store (PostgreSQL in a real deployment; the URL must reach the database
from every node), reconstructs its sessions and writes staged part files. When every shard
is done, the driver knows each shard's sample count; one task per staged part moves it into
its partition with the export's running ``index`` (earlier shards' samples added), and the
driver writes the manifest: the same commit point as a single-process export. The dataset
then equals the single-process one sample for sample (part files are cut differently).

A shard that fails removes its own files; the driver then removes the staging folder and
every part already moved, and writes no manifest. Ray is imported only here (the ``ray``
extra): without ``--engine ray`` nothing imports it. Selections that need all sessions at
once (``--group-by`` and what builds on it) are not sharded yet.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Callable
from typing import Any, cast

from orchard_rec.errors import ExportError, OrchardError, UsageError
from orchard_rec.exporters.base import ExportStats
from orchard_rec.exporters.dataset import STAGING_DIR, DatasetWriter, finalize_part, open_fs, storage_errors
from orchard_rec.exporters.pipeline import _recorded, session_ids, write_shard
from orchard_rec.selection import Selection

__all__ = ["UNSHARDABLE", "export_dataset_ray", "shards_of"]

UNSHARDABLE = ("group_by", "select", "filters", "pass_rate")
"""Selection options that look at several sessions at once: not with ``--engine ray``."""


def shards_of(ids: list[str], n: int) -> list[list[str]]:
    """``ids`` in ``n`` contiguous runs of near-equal length (fewer when there are fewer ids)."""
    n = max(1, min(n, len(ids)))
    size, extra = divmod(len(ids), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(ids[start:end])
        start = end
    return [s for s in out if s]


def _finalize(url: str, storage_options: dict[str, Any] | None, staged: str, offset: int) -> tuple[str, int]:
    fs, root = open_fs(url, storage_options)
    return finalize_part(fs, root, staged, offset)


def export_dataset_ray(
    db_url: str,
    url: str,
    selection: Selection | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    address: str | None = None,
    shards: int | None = None,
    on_session: Callable[[Any], None] | None = None,
    **options: Any,
) -> ExportStats:
    """``shards``: default two per CPU of the cluster; ``options``: fields of ``selection`` and
    ``iter_samples``' other keywords, as ``pipeline.export_dataset`` takes them."""
    sel, hooks = Selection.take(selection, options)
    given = [k for k in UNSHARDABLE if getattr(sel, k)]
    if given:
        raise UsageError(
            f"--engine ray shards by session; {', '.join('--' + k.replace('_', '-') for k in given)} "
            "needs all sessions at once: leave --engine out for this selection"
        )
    try:
        import ray
    except ImportError:
        raise ExportError("--engine ray needs Ray: pip install 'orchard-rec[ray]'") from None
    recorded = {**_recorded(sel, hooks), "engine": "ray"}
    ids = session_ids(db_url, sessions=sel.sessions, since=sel.since, harness=sel.harness)
    with storage_errors(url):
        driver = DatasetWriter(url, storage_options=storage_options)  # checks the prefix, names the export
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    done: list[dict[str, Any]] = []
    refs: list[Any] = []
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        runs = shards_of(ids, shards or 2 * cpus)
        shard_task: Any = ray.remote(cast(Any, write_shard))
        refs = [
            shard_task.remote(
                db_url,
                url,
                sel.replace(sessions=run),
                storage_options=storage_options,
                export_id=driver.export_id,
                shard=k,
                **hooks,
            )
            for k, run in enumerate(runs)
        ]
        for ref, run in zip(refs, runs, strict=True):
            done.append(cast(dict[str, Any], ray.get(ref)))
            for _ in run:
                if on_session is not None:
                    on_session(None)
        offsets, total = [], 0
        for d in done:
            offsets.append(total)
            total += d["samples"]
        moves: Any = ray.remote(_finalize)
        moved = [
            moves.remote(url, storage_options, staged, offset)
            for d, offset in zip(done, offsets, strict=True)
            for staged in d["parts"]
        ]
        for final, rows in ray.get(moved):
            driver.parts[final] = rows
        stats = ExportStats(samples=total, tokens=sum(d["tokens"] for d in done))
        driver.images_written = [p for d in done for p in d["images"]]
        if total == 0:
            _cleanup(driver, done)
            return stats
        manifest = driver.commit(recorded)
        with contextlib.suppress(Exception):  # empty folders a local filesystem keeps
            driver.fs.rm(posixpath.join(driver.root, STAGING_DIR), recursive=True)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            for ref in refs:
                ray.cancel(ref, force=True)
            ray.wait(refs, num_returns=len(refs), timeout=60)  # no shard writes after the cleanup
        _cleanup(driver, done)
        cause = getattr(exc, "cause", None)  # a shard's own error, as a single process raises it
        if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, (OrchardError, OSError)):
            raise cause from None
        raise
    finally:
        if started:
            ray.shutdown()
    stats.files = [cast(Any, url.rstrip("/") + "/" + manifest[len(driver.root) :].lstrip("/"))]
    return stats


def _cleanup(driver: DatasetWriter, done: list[dict[str, Any]]) -> None:
    """Remove the staging folder, the parts already moved and the images the shards wrote."""
    fs, root = driver.fs, driver.root
    with contextlib.suppress(Exception):
        fs.rm(posixpath.join(root, STAGING_DIR, driver.export_id), recursive=True)
    driver.images_written = [p for d in done for p in d["images"]]
    driver.abort()
