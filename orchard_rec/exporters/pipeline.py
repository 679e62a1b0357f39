"""Database → samples → a file of some format (selection and filters: ``orchard_rec.pipeline``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from orchard_rec.errors import ExportError, OrchardError
from orchard_rec.exporters.base import ExportStats, get, output_set
from orchard_rec.exporters.conversation import conversation_of
from orchard_rec.pipeline import iter_samples
from orchard_rec.reconstruct import Sample
from orchard_rec.selection import Selection
from orchard_rec.storage.queries import teacher_store
from orchard_rec.storage.store import Store

__all__ = [
    "attach_messages",
    "export",
    "export_dataset",
    "fill_images",
    "select_samples",
    "session_ids",
    "write_shard",
]


def select_samples(
    store: Store, selection: Selection | None = None, *, with_messages: bool = False, **options: Any
) -> Iterator[Sample]:
    """``pipeline.iter_samples``, with recorded data that cannot be reconstructed reported as an
    ``ExportError`` (usage mistakes stay ``UsageError``)."""
    try:
        yield from iter_samples(
            store, selection, with_messages=attach_messages if with_messages else None, **options
        )
    except OrchardError:
        raise
    except ValueError as exc:
        raise ExportError(str(exc)) from exc


def attach_messages(store: Store, s: Sample) -> None:
    """Give a sample its conversation: the chat view of its last call's request plus the answer."""
    last = store.get_call(s.turns[-1].call_id) if s.turns else None
    if last is None:
        return
    s.messages, s.tools = conversation_of(last)


def fill_images(store: Store, samples: Iterable[Sample]) -> Iterator[Sample]:
    """Samples whose image refs lack bytes (not from a remote URL) get them from the store's image
    table (``Store.image(digest)``, when the store has one); refs it does not hold stay as they are."""
    lookup = getattr(store, "image", None)
    for s in samples:
        if lookup is not None and any(r.data is None and r.url is None for r in s.images):
            filled = []
            for r in s.images:
                found = lookup(r.digest) if r.data is None and r.url is None else None
                if found is not None:
                    mime, data = found
                    r = dataclasses.replace(r, mime=r.mime or mime, data=data)
                filled.append(r)
            s.images = filled
        yield s


def export(
    db_url: str,
    fmt: str,
    out: Path,
    selection: Selection | None = None,
    *,
    format_options: dict[str, Any] | None = None,
    on_session: Callable[[Any], None] | None = None,
    check: Callable[[Path], None] | None = None,
    **options: Any,
) -> ExportStats:
    """The samples ``selection`` names (``options``: its fields, and ``iter_samples``' other
    keywords) written in format ``fmt``. ``selection.auxiliary``: keep side-conversation samples
    (``metadata.auxiliary``); default: only in formats that declare ``includes_auxiliary``
    (jsonl, parquet), never in trainer formats.

    Every file is written under a temporary name and renamed into place at the end, all parts
    together (``base.output_set``); ``check`` is asked about each final path first. An export
    that keeps no sample renames nothing: an earlier output stays as it was (``stats.files``
    is then empty)."""
    sel, hooks = Selection.take(selection, options)
    exporter = get(fmt, **(format_options or {}))
    if sel.auxiliary is None:
        sel = sel.replace(auxiliary=bool(getattr(exporter, "includes_auxiliary", False)))
    store = Store(db_url, readonly=True)  # an export never writes the database
    try:
        teachers = teacher_store(store)
        if teachers.has_table() and "teacher" not in hooks:
            hooks["teacher"] = teachers.lookup  # samples carry stored teacher log-probs
            if hasattr(exporter, "teacher_fill") and teachers.has_rows():
                exporter.teacher_fill = True  # a sample the teacher missed: zeros, masked out
        samples = select_samples(
            store,
            sel,
            on_session=on_session,
            with_messages=getattr(exporter, "needs_messages", False),
            **hooks,
        )
        with output_set(check) as outputs:
            stats = exporter.write(fill_images(store, samples), out)
            if stats.samples == 0:
                outputs.discard()
                stats.files = []
            else:
                outputs.commit()
        return stats
    finally:
        store.close()


