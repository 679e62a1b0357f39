"""Policy versions: which weights sampled each call's completion, as spans
``[[version, start, end], ...]`` over its ``completion_ids`` (``orchard_rec.policy``).

And MoE routing replay: the experts the server routed each token to (``routed_experts``,
``orchard_rec.routing.pack``). In place: existing calls have neither (NULL). Downgrade drops them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("policy_versions", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("routed_experts", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("routed_experts")
        batch.drop_column("policy_versions")
