"""Is the database fit to record into? Asked by ``serve`` before anything listens.

A database can open, carry the schema and still fail every write: a SQLite file whose pages
are damaged answers ``database disk image is malformed`` only when a write reaches them. Had
the proxy started on it, every batch would go to the spool and the log would say ``ready``.

:func:`check_writable` does, in a transaction it rolls back, what the writer does first (the
session upsert and a read of the calls table), and on SQLite runs ``PRAGMA quick_check`` as
well when the file is at most ``QUICK_CHECK_BYTES`` (it reads every page: about a second per
GB; larger files get the trial write only). Any problem is raised as SQLAlchemy's error.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from sqlalchemy import insert, select, text
from sqlalchemy.exc import DatabaseError

from orchard_rec.storage.models import Call, Session
from orchard_rec.storage.store import Store

__all__ = ["QUICK_CHECK_BYTES", "check_writable"]

QUICK_CHECK_BYTES = 1 << 30


def check_writable(store: Store) -> None:
    """Raise ``sqlalchemy.exc.DatabaseError`` when the database cannot take a write (module docstring)."""
    if store.dialect == "sqlite":
        path = store.engine.url.database
        if (
            path
            and path != ":memory:"
            and os.path.exists(path)
            and os.path.getsize(path) <= QUICK_CHECK_BYTES
        ):
            with store.engine.connect() as conn:
                rows = [r[0] for r in conn.execute(text("PRAGMA quick_check"))]
            if rows != ["ok"]:
                raise DatabaseError(
                    "PRAGMA quick_check", None, Exception(f"database disk image is malformed ({rows[0]})")
                )
    now = datetime.now(UTC)
    with store.engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.execute(select(Call.id).order_by(Call.received_at.desc()).limit(1)).all()
            conn.execute(select(Session.id).order_by(Session.updated_at.desc()).limit(1)).all()
            conn.execute(
                insert(Session).values(
                    id="orchard-rec-health-check", created_at=now, updated_at=now, call_count=0
                )
            )
        finally:
            trans.rollback()
