"""Alembic, driven from code: the migrations ship inside the package.

``orchard-rec db upgrade`` and ``serve`` build an Alembic ``Config`` here, with
``script_location`` pointing at the installed ``orchard_rec/migrations``; no
``alembic.ini`` on disk is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

__all__ = ["alembic_config", "check", "current", "downgrade", "head", "known", "upgrade"]

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str, engine: Any = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def upgrade(url: str, revision: str = "head", engine: Any = None) -> None:
    command.upgrade(alembic_config(url, engine), revision)


def downgrade(url: str, revision: str, engine: Any = None) -> None:
    command.downgrade(alembic_config(url, engine), revision)


def check(url: str) -> None:
    """Raise if the models hold anything the migrations do not create (``alembic check``)."""
    command.check(alembic_config(url))


def current(url: str, engine: Any = None) -> str | None:
    """The database's revision (None: no schema). With ``engine`` (e.g. a read-only store's),
    nothing is created: without it, SQLite creates a missing file, as any connect does."""
    own = engine is None
    engine = engine if engine is not None else create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        if own:
            engine.dispose()


def head() -> str:
    return _scripts().get_current_head() or ""


def known(revision: str) -> bool:
    """A revision these migrations know (False: written by a newer orchard-rec)."""
    try:
        return _scripts().get_revision(revision) is not None
    except Exception:
        return False


def _scripts() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://"))
