"""Teacher log-probs per reconstructed sample (on-policy distillation), and indexes on the
sessions' times (the viewer and `sessions` sort and page by them).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sessions_created_at", "sessions", ["created_at"])
    op.create_index("ix_sessions_updated_at", "sessions", ["updated_at"])
    op.create_table(
        "teacher_logprobs",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("sample_key", sa.String(64), nullable=False),
        sa.Column("content_hash", sa.String(32), nullable=False),
        sa.Column("teacher", sa.Text(), nullable=False),
        sa.Column("response_length", sa.BigInteger(), nullable=False),
        sa.Column("top_k", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.Boolean(), nullable=False),
        sa.Column("log_probs", sa.LargeBinary(), nullable=False),
        sa.Column("valid_mask", sa.LargeBinary(), nullable=False),
        sa.Column("topk_ids", sa.LargeBinary(), nullable=True),
        sa.Column("topk_logprobs", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "sample_key", name=op.f("pk_teacher_logprobs")),
    )


def downgrade() -> None:
    op.drop_table("teacher_logprobs")
    op.drop_index("ix_sessions_updated_at", table_name="sessions")
    op.drop_index("ix_sessions_created_at", table_name="sessions")
