"""Database → samples → a file of some format, streaming, with optional progress."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from orchard_rec.exporters.base import ExportStats, get
from orchard_rec.reconstruct.credit import credit_policy
from orchard_rec.reconstruct.merge import MismatchPolicy
from orchard_rec.reconstruct.sample import Sample
from orchard_rec.reconstruct.stream import iter_samples
from orchard_rec.storage.store import Store

__all__ = ["export", "select_samples"]


def select_samples(
    store: Store,
    *,
    sessions: Sequence[str] | None = None,
    since: float | None = None,
    harness: str | None = None,
    on_mismatch: MismatchPolicy = "split",
    credit: str = "assistant",
    on_session: Callable[[Any], None] | None = None,
    tokenizer: Any = None,
) -> Iterator[Sample]:
    yield from iter_samples(
        store, sessions=sessions, since=since, harness=harness, on_mismatch=on_mismatch,
        credit=credit_policy(credit), on_session=on_session, tokenizer=tokenizer,
    )


def export(
    db_url: str,
    fmt: str,
    out: Path,
    *,
    format_options: dict[str, Any] | None = None,
    on_session: Callable[[Any], None] | None = None,
    **selection: Any,
) -> ExportStats:
    exporter = get(fmt, **(format_options or {}))
    store = Store(db_url)
    try:
        return exporter.write(select_samples(store, on_session=on_session, **selection), out)
    finally:
        store.close()
