"""The record seam: what a writer of call records needs (``RecordSink``) and what a reader of
them needs (``RecordSource``). ``Store`` is both; code outside ``storage/`` that only writes or
only reads depends on the one it uses, so another backend (a file spool, a remote service, a
test double) can stand behind it without the SQL.

Queries that are not about records one by one (listings, aggregates, the schema) are the
functions of ``storage.queries``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from orchard_rec.records import CallRecord, Outcome
from orchard_rec.storage.outcome import OutcomeChange

if TYPE_CHECKING:
    from orchard_rec.storage.store import SessionSummary, Store

__all__ = ["RecordSink", "RecordSource"]


@runtime_checkable
class RecordSink(Protocol):
    """Where call records and session outcomes are written."""

    def write_batch(self, records: Sequence[CallRecord], *, known_new: bool = False) -> int:
        """Store the records not stored yet, in one transaction; how many were new."""
        ...

    def update_outcome(self, session_id: str, change: OutcomeChange) -> Outcome:
        """Merge ``change`` into the session's outcome (``storage.outcome.merge``); the merged outcome."""
        ...


@runtime_checkable
class RecordSource(Protocol):
    """Where call records and session summaries are read from."""

    def session(self, session_id: str) -> SessionSummary | None:
        """One session's summary (None when unknown)."""
        ...

    def sessions(
        self, ids: Sequence[str] | None = None, *, since: float | None = None, harness: str | None = None
    ) -> list[SessionSummary]:
        """The sessions (all, or those of ``ids``) updated since ``since`` of ``harness``, oldest first."""
        ...

    def calls(self, session_id: str | None = None, *, untagged: bool = False) -> list[CallRecord]:
        """A session's calls in order (all calls, or the untagged ones)."""
        ...

    def iter_calls(
        self, session_id: str | None = None, *, untagged: bool = False, batch: int = 500
    ) -> Iterator[CallRecord]:
        """``calls``, streamed ``batch`` rows at a time."""
        ...

    def iter_sessions_calls(
        self,
        ids: Sequence[str] | None = None,
        *,
        since: float | None = None,
        harness: str | None = None,
        batch: int = 2000,
        lazy: bool = False,
    ) -> Iterator[tuple[SessionSummary, Any]]:
        """Each selected session with its calls, streamed."""
        ...


if TYPE_CHECKING:

    def _store_is_both(store: Store) -> tuple[RecordSink, RecordSource]:
        return store, store  # mypy checks that ``Store`` implements the seam
