"""Samples straight from the database, one session at a time (constant memory).

``iter_samples`` walks the selected sessions, reads each one's calls in sequence order,
reconstructs it, and yields its samples with a running ``index``; memory holds one
session at a time, whatever the database size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from orchard_rec.reconstruct.credit import CreditPolicy
from orchard_rec.reconstruct.merge import MismatchPolicy, reconstruct_session
from orchard_rec.reconstruct.sample import Sample
from orchard_rec.storage.store import SessionSummary, Store

__all__ = ["iter_samples"]


def iter_samples(
    store: Store,
    *,
    sessions: Sequence[str] | None = None,
    since: float | None = None,
    harness: str | None = None,
    on_mismatch: MismatchPolicy = "split",
    credit: CreditPolicy | None = None,
    on_session: Callable[[SessionSummary], None] | None = None,
    tokenizer: Any = None,
) -> Iterator[Sample]:
    index = 0
    for summary, calls in store.iter_sessions_calls(sessions, since=since, harness=harness):
        for s in reconstruct_session(calls, on_mismatch=on_mismatch, credit=credit, outcome=summary.outcome, session_id=summary.id, tokenizer=tokenizer):
            s.index = index
            index += 1
            yield s
        if on_session is not None:
            on_session(summary)
