"""A ``CallRecord`` as a ``calls`` row and back: the row written (``_row``), the light record
reconstruction reads (``_LIGHT_COLUMNS``, ``_light_record``) and the whole one (``_record``),
with the column conversions they share (timestamps, bounded media types and sizes, packed
floats). Moved out of ``storage/store.py``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from orchard_rec import policy
from orchard_rec.records import CallOutcome, CallRecord, Dialect
from orchard_rec.storage import layout
from orchard_rec.storage.delta import Reader
from orchard_rec.storage.models import Call

__all__: list[str] = []


def _ts(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


def _epoch(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    if dt.tzinfo is None:  # SQLite hands back naive datetimes; we only ever store UTC
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _mime(v: str | None) -> str | None:
    """A client's media type as the column holds it (None when it would not fit: never a failed batch)."""
    return v if v is not None and len(v) <= 128 else None


def _dim(v: int | None) -> int | None:
    """A header's width / height when a 32-bit signed column holds it (a forged header may claim more)."""
    return v if v is not None and 0 <= v < 2**31 else None


def _sqlite_time(dt: datetime) -> str:
    """SQLAlchemy's SQLite DATETIME storage format, in UTC (what its bind processor writes)."""
    return (dt.astimezone(UTC) if dt.tzinfo else dt).isoformat(" ", "microseconds")[:26]


_SECONDS: dict[int, str] = {}
"""``YYYY-MM-DD HH:MM:SS`` (UTC) of the epoch seconds ``_sqlite_epoch`` met lately."""


def _sqlite_epoch(epoch: float) -> str:
    """``_sqlite_time(_ts(epoch))`` without the datetime: the second's text (cached: a writer's
    calls come within a few seconds) and the microseconds rounded as ``datetime.fromtimestamp``
    rounds them (the fraction times 10**6, half to even; a carry makes it the next second)."""
    frac, whole = math.modf(epoch)
    us = round(frac * 1e6)
    if us >= 1_000_000:
        us -= 1_000_000
        whole += 1.0
    elif us < 0:
        us += 1_000_000
        whole -= 1.0
    sec = int(whole)
    head = _SECONDS.get(sec)
    if head is None:
        if len(_SECONDS) > 4096:
            _SECONDS.clear()
        head = _SECONDS[sec] = datetime.fromtimestamp(sec, tz=UTC).isoformat(" ")[:19]
    return f"{head}.{us:06d}"


def _floats(v: bytes | None) -> tuple[float, ...] | None:
    return None if v is None else tuple(layout.unpack_floats(bytes(v)))


def _row(r: CallRecord, seq: int | None, stored: dict[str, Any]) -> dict[str, Any]:
    """The row's values; the times as epochs (``Store._insert_calls`` converts them for the driver)."""
    return {
        "id": r.call_id,
        "session_id": r.session_id,
        "seq": seq,
        "dialect": r.dialect.value,
        "method": r.method,
        "path": r.path,
        "stream": r.stream,
        "status_code": r.status_code,
        "outcome": r.outcome.value,
        "received_at": r.received_at,
        "first_byte_at": r.first_byte_at,
        "done_at": r.done_at,
        "harness": r.harness,
        "harness_session": r.harness_session,
        "model": r.model,
        "headers": r.headers if type(r.headers) is dict else dict(r.headers),  # (only dumped)
        "error": r.error,
        "usage": r.usage if r.usage is None or type(r.usage) is dict else dict(r.usage),
        "finish_reason": r.finish_reason,
        "bytes_in": r.bytes_in,
        "bytes_out": r.bytes_out,
        "metadata": (r.metadata if type(r.metadata) is dict else dict(r.metadata)) if r.metadata else None,
        "policy_versions": policy.to_json(r.policy_versions),
        "routed_experts": r.routed_experts,
        **stored,
    }


_LIGHT_COLUMNS = (
    "id",
    "session_id",
    "seq",
    "received_at",
    "dialect",
    "method",
    "path",
    "stream",
    "status_code",
    "outcome",
    "harness",
    "model",
    "error",
    "prompt_ids",
    "completion_ids",
    "completion_logprobs",
    "finish_reason",
    "metadata",  # small: what the proxy decided (tito branch, a harness's side conversation)
    "usage",  # small: a call's size when no ids were recorded (passthrough)
    "policy_versions",
    "routed_experts",
)


def _columns(c: Any, reader: Reader) -> dict[str, Any]:
    """What both readings of a call row share: its identity, outcome, ids and the columns decoded
    from their stored form (times as epochs, log-probs, policy spans, routing bytes)."""
    prompt, completion = reader.tokens(c.id, c.prompt_ids, c.completion_ids, c.session_id)
    return {
        "call_id": c.id,
        "session_id": c.session_id,
        "dialect": Dialect(c.dialect),
        "method": c.method,
        "path": c.path,
        "stream": c.stream,
        "status_code": c.status_code,
        "outcome": CallOutcome(c.outcome),
        "received_at": _epoch(c.received_at) or 0.0,
        "harness": c.harness,
        "model": c.model,
        "error": c.error,
        "usage": c.usage,
        "prompt_ids": prompt,
        "completion_ids": completion,
        "completion_logprobs": _floats(c.completion_logprobs),
        "finish_reason": c.finish_reason,
        "seq": c.seq,
        "policy_versions": policy.from_json(c.policy_versions),
        "routed_experts": None if c.routed_experts is None else bytes(c.routed_experts),
    }


def _light_record(c: Any, reader: Reader) -> CallRecord:
    """A record without bodies or timings: what reconstruction reads."""
    return CallRecord(**_columns(c, reader), first_byte_at=None, done_at=0.0, metadata=c.metadata or {})


def _record(c: Call, reader: Reader) -> CallRecord:
    cols = _columns(c, reader)
    return CallRecord(
        **cols,
        **reader.bodies(c, cols["prompt_ids"], cols["completion_ids"]),
        first_byte_at=_epoch(c.first_byte_at),
        done_at=_epoch(c.done_at) or 0.0,
        headers=c.headers or {},
        harness_session=c.harness_session,
        bytes_in=c.bytes_in,
        bytes_out=c.bytes_out,
        metadata=c.call_metadata or {},
    )
