"""Completions prompts that go on with the previous call's completion: a blob may name the call
whose completion follows its base (``base_call``) and how the prompt writes it (``base_style``).

In place: existing blobs have neither (unchanged meaning). Downgrade writes the completion
back into each such blob's own text (a plain delta on its base).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(sa.Column("base_call", sa.String(32), nullable=True))
        batch.add_column(sa.Column("base_style", sa.Integer(), nullable=True))


def downgrade() -> None:
    from orchard_rec.storage.delta import Reader

    conn = op.get_bind()
    blobs = sa.table(
        "blobs",
        sa.column("session_id", sa.String()),
        sa.column("digest", sa.LargeBinary()),
        sa.column("data", sa.LargeBinary()),
        sa.column("base", sa.LargeBinary()),
        sa.column("base_len", sa.BigInteger()),
        sa.column("images", sa.LargeBinary()),
        sa.column("base_call", sa.String()),
        sa.column("base_style", sa.Integer()),
    )
    rows = conn.execute(
        sa.select(blobs.c.session_id, blobs.c.digest, blobs.c.base_len)
        .where(blobs.c.base_call.is_not(None))
        .order_by(blobs.c.session_id)
    ).all()
    reader = Reader(conn)
    for sid, h, n in rows:  # the whole text, then what follows the base's first n characters, images included
        text = reader.blobs(sid, [bytes(h)])[bytes(h)]
        conn.execute(
            blobs.update()
            .where(blobs.c.session_id == sid, blobs.c.digest == bytes(h))
            .values(data=text[n:].encode(), images=None, base_call=None, base_style=None)
        )
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("base_style")
        batch.drop_column("base_call")