def export_dataset(
    db_url: str,
    url: str,
    selection: Selection | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    on_session: Callable[[Any], None] | None = None,
    **options: Any,
) -> ExportStats:
    """Database -> a partitioned parquet dataset at ``url`` (``exporters.dataset``): the ``parquet``
    format's rows, partitioned by the session's outcome metadata ``run``, the policy version and
    the session's day; the manifest records ``selection``."""
    from orchard_rec.exporters.dataset import write_dataset

    sel, hooks = Selection.take(selection, options)
    recorded = _recorded(sel, hooks)
    store = Store(db_url, readonly=True)  # an export never writes the database
    try:
        samples, session_info = _dataset_samples(store, on_session, sel, hooks)
        return write_dataset(
            samples, url, storage_options=storage_options, session_info=session_info, selection=recorded
        )
    finally:
        store.close()


def _dataset_samples(
    store: Store, on_session: Callable[[Any], None] | None, sel: Selection, hooks: dict[str, Any]
) -> tuple[Iterator[Sample], Callable[[str], tuple[Any, float | None]]]:
    """The samples of a dataset export (teacher data attached, images filled) and each session's
    ``(run, created_at)``, the partition values the dataset writer needs."""
    teachers = teacher_store(store)
    if teachers.has_table() and "teacher" not in hooks:
        hooks = {**hooks, "teacher": teachers.lookup}

    def session_info(sid: str) -> tuple[Any, float | None]:
        summary = store.session(sid)
        if summary is None:
            return None, None
        meta = summary.outcome.metadata if summary.outcome is not None else {}
        return meta.get("run"), summary.created_at

    if sel.auxiliary is None:
        sel = sel.replace(auxiliary=True)
    samples = select_samples(store, sel, on_session=on_session, **hooks)
    return fill_images(store, samples), session_info


def session_ids(db_url: str, *, sessions: Any = None, since: Any = None, harness: Any = None) -> list[str]:
    """The selected sessions' ids in the order an ungrouped export reconstructs them (by id)."""
    store = Store(db_url, readonly=True)
    try:
        return sorted(s.id for s in store.sessions(sessions, since=since, harness=harness))
    finally:
        store.close()


def write_shard(
    db_url: str,
    url: str,
    selection: Selection | None = None,
    *,
    storage_options: dict[str, Any] | None,
    export_id: str,
    shard: int,
    **options: Any,
) -> dict[str, Any]:
    """One shard of a sharded dataset export (a Ray task): its own read-only store, its parts
    staged (``DatasetWriter(shard=)``); removes what it wrote when it fails. Returns the staged
    parts, the images it wrote, and its sample and token counts."""
    from orchard_rec.exporters.dataset import DatasetWriter, storage_errors

    sel, hooks = Selection.take(selection, options)
    store = Store(db_url, readonly=True)
    writer: DatasetWriter | None = None
    stats = ExportStats()
    try:
        samples, session_info = _dataset_samples(store, None, sel, hooks)
        with storage_errors(url):
            writer = DatasetWriter(
                url,
                storage_options=storage_options,
                session_info=session_info,
                export_id=export_id,
                shard=shard,
            )
            for s in samples:
                writer.add(s)
                stats.add(s)
            writer.close_parts()
        return {
            "parts": sorted(writer.parts),
            "images": writer.images_written,
            "samples": stats.samples,
            "tokens": stats.tokens,
        }
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        store.close()


def _recorded(sel: Selection, hooks: dict[str, Any]) -> dict[str, Any]:
    """The selection as the manifest records it (``Selection.recorded``), with the tokenizer's name."""
    out = sel.recorded()
    out["auxiliary"] = True if sel.auxiliary is None else sel.auxiliary
    if hooks.get("tokenizer") is not None:
        out["tokenizer"] = str(getattr(hooks["tokenizer"], "name_or_path", "given"))
    return out
