"""Durable storage of call records: SQLite by default, PostgreSQL for shared use.

Never imported on the proxy's response path except through the recorder's writer
thread; nothing here is async.
"""

from orchard_rec.storage.migrate import current, downgrade, upgrade
from orchard_rec.storage.models import Base, Call, Session
from orchard_rec.storage.store import SessionSummary, Store, default_db_url

__all__ = [
    "Base",
    "Call",
    "Session",
    "SessionSummary",
    "Store",
    "current",
    "default_db_url",
    "downgrade",
    "upgrade",
]
