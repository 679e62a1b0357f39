"""The SQL schema: typed SQLAlchemy 2.0 models, one ``Base`` with a naming convention.

Alembic migrations in ``orchard_rec/migrations`` create exactly this schema; a test
runs ``alembic check`` against it on SQLite and PostgreSQL, so the two cannot drift.
JSON columns use the plain ``JSON`` type on every backend (not PostgreSQL ``JSONB``):
it keeps the recorded text as it was, key order included.

A call stores only what is new relative to what its session already holds
(``orchard_rec.storage.layout``): token ids as int32 deltas on an earlier call's ids, the
request as literal text around references to ``blobs`` (messages and tool lists, stored
once per session by content digest), the upstream request as a recipe on the request.
Images in requests are cut out of the blobs and stored once in ``images``, shared by every
session, by the SHA-256 of their bytes.
``Store`` reads hide this: records come back whole.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "Blob", "Call", "Image", "Session", "TeacherLogprobs"]

Json = Annotated[Any, mapped_column(JSON(none_as_null=True), nullable=True)]
Bytes = Annotated[bytes | None, mapped_column(LargeBinary, nullable=True)]
Timestamp = Annotated[datetime, mapped_column(DateTime(timezone=True))]


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Session(Base):
    """One agent session: the calls that share a session id, and their outcome."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_created_at", "created_at"),
        Index("ix_sessions_updated_at", "updated_at"),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[Timestamp]
    updated_at: Mapped[Timestamp]
    call_count: Mapped[int] = mapped_column(BigInteger, default=0)
    """Calls recorded so far; also the counter that hands out gap-free sequence numbers."""
    harness: Mapped[str | None] = mapped_column(String(64))
    reward: Mapped[Json]
    """A number or an object of named rewards, from ``POST /sessions/{id}/outcome``."""
    status: Mapped[str | None] = mapped_column(String(16))
    """completed | truncated | aborted | failed, as the harness or grader reported it."""
    step_values: Mapped[Json]
    """One value per model turn (value-based credit assignment)."""
    outcome_metadata: Mapped[Json]
    outcome_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Call(Base):
    """One recorded call (see ``orchard_rec.records.CallRecord`` for each field's meaning)."""

    __tablename__ = "calls"
    __table_args__ = (
        UniqueConstraint("session_id", "seq"),
        Index("ix_calls_received_at", "received_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id"), index=True)
    seq: Mapped[int | None] = mapped_column(BigInteger)
    """1-based position in the session, assigned by the database writer in completion order."""
    dialect: Mapped[str] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(Text)
    stream: Mapped[bool]
    status_code: Mapped[int | None]
    outcome: Mapped[str] = mapped_column(String(16))
    received_at: Mapped[Timestamp]
    first_byte_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    done_at: Mapped[Timestamp]
    harness: Mapped[str | None] = mapped_column(String(64))
    harness_session: Mapped[str | None] = mapped_column(String(256), index=True)
    model: Mapped[str | None] = mapped_column(String(256))
    headers: Mapped[Json]
    request_skel: Mapped[Bytes]
    """The request text between its blobs: zstd of the JSON list of literal pieces."""
    request_refs: Mapped[Bytes]
    """Delta array of 16-byte blob digests (``layout.pack_delta``), on an earlier call's."""
    upstream: Mapped[Json]
    """How to rebuild the body sent upstream from the request (``layout.derive_upstream``)."""
    upstream_refs: Mapped[Bytes]
    """Delta array of blob digests of the upstream's own (translated) messages."""
    response: Mapped[Json]
    """As the client received it, without the ids ``response_ids`` says to put back."""
    response_ids: Mapped[Json]
    events: Mapped[Bytes]
    """zstd of the JSON event list, as the client received it."""
    error: Mapped[str | None] = mapped_column(Text)
    usage: Mapped[Json]
    prompt_ids: Mapped[Bytes]
    """Delta array of int32 ids on an earlier call's prompt + completion."""
    completion_ids: Mapped[Bytes]
    """int32 ids."""
    completion_logprobs: Mapped[Bytes]
    """``f`` + float32 (or ``d`` + float64 when float32 would change them)."""
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    bytes_in: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_out: Mapped[int] = mapped_column(BigInteger, default=0)
    call_metadata: Mapped[Json] = mapped_column("metadata", JSON(none_as_null=True), nullable=True)
    """What the proxy decided about the call (token-in/token-out branch, ...)."""
    policy_versions: Mapped[Json]
    """Which weights sampled the completion: ``[[version, start, end], ...]`` over
    ``completion_ids`` (``orchard_rec.policy``); None when the proxy knew no version."""
    routed_experts: Mapped[Bytes]
    """MoE routing (``--routed-experts``): ``orchard_rec.routing.pack``, uint8/uint16 zstd."""


class Blob(Base):
    """A piece of request text (a message, a tool list ...) stored once per session, by digest."""

    __tablename__ = "blobs"

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    """The session's id; ``""`` for calls without one."""
    digest: Mapped[bytes] = mapped_column(LargeBinary(16), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    """UTF-8 text: the whole piece, or (with ``base``) what follows the base's first ``base_len``
    characters; without the images ``images`` lists."""
    base: Mapped[Bytes]
    """Digest of the session's blob this one continues (a growing completions prompt), or None."""
    base_len: Mapped[int | None] = mapped_column(BigInteger)
    """Characters of ``base``'s text that come first."""
    base_call: Mapped[str | None] = mapped_column(String(32))
    """A completions prompt that goes on with this call's completion after ``base``'s first
    ``base_len`` characters (then ``data``): the completion is not stored twice."""
    base_style: Mapped[int | None]
    """How the prompt writes that completion (``layout.continuation``)."""
    images: Mapped[Bytes]
    """Where images were cut out of ``data``: (u32 character offset, 32-byte SHA-256) each
    (``layout.pack_holes``); their base64 text goes back there."""


class Image(Base):
    """An image of a request (its bytes, not base64), stored once for every session by SHA-256."""

    __tablename__ = "images"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 (hex) of ``data``: ``protocol.images.ImageRef.digest``."""
    mime: Mapped[str | None] = mapped_column(String(128))
    width: Mapped[int | None]
    height: Mapped[int | None]
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class TeacherLogprobs(Base):
    """A teacher's log-probs over one reconstructed sample (``orchard-rec teacher``).

    Keyed by sample identity: the session and the sample's first call id, with a hash of its
    token ids and response length; a re-run skips what matches and redoes what changed.
    Arrays are little-endian packed bytes: ``log_probs`` float32 and ``valid_mask`` uint8
    (len = response_length), ``topk_ids`` int32 and ``topk_logprobs`` float32
    (response_length x top_k, row-major, padded with id -1 / 0.0 where fewer came back).
    """

    __tablename__ = "teacher_logprobs"

    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    sample_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(32))
    teacher: Mapped[str] = mapped_column(Text)
    """The teacher's model name (as its server reports it) or the name given with --name."""
    response_length: Mapped[int] = mapped_column(BigInteger)
    top_k: Mapped[int] = mapped_column(BigInteger)
    failed: Mapped[bool]
    log_probs: Mapped[bytes] = mapped_column(LargeBinary)
    valid_mask: Mapped[bytes] = mapped_column(LargeBinary)
    topk_ids: Mapped[Bytes]
    topk_logprobs: Mapped[Bytes]
    created_at: Mapped[Timestamp]
