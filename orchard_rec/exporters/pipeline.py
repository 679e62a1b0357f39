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
from orchard_rec.storage.store import Store
from orchard_rec.teacher.store import TeacherStore

__all__ = ["attach_messages", "export", "fill_images", "select_samples"]


def select_samples(store: Store, *, with_messages: bool = False, **selection: Any) -> Iterator[Sample]:
    """``pipeline.iter_samples``, with recorded data that cannot be reconstructed reported as an
    ``ExportError`` (usage mistakes stay ``UsageError``)."""
    try:
        yield from iter_samples(store, with_messages=attach_messages if with_messages else None, **selection)
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
    *,
    format_options: dict[str, Any] | None = None,
    on_session: Callable[[Any], None] | None = None,
    auxiliary: bool | None = None,
    check: Callable[[Path], None] | None = None,
    **selection: Any,
) -> ExportStats:
    """``auxiliary``: keep side-conversation samples (``metadata.auxiliary``); default: only in
    formats that declare ``includes_auxiliary`` (jsonl, parquet), never in trainer formats.

    Every file is written under a temporary name and renamed into place at the end, all parts
    together (``base.output_set``); ``check`` is asked about each final path first. An export
    that keeps no sample renames nothing: an earlier output stays as it was (``stats.files``
    is then empty)."""
    exporter = get(fmt, **(format_options or {}))
    if auxiliary is None:
        auxiliary = bool(getattr(exporter, "includes_auxiliary", False))
    store = Store(db_url, readonly=True)  # an export never writes the database
    try:
        teachers = TeacherStore(store.engine)
        if teachers.has_table() and "teacher" not in selection:
            selection["teacher"] = teachers.lookup  # samples carry stored teacher log-probs
            if hasattr(exporter, "teacher_fill") and teachers.has_rows():
                exporter.teacher_fill = True  # a sample the teacher missed: zeros, masked out
        samples = select_samples(
            store,
            on_session=on_session,
            with_messages=getattr(exporter, "needs_messages", False),
            auxiliary=auxiliary,
            **selection,
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
