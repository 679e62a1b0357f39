"""``orchard-rec verify``'s body: pick the samples, score them, print the report, say the exit code.

The CLI (``orchard_rec.cli``) only parses options and calls ``run``; this module is imported
when ``verify`` runs, and torch/transformers only when the model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from orchard_rec.errors import UsageError
from orchard_rec.verify.compare import SampleCheck, SampleView, VerifyReport
from orchard_rec.verify.run import DEFAULT_TOLERANCE, verify_samples
from orchard_rec.verify.scorer import DTYPES, Scorer
from orchard_rec.verify.sources import read_export, samples_from_db

if TYPE_CHECKING:
    from orchard_rec.pipeline import Selection

__all__ = ["run"]


def _only(views: Iterator[SampleView], sessions: Sequence[str] | None) -> Iterator[SampleView]:
    wanted = set(sessions or ())
    for v in views:
        if not wanted or v.session_id in wanted:
            yield v


def run(
    *,
    model: str,
    source: Path | None,
    open_store: Callable[[], Any],
    selection: Selection,
    dtype: str,
    device: str,
    max_samples: int | None,
    tolerance: float | None,
    as_json: bool,
    echo: Callable[[str], None],
) -> VerifyReport:
    """Verify the samples of ``source`` (an export file) or of the database ``open_store()``
    gives (``selection``; of an export file only its ``sessions`` apply); every line goes to ``echo``."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
    if max_samples is not None and max_samples < 1:
        raise UsageError("--max-samples must be at least 1")
    tol = DEFAULT_TOLERANCE[dtype] if tolerance is None else tolerance
    if tol <= 0:
        raise UsageError("--tolerance must be positive (nats)")

    def show(check: SampleCheck) -> None:
        echo(orjson.dumps(check.to_dict()).decode() if as_json else check.line())

    store = None
    sessions = selection.sessions
    try:
        if source is not None:
            views = _only(read_export(source), sessions)
        else:
            store = open_store()
            views = samples_from_db(store, selection)
        first = next(views, None)
        if first is None:
            raise UsageError("no sample to verify" + (" matches --session" if sessions else ""))
        scorer = Scorer(model, dtype=dtype, device=device)
        report = verify_samples(
            _chain(first, views), scorer, tolerance=tol, max_samples=max_samples, on_check=show
        )
    finally:
        if store is not None:
            store.close()
    if as_json:
        echo(orjson.dumps({"summary": report.totals()}).decode())
    else:
        echo(report.summary())
    return report


def _chain(first: SampleView, rest: Iterator[SampleView]) -> Iterator[SampleView]:
    yield first
    yield from rest
