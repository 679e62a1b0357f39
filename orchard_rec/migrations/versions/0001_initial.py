"""Initial schema: sessions and calls.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("call_count", sa.BigInteger(), nullable=False),
        sa.Column("harness", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_table(
        "calls",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("dialect", sa.String(16), nullable=False),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_byte_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("harness", sa.String(64), nullable=True),
        sa.Column("harness_session", sa.String(256), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("headers", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("request", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("upstream_request", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("response", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("events", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("usage", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("prompt_ids", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("completion_ids", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("completion_logprobs", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("bytes_in", sa.BigInteger(), nullable=False),
        sa.Column("bytes_out", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"], name=op.f("fk_calls_session_id_sessions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calls")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_calls_session_id")),
    )
    op.create_index("ix_calls_received_at", "calls", ["received_at"])
    op.create_index(op.f("ix_calls_session_id"), "calls", ["session_id"])
    op.create_index(op.f("ix_calls_harness_session"), "calls", ["harness_session"])


def downgrade() -> None:
    op.drop_index(op.f("ix_calls_harness_session"), table_name="calls")
    op.drop_index(op.f("ix_calls_session_id"), table_name="calls")
    op.drop_index("ix_calls_received_at", table_name="calls")
    op.drop_table("calls")
    op.drop_table("sessions")
