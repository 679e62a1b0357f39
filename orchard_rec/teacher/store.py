"""The teacher results table: save and read per-sample teacher log-probs."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, inspect, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session as OrmSession

from orchard_rec.reconstruct.sample import TeacherData
from orchard_rec.storage.models import TeacherLogprobs
from orchard_rec.teacher.run import SampleRef
from orchard_rec.teacher.wire import TeacherResult

__all__ = ["TeacherRecord", "TeacherStore"]


class TeacherRecord(dict[str, Any]):
    """``teacher_log_probs`` (float32 list), ``teacher_valid_mask``, optional
    ``teacher_topk_ids`` / ``teacher_topk_logprobs``, ``teacher`` (name), ``content_hash``."""


_LITTLE = sys.byteorder == "little"


def _pack(code: str, values: Iterable[Any]) -> bytes:
    a = array(code, values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _unpack(code: str, raw: bytes) -> list[Any]:
    a = array(code)
    a.frombytes(raw)
    if not _LITTLE:
        a.byteswap()
    return a.tolist()


def _pack_topk(rows: list[list[Any]] | None, k: int, code: str, pad: Any) -> bytes | None:
    """``len(rows) × k``, row-major, each row padded with ``pad``."""
    if rows is None or not k:
        return None
    flat: list[Any] = []
    for r in rows:
        r = list(r[:k])
        flat.extend(r + [pad] * (k - len(r)))
    return _pack(code, flat)


class TeacherStore:
    """Read and write ``teacher_logprobs`` rows (the schema is migrated by ``Store.upgrade``)."""

    def __init__(self, url: str | Engine) -> None:
        self.engine = url if isinstance(url, Engine) else create_engine(url)

    def close(self) -> None:
        self.engine.dispose()

    def has_table(self) -> bool:
        return inspect(self.engine).has_table(TeacherLogprobs.__tablename__)

    def has_rows(self) -> bool:
        """Whether any teacher log-probs are stored (an export that may train with them)."""
        if not self.has_table():
            return False
        with OrmSession(self.engine) as db:
            return db.scalars(select(TeacherLogprobs.session_id).limit(1)).first() is not None

    def lookup(self, sample: Any) -> TeacherData | None:
        """The stored teacher data of a reconstructed sample, when it was scored on these exact ids."""
        from orchard_rec.teacher.run import content_hash

        rec = self.get(
            sample.session_id, sample.sample_key, content_hash(sample.tokens, sample.response_length)
        )
        if rec is None or rec["failed"]:
            return (
                None
                if rec is None
                else TeacherData(rec["teacher_log_probs"], rec["teacher_valid_mask"], rec["teacher"])
            )
        return TeacherData(
            rec["teacher_log_probs"],
            rec["teacher_valid_mask"],
            rec["teacher"],
            rec.get("teacher_topk_ids"),
            rec.get("teacher_topk_logprobs"),
        )

    def stored_hash(self, session_id: str, sample_key: str) -> tuple[str, bool] | None:
        with OrmSession(self.engine) as db:
            row = db.get(TeacherLogprobs, (session_id, sample_key))
            return None if row is None else (row.content_hash, bool(row.failed))

    def save(self, ref: SampleRef, result: TeacherResult, *, failed: bool, teacher: str, top_k: int) -> None:
        values = {
            "content_hash": ref.content_hash,
            "teacher": teacher,
            "response_length": ref.response_length,
            "top_k": top_k,
            "failed": failed,
            "log_probs": _pack("f", result.log_probs),
            "valid_mask": bytes(result.valid_mask),
            "topk_ids": _pack_topk(result.topk_ids, top_k, "i", -1),
            "topk_logprobs": _pack_topk(result.topk_logprobs, top_k, "f", 0.0),
            "created_at": datetime.now(UTC),
        }
        with OrmSession(self.engine) as db, db.begin():
            row = db.get(TeacherLogprobs, (ref.session_id, ref.sample_key))
            if row is None:
                db.add(TeacherLogprobs(session_id=ref.session_id, sample_key=ref.sample_key, **values))
            else:
                for k, v in values.items():
                    setattr(row, k, v)

    def get(self, session_id: str, sample_key: str, content_hash: str | None = None) -> TeacherRecord | None:
        """The stored teacher data of a sample; None when absent or stored for other content."""
        with OrmSession(self.engine) as db:
            row = db.get(TeacherLogprobs, (session_id, sample_key))
            if row is None or (content_hash is not None and row.content_hash != content_hash):
                return None
            return _record(row)

    def iter_session(self, session_ids: Iterable[str]) -> Iterator[TeacherRecord]:
        with OrmSession(self.engine) as db:
            for row in db.scalars(
                select(TeacherLogprobs).where(TeacherLogprobs.session_id.in_(list(session_ids)))
            ):
                yield _record(row)


def _record(row: TeacherLogprobs) -> TeacherRecord:
    n = int(row.response_length)
    rec = TeacherRecord(
        session_id=row.session_id,
        sample_key=row.sample_key,
        content_hash=row.content_hash,
        teacher=row.teacher,
        failed=bool(row.failed),
        teacher_log_probs=_unpack("f", row.log_probs),
        teacher_valid_mask=list(row.valid_mask),
    )
    if row.top_k and row.topk_ids is not None and row.topk_logprobs is not None:
        k = int(row.top_k)
        ids = _unpack("i", row.topk_ids)
        lps = _unpack("f", row.topk_logprobs)
        rec["teacher_topk_ids"] = [[x for x in ids[i * k : (i + 1) * k] if x >= 0] for i in range(n)]
        rec["teacher_topk_logprobs"] = [
            [v for v, x in zip(lps[i * k : (i + 1) * k], ids[i * k : (i + 1) * k]) if x >= 0]
            for i in range(n)
        ]
    return rec
