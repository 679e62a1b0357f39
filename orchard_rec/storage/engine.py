"""The store's engine set-up: JSON columns through orjson, SQLite connections (WAL and foreign
keys for a writer; ``mode=ro``, else ``immutable=1``, for a reader), and the schema probe a writer
on an older schema uses. Moved out of ``storage/store.py``.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

__all__: list[str] = []


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def _loads(v: Any) -> Any:
    # SQLite gives a JSON column numeric affinity: a stored bare number comes back as int/float.
    return orjson.loads(v) if isinstance(v, (str, bytes, bytearray, memoryview)) else v


def _sqlite_readonly_creator(url: str) -> Any:
    """Connections opened with ``mode=ro``; ``immutable=1`` when that cannot read (a WAL database
    in a read-only folder whose ``-shm`` cannot be created: then nobody can be writing it)."""
    import sqlite3
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    path = make_url(url).database or ""
    uri = f"file:{quote(path)}"

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False, timeout=30)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return conn
        except sqlite3.OperationalError:
            conn.close()
            if not os.path.exists(path):
                raise
        return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, check_same_thread=False, timeout=30)

    return connect


def _has_column(conn: Any, table: str, column: str) -> bool:
    """Whether the database's ``table`` has ``column`` (a writer on an older schema, in tests of
    the migrations, leaves out the columns it lacks)."""
    from sqlalchemy import inspect

    return column in {c["name"] for c in inspect(conn).get_columns(table)}


def _sqlite_readonly_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA query_only=ON")
    cur.close()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class Direct:
    """The writer's SQLite statements straight to the driver's cursor on ``conn``'s connection (a
    SQLAlchemy ``Connection`` in a transaction): what ``Connection.exec_driver_sql`` would run, in
    the same transaction, without its per-statement work (an execution context, a result object,
    the events: ~40 us a statement, more than SQLite's own for most of the writer's statements,
    bench/PROFILE.md round 8). Answers what the writer asks of a result: ``scalar``,
    ``scalar_one``, ``lastrowid``. A driver error is raised as SQLAlchemy raises it
    (``sqlalchemy.exc.DBAPIError.instance``: ``OperationalError``, ``IntegrityError``, ...)."""

    __slots__ = ("_cur", "_dialect", "_error")

    def __init__(self, conn: Any) -> None:
        raw = conn.connection.driver_connection
        self._cur = raw.cursor()
        self._dialect = conn.dialect
        self._error: type[Exception] = conn.dialect.loaded_dbapi.Error

    def exec_driver_sql(self, sql: str, params: Any = ()) -> Direct:
        """``params``: a tuple (one execution) or a list of tuples (``executemany``)."""
        try:
            if isinstance(params, list):
                self._cur.executemany(sql, params)
            else:
                self._cur.execute(sql, params)
        except self._error as exc:
            from sqlalchemy.exc import DBAPIError

            raise DBAPIError.instance(sql, params, exc, self._error, dialect=self._dialect) from exc
        return self

    def scalar(self) -> Any:
        row = self._cur.fetchone()
        return None if row is None else row[0]

    def scalar_one(self) -> Any:
        rows = self._cur.fetchall()
        if len(rows) != 1:
            from sqlalchemy.exc import MultipleResultsFound, NoResultFound

            raise (NoResultFound if not rows else MultipleResultsFound)(f"{len(rows)} rows, one expected")
        return rows[0][0]

    @property
    def lastrowid(self) -> int:
        return int(self._cur.lastrowid)

    def close(self) -> None:
        self._cur.close()


def runs(n: int, cap: int) -> list[tuple[int, int]]:
    """``(start, size)`` pieces of ``n`` rows for multi-row statements: ``cap``-sized ones, then the
    rest by powers of two (37 -> 32, 4, 1), so that a writer's batches of any size use a few
    statements the driver has prepared already (its cache holds 128; one per size would thrash)."""
    out: list[tuple[int, int]] = []
    at = 0
    while n - at >= cap:
        out.append((at, cap))
        at += cap
    size = 1 << max(0, cap.bit_length() - 1)
    while at < n:
        if n - at >= size:
            out.append((at, size))
            at += size
        size >>= 1
    return out
