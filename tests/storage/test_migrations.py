"""Alembic: the packaged migrations build exactly the models' schema, both ways, on both backends."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect

from orchard_rec.storage import migrate


def _tables(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        return set(inspect(eng).get_table_names())
    finally:
        eng.dispose()


def test_upgrade_from_empty_downgrade_and_upgrade_again(db_url: str) -> None:
    assert migrate.current(db_url) is None
    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    assert {"sessions", "calls", "alembic_version"} <= _tables(db_url)
    migrate.check(db_url)  # models and migrations agree (alembic check)

    migrate.downgrade(db_url, "base")
    assert migrate.current(db_url) is None
    assert not ({"sessions", "calls"} & _tables(db_url))

    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    migrate.check(db_url)


def test_migrations_ship_inside_the_package() -> None:
    import orchard_rec

    assert migrate.MIGRATIONS.parent == __import__("pathlib").Path(orchard_rec.__file__).parent
    assert (migrate.MIGRATIONS / "env.py").exists()
    assert list((migrate.MIGRATIONS / "versions").glob("0001_*.py"))
