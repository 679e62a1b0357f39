"""Images stored once (shared by every session, by SHA-256 of their bytes) and blobs with
parts: a blob may continue an earlier blob of its session (``base``, ``base_len``: growing
completions prompts) and have images cut out (``images``).

In place: the existing blobs stay whole texts (no base, no images), which the new readers
read as before; new writes use the parts. Downgrade writes every blob back as its whole text.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "images",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("mime", sa.String(128), nullable=True),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("height", sa.Integer(), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_images")),
    )
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(sa.Column("base", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("base_len", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("images", sa.LargeBinary(), nullable=True))


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
    )
    parted = sa.or_(blobs.c.base.is_not(None), blobs.c.images.is_not(None))
    sessions = [
        r[0]
        for r in conn.execute(
            sa.select(blobs.c.session_id).where(parted).distinct().order_by(blobs.c.session_id)
        )
    ]
    reader = Reader(conn)
    for sid in sessions:
        digests = [
            bytes(r[0])
            for r in conn.execute(sa.select(blobs.c.digest).where(blobs.c.session_id == sid, parted))
        ]
        texts = reader.blobs(sid, digests)
        for h in digests:
            conn.execute(
                blobs.update()
                .where(blobs.c.session_id == sid, blobs.c.digest == h)
                .values(data=texts[h].encode(), base=None, base_len=None, images=None)
            )
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("images")
        batch.drop_column("base_len")
        batch.drop_column("base")
    op.drop_table("images")
