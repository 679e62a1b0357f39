"""Durable storage of call records: SQLite by default, PostgreSQL for shared use.

Never imported on the proxy's response path except through the recorder's writer
thread; nothing here is async.

Owns every SQL statement and the database engine: ``Store`` (the record sink and source,
``seam.RecordSink`` / ``seam.RecordSource``), ``queries`` (the listings, aggregates and schema
checks the CLI and the viewer ask for), the models and the migrations' runner. No module outside
``storage/`` and ``migrations/`` builds a query or touches ``Store.engine`` (``tests/test_layering.py``).
Never imports ``proxy``, ``ui``, ``exporters``, ``pipeline`` or ``cli``: they are above it.
"""

from typing import TYPE_CHECKING, Any

from orchard_rec.storage.models import Base, Call, Session
from orchard_rec.storage.seam import RecordSink, RecordSource
from orchard_rec.storage.store import SessionSummary, Store, default_db_url

__all__ = [
    "Base",
    "Call",
    "RecordSink",
    "RecordSource",
    "Session",
    "SessionSummary",
    "Store",
    "current",
    "default_db_url",
    "downgrade",
    "upgrade",
]

if TYPE_CHECKING:
    from orchard_rec.storage.migrate import current, downgrade, upgrade


def __getattr__(name: str) -> Any:
    """``current``, ``downgrade``, ``upgrade``: Alembic is imported when a migration is asked for,
    not by every process that only reads or writes records (the database writer process)."""
    if name in ("current", "downgrade", "upgrade"):
        from orchard_rec.storage import migrate

        return getattr(migrate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
