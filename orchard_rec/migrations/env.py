"""Alembic environment: online migrations only, batch mode so SQLite can ALTER."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine

from orchard_rec.storage.models import Base

config = context.config
target_metadata = Base.metadata


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """The search index (``storage.search``: FTS5 and its shadow tables, or ``search_docs``) is
    created by its migration and kept out of the models: ``alembic check`` leaves it alone."""
    return not (type_ == "table" and (name or "").startswith("search_"))


def run_migrations_online() -> None:
    engine: Any = config.attributes.get("engine")
    owned = engine is None
    if owned:
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.begin() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=True,
                compare_type=True,
                include_name=include_name,
            )
            context.run_migrations()
    finally:
        if owned:
            engine.dispose()


if context.is_offline_mode():
    raise SystemExit("orchard-rec runs migrations online only: orchard-rec db upgrade --db URL")
run_migrations_online()
