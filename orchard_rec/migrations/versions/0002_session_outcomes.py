"""Session outcomes: reward, status, step values and metadata posted after a run.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("reward", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("status", sa.String(16), nullable=True))
        batch.add_column(sa.Column("step_values", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("outcome_metadata", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("outcome_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("outcome_at")
        batch.drop_column("outcome_metadata")
        batch.drop_column("step_values")
        batch.drop_column("status")
        batch.drop_column("reward")
