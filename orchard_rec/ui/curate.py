"""Annotate and curate from the viewer: a session's reward, status, label and note; the export
of chosen sessions as a download.

Annotations are the session's outcome, written through ``Store.update_outcome`` with the merge
rules of ``storage.outcome`` (what ``POST /sessions/{id}/outcome`` and ``orchard-rec outcome`` use), on a store opened for writing
only for this (``orchard-rec ui --annotate``; the proxy's own store under ``serve --ui``). Only
the fields given change: the others are read back and passed on as they were; a field given as
null (or an empty label/note) is cleared. The label and the note live in the outcome metadata
(``label``, ``note``), beside what the harness reported.

Exports run ``exporters.pipeline.export``, the code behind ``orchard-rec export``, into a
temporary file that is streamed back and removed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from orchard_rec.records import SESSION_STATUSES, Outcome
from orchard_rec.storage.outcome import InvalidOutcome, change_from_json
from orchard_rec.storage.store import Store

__all__ = ["ANNOTATION_FIELDS", "EXPORT_FORMATS", "annotate", "export_file"]

ANNOTATION_FIELDS = ("reward", "status", "label", "note")
EXPORT_FORMATS = {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}
MAX_NOTE = 10_000


class AnnotationError(ValueError):
    pass


def _check(fields: dict[str, Any]) -> None:
    unknown = sorted(set(fields) - set(ANNOTATION_FIELDS))
    if unknown:
        raise AnnotationError(f"cannot set {unknown[0]!r}: one of {', '.join(ANNOTATION_FIELDS)}")
    r = fields.get("reward")
    if "reward" in fields and r is not None and (isinstance(r, bool) or not isinstance(r, (int, float))):
        raise AnnotationError("reward must be a number (or null to clear it)")
    s = fields.get("status")
    if s is not None and s not in SESSION_STATUSES:
        raise AnnotationError(f"status must be one of {', '.join(SESSION_STATUSES)} (or null)")
    for k in ("label", "note"):
        v = fields.get(k)
        if v is not None and not isinstance(v, str):
            raise AnnotationError(f"{k} must be text (or null to clear it)")
        if isinstance(v, str) and len(v) > MAX_NOTE:
            raise AnnotationError(f"{k} is longer than {MAX_NOTE} characters")


def annotate(store: Store, session_id: str, fields: dict[str, Any]) -> Outcome:
    """Set the given fields of a session's outcome; the rest stays. Returns the outcome written."""
    _check(fields)
    summary = store.session(session_id)
    if summary is None:
        raise LookupError(f"no session {session_id!r}")
    body: dict[str, Any] = {}
    if "reward" in fields:
        new, old = fields["reward"], (summary.outcome or Outcome()).reward
        # named rewards: the page's number is the scalar "reward" among them
        body["reward"] = {**old, "reward": float(new)} if isinstance(old, dict) and new is not None else new
    if "status" in fields:
        body["status"] = fields["status"]
    meta = {k: ((fields[k] or "").strip() or None) for k in ("label", "note") if k in fields}
    if meta:
        body["metadata"] = meta  # an empty label/note clears its key (null), the other keys stay
    # the merge rules of `orchard-rec outcome` and POST /sessions/{id}/outcome (storage.outcome), in one transaction
    try:
        return store.update_outcome(session_id, change_from_json(body))
    except InvalidOutcome as e:
        raise AnnotationError(str(e)) from None


def export_file(db_url: str, fmt: str, sessions: list[str]) -> Path:
    """The export of ``sessions`` in ``fmt`` (jsonl or parquet), in a temporary file the caller removes."""
    from orchard_rec.exporters.pipeline import export

    if fmt not in EXPORT_FORMATS:
        raise AnnotationError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if not sessions:
        raise AnnotationError("choose at least one session")
    folder = Path(tempfile.mkdtemp(prefix="orchard-ui-export-"))
    out = folder / f"sessions.{fmt}"
    export(db_url, fmt, out, sessions=sessions)
    return out
