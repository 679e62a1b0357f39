"""Images stored once (shared by every session, by SHA-256 of their bytes) and blobs with
parts: a blob may continue an earlier blob of its session (``base``, ``base_len``: growing
completions prompts) and have images cut out (``images``).

In place: the images in existing blobs are cut out into ``images`` exactly as the writer
cuts them (``Encoder.blob_rows``), so an existing database shrinks and its image sessions
are recognised; the blobs stay whole otherwise (no base). Downgrade writes every blob back
as its whole text.

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
    _cut_existing_images()


def _cut_existing_images() -> None:
    from orchard_rec.storage.delta import Encoder, SessionState

    conn = op.get_bind()
    blobs = sa.table(
        "blobs",
        sa.column("session_id", sa.String()),
        sa.column("digest", sa.LargeBinary()),
        sa.column("data", sa.LargeBinary()),
        sa.column("images", sa.LargeBinary()),
    )
    images = sa.table(
        "images",
        sa.column("digest", sa.String()),
        sa.column("mime", sa.String()),
        sa.column("width", sa.Integer()),
        sa.column("height", sa.Integer()),
        sa.column("size", sa.BigInteger()),
        sa.column("data", sa.LargeBinary()),
    )
    encoder = Encoder()
    stored: set[str] = set()
    after: tuple[str, bytes] | None = None
    while True:  # keyset pages: memory is one page
        stmt = sa.select(blobs.c.session_id, blobs.c.digest, blobs.c.data).order_by(
            blobs.c.session_id, blobs.c.digest
        )
        if after is not None:
            stmt = stmt.where(sa.tuple_(blobs.c.session_id, blobs.c.digest) > sa.tuple_(*after))
        page = conn.execute(stmt.limit(200)).all()
        if not page:
            break
        after = (page[-1][0], bytes(page[-1][1]))
        for sid, h, data in page:
            raw = bytes(data)
            if b"base64" not in raw:
                continue
            [(_, own, _, _, holes, *_)], found = encoder.blob_rows(
                SessionState(), {bytes(h): raw.decode("utf-8")}
            )
            if holes is None:
                continue
            for d, ref in found.items():
                if d not in stored and ref.data is not None:
                    if conn.execute(sa.select(images.c.digest).where(images.c.digest == d)).first() is None:
                        w, hh = ref.width, ref.height
                        conn.execute(
                            images.insert().values(
                                digest=d,
                                mime=ref.mime if ref.mime is None or len(ref.mime) <= 128 else None,
                                width=w if w is not None and 0 <= w < 2**31 else None,
                                height=hh if hh is not None and 0 <= hh < 2**31 else None,
                                size=len(ref.data),
                                data=ref.data,
                            )
                        )
                    stored.add(d)
            conn.execute(
                blobs.update()
                .where(blobs.c.session_id == sid, blobs.c.digest == bytes(h))
                .values(data=own, images=holes)
            )


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
    reader = Reader(conn, continuations=False)  # the 0006 schema
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
