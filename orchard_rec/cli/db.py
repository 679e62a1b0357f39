"""Database schema: ``db upgrade``, ``db current``."""

from __future__ import annotations

from pathlib import Path

import typer

from orchard_rec.cli.common import DbOpt, _db_error, _parse_db, _typer, open_write, usage_error

db_app = _typer(help="Database schema (Alembic migrations shipped in the package).")


# -- db ------------------------------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(
    db: str = DbOpt,
    revision: str = typer.Option(
        "head", "--revision", help="The schema revision to migrate to (default: the newest)."
    ),
) -> None:
    """Create or migrate the database schema."""
    from orchard_rec.storage import migrate, queries

    if revision != "head" and not migrate.known(revision):
        raise usage_error(f"--revision {revision!r} is not one of this orchard-rec's migrations")
    store = open_write(db, migrate_schema=False)
    try:
        rev = queries.migrate_to(store, revision)
    finally:
        store.close()
    typer.echo(f"{db}: at revision {rev}")


@db_app.command("current")
def db_current(db: str = DbOpt) -> None:
    """Show the database's schema revision (read-only: a missing database is not created)."""
    from sqlalchemy import exc as sa_exc

    from orchard_rec.storage import migrate, queries
    from orchard_rec.storage.store import Store

    url = _parse_db(db)
    if url.get_backend_name() == "sqlite" and not Path(url.database).is_file():
        typer.echo(f"empty (no database at {url.database}; head {migrate.head()})")
        return
    store = Store(db, readonly=True)
    try:
        rev = queries.schema_revision(store)
    except sa_exc.SQLAlchemyError as exc:
        raise _db_error(exc, url) from None
    finally:
        store.close()
    typer.echo(f"{rev or 'empty'} (head {migrate.head()})")
