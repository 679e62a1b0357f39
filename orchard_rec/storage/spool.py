"""The local spool: an append-only file of call records, fsync'd per batch.

It holds what the database has not (yet) got: in ``async`` durability, the batches a
failed write could not store; in ``wal`` durability, every batch, written before the
client's last byte is released and cleared once the database has committed it. Records
are replayed with ``Store.write_batch``, which is idempotent by call id, so a replay that
is interrupted and repeated stores each call exactly once. One process owns a spool file
(an exclusive ``flock``); the file survives ``kill -9`` and is replayed at the next start.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from orchard_rec.records import CallOutcome, CallRecord, Dialect

__all__ = ["Spool", "record_from_json", "record_to_json"]


def record_to_json(r: CallRecord) -> bytes:
    d: dict[str, Any] = {f: getattr(r, f) for f in r.__dataclass_fields__}
    d["dialect"] = r.dialect.value
    d["outcome"] = r.outcome.value
    d["headers"] = dict(r.headers)
    return orjson.dumps(d)


def record_from_json(line: bytes) -> CallRecord:
    d = orjson.loads(line)
    d["dialect"] = Dialect(d["dialect"])
    d["outcome"] = CallOutcome(d["outcome"])
    for k in ("prompt_ids", "completion_ids", "completion_logprobs"):
        if d.get(k) is not None:
            d[k] = tuple(d[k])
    return CallRecord(**d)


class Spool:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[bytes] = open(self.path, "ab+")  # noqa: SIM115 (held for the spool's lifetime)
        try:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.close()
            raise RuntimeError(
                f"spool {self.path} is in use by another proxy process; give each replica its own --spool"
            ) from None
        self.depth = sum(1 for _ in self._lines())
        """Records in the spool."""

    def _lines(self) -> Iterator[bytes]:
        self._f.seek(0)
        for line in self._f:
            if line.endswith(b"\n"):  # a torn last line (crash mid-append) was never acknowledged
                yield line

    def append(self, records: Sequence[CallRecord]) -> None:
        """Append and fsync: when this returns, the records survive a crash."""
        if not records:
            return
        self._f.seek(0, os.SEEK_END)
        self._f.write(b"".join(record_to_json(r) + b"\n" for r in records))
        self._f.flush()
        os.fsync(self._f.fileno())
        self.depth += len(records)

    def records(self) -> list[CallRecord]:
        out = []
        for line in self._lines():
            try:
                out.append(record_from_json(line))
            except (orjson.JSONDecodeError, TypeError, ValueError):
                continue
        return out

    def clear(self) -> None:
        self._f.truncate(0)
        self._f.flush()
        os.fsync(self._f.fileno())
        self.depth = 0

    def close(self) -> None:
        try:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)
        finally:
            self._f.close()
