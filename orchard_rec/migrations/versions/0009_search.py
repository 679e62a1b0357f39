"""Full-text search inside conversations (``orchard_rec.storage.search``).

SQLite: an FTS5 index without content (``search_fts``, rowid = the call's rowid). PostgreSQL:
``search_docs`` (call id, session id, ``tsvector`` of the ``simple`` configuration) with a GIN
index. Not in the ORM models (``env.py`` leaves ``search_*`` out of ``alembic check``): only
``storage.search`` reads and writes them. Calls recorded before are indexed here, per session.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from orchard_rec.storage import search

    conn = op.get_bind()
    dialect = conn.dialect.name
    if dialect == "sqlite":
        op.execute(
            f"CREATE VIRTUAL TABLE {search.SQLITE_TABLE} USING fts5(body, content='', "
            "tokenize='unicode61 remove_diacritics 2')"
        )
    else:
        op.execute(
            f"CREATE TABLE {search.PG_TABLE} (call_id VARCHAR(32) PRIMARY KEY, "
            "session_id VARCHAR(128) NOT NULL, tsv TSVECTOR NOT NULL)"
        )
        op.execute(f"CREATE INDEX ix_{search.PG_TABLE}_tsv ON {search.PG_TABLE} USING GIN (tsv)")
        op.execute(f"CREATE INDEX ix_{search.PG_TABLE}_session_id ON {search.PG_TABLE} (session_id)")
    search.backfill(conn, dialect)


def downgrade() -> None:
    from orchard_rec.storage import search

    conn = op.get_bind()
    op.execute(f"DROP TABLE {search.SQLITE_TABLE if conn.dialect.name == 'sqlite' else search.PG_TABLE}")
