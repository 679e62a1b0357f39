"""The read queries that serve the CLI and the viewer: every SQL statement outside the
``Store`` class itself lives here, named by what it answers, so no caller outside ``storage/``
builds a query or reaches ``Store.engine``.

- Sessions: the viewer's filtered, sorted page (``session_page``, ``SessionQuery``), the CLI's
  newest-first listing (``newest_sessions``), the names seen (``harness_names``, ``model_names``),
  the counters the viewer polls (``sessions_stats``), whether search is indexed (``search_ready``).
- Task groups: the groups of an outcome-metadata key (``group_counts``) and one group's members
  (``group_members``).
- The dashboard: a window's calls and rewards (``dash_window``).
- The schema: its revision (``schema_revision``), a migration (``migrate_to``), a connection
  check (``ping``), whether the recording tables exist (``has_record_tables``), and the teacher
  results table on the same database (``teacher_store``).

Each function opens one connection, reads, and returns plain values; none writes records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import String, case, cast, exists, func, inspect, literal_column, select, text

from orchard_rec.storage import search
from orchard_rec.storage.models import Call, Session
from orchard_rec.storage.store import Store

if TYPE_CHECKING:
    from orchard_rec.teacher.store import TeacherStore

__all__ = [
    "DashWindow",
    "SessionQuery",
    "dash_window",
    "group_counts",
    "group_members",
    "harness_names",
    "has_record_tables",
    "meta_value",
    "migrate_to",
    "model_names",
    "newest_sessions",
    "ping",
    "reward_expr",
    "schema_revision",
    "search_ready",
    "session_page",
    "sessions_stats",
    "teacher_store",
]


def _ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _epoch(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


# -- the schema ------------------------------------------------------------------------------------------------


def schema_revision(store: Store) -> str | None:
    """The database's Alembic revision (None for an empty database); reads only."""
    from orchard_rec.storage import migrate

    return migrate.current(store.url, engine=store.engine)


def migrate_to(store: Store, revision: str = "head") -> str | None:
    """Migrate the schema to ``revision``; the revision it is at afterwards."""
    from orchard_rec.storage import migrate

    migrate.upgrade(store.url, revision, engine=store.engine)
    return migrate.current(store.url, engine=store.engine)


def ping(store: Store) -> None:
    """Open and close one connection (raises SQLAlchemy's error when the database is unreachable)."""
    with store.engine.connect():
        pass


def has_record_tables(store: Store) -> bool:
    """Whether the ``sessions`` and ``calls`` tables exist (an orchard-rec schema)."""
    return {"sessions", "calls"} <= set(inspect(store.engine).get_table_names())


def teacher_store(store: Store) -> TeacherStore:
    """The teacher log-probs table of the same database, over the store's connection pool."""
    from orchard_rec.teacher.store import TeacherStore

    return TeacherStore(store.engine)


# -- the CLI's session listing ---------------------------------------------------------------------------------


def newest_sessions(
    store: Store,
    *,
    limit: int | None,
    since: float | None = None,
    harness: str | None = None,
    status: list[str] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """The newest ``limit`` sessions (all with ``None``) matching the filters, newest first, as
    dicts of the ``sessions`` columns; and how many matched."""
    where = []
    if since is not None:
        where.append(Session.updated_at >= _ts(since))
    if harness:
        where.append(Session.harness == harness)
    if status:
        where.append(Session.status.in_(status))
    with store.engine.connect() as conn:
        total = int(conn.scalar(select(func.count()).select_from(Session).where(*where)) or 0)
        stmt = select(Session).where(*where).order_by(Session.updated_at.desc(), Session.id.desc())
        if limit:
            stmt = stmt.limit(limit)
        rows = [dict(r._mapping) for r in conn.execute(stmt.with_only_columns(*Session.__table__.c))]
    return rows, total


# -- the viewer's sessions table -------------------------------------------------------------------------------


@dataclass
class SessionQuery:
    """A filtered, sorted page of the sessions table (the viewer's ``SessionFilter`` is one)."""

    q: str = ""
    harness: str = ""
    status: str = ""
    reward_min: float | None = None
    reward_max: float | None = None
    since: float | None = None
    until: float | None = None
    model: str = ""
    errors: bool = False
    meta: list[str] = field(default_factory=list)
    """``key=value`` (the outcome metadata's ``key`` is ``value``, or a list holding it) or ``key`` (present)."""
    sort: str = "started"
    order: str = "desc"
    page: int = 1
    per_page: int = 50


def reward_expr(dialect: str) -> Any:
    """The session's reward when it is a number, else NULL."""
    if dialect == "postgresql":
        return literal_column(
            "CASE WHEN json_typeof(sessions.reward) = 'number' THEN (sessions.reward::text)::float8 END"
        )
    return literal_column("CASE WHEN typeof(sessions.reward) IN ('integer', 'real') THEN sessions.reward END")


def _duration_expr(dialect: str) -> Any:
    if dialect == "postgresql":
        return literal_column("EXTRACT(EPOCH FROM (sessions.updated_at - sessions.created_at))")
    return literal_column("((julianday(sessions.updated_at) - julianday(sessions.created_at)) * 86400.0)")


def _meta_cond(m: str, i: int, dialect: str) -> Any:
    """The outcome metadata's ``key`` equals ``value`` (as text), or is a list holding it; or,
    without ``=value``, is present."""
    key, eq, value = m.partition("=")
    key, value = key.strip(), value.strip()
    k, v = f"mk{i}", f"mv{i}"
    if dialect == "postgresql":
        node = f"(sessions.outcome_metadata -> CAST(:{k} AS text))"
        if not eq:
            return text(f"{node} IS NOT NULL").bindparams(**{k: key})
        sql = (
            f"CASE WHEN json_typeof({node}) = 'array' THEN EXISTS "
            f"(SELECT 1 FROM json_array_elements_text({node}) AS e(x) WHERE e.x = :{v}) "
            f"ELSE (sessions.outcome_metadata ->> CAST(:{k} AS text)) = :{v} END"
        )
        return text(f"({sql})").bindparams(**{k: key, v: value})
    path = "$." + '"' + key.replace('"', '""') + '"'
    if not eq:
        return text(f"json_type(sessions.outcome_metadata, :{k}) IS NOT NULL").bindparams(**{k: path})
    sql = (  # json_each of a scalar is that one value; of an array, its elements
        f"json_type(sessions.outcome_metadata, :{k}) != 'object' AND EXISTS "
        f"(SELECT 1 FROM json_each(sessions.outcome_metadata, :{k}) WHERE CAST(value AS TEXT) = :{v})"
    )
    return text(f"({sql})").bindparams(**{k: path, v: value})


_SEARCH_READY: dict[str, bool] = {}


def search_ready(store: Store) -> bool:
    """Whether the database has the conversation search index (migration 0009); cached per URL."""
    hit = _SEARCH_READY.get(store.url)
    if hit is None:
        with store.engine.connect() as conn:
            hit = _SEARCH_READY[store.url] = search.available(conn, store.dialect)
    return hit


def _where(f: SessionQuery, dialect: str, fts: bool = False) -> list[Any]:
    t = Session.__table__.c
    c = Call.__table__.c
    conds: list[Any] = []
    if f.q:
        like = f"%{f.q}%"
        cond = t.id.ilike(like) | t.harness.ilike(like)
        match = search.session_match(dialect, f.q) if fts else None
        if match is not None:  # ... or the words are in its conversation
            cond = cond | t.id.in_(match.columns(session_id=String))
        conds.append(cond)
    if f.harness:
        conds.append(t.harness.is_(None) if f.harness == "none" else t.harness == f.harness)
    if f.status:
        conds.append(t.status.is_(None) if f.status == "none" else t.status == f.status)
    reward = reward_expr(dialect)
    if f.reward_min is not None:
        conds.append(reward >= f.reward_min)
    if f.reward_max is not None:
        conds.append(reward <= f.reward_max)
    if f.model:
        conds.append(exists().where(c.session_id == t.id, c.model == f.model))
    if f.errors:
        conds.append(exists().where(c.session_id == t.id, (c.outcome != "ok") | c.error.is_not(None)))
    for i, m in enumerate(f.meta):
        conds.append(_meta_cond(m, i, dialect))
    if f.since is not None:
        conds.append(t.created_at >= _ts(f.since))
    if f.until is not None:
        conds.append(t.created_at <= _ts(f.until))
    return conds


def _sort_expr(sort: str, dialect: str) -> Any:
    t = Session.__table__.c
    return {
        "id": t.id,
        "harness": t.harness,
        "calls": t.call_count,
        "status": t.status,
        "reward": reward_expr(dialect),
        "started": t.created_at,
        "updated": t.updated_at,
        "duration": _duration_expr(dialect),
    }[sort]


def session_page(store: Store, f: SessionQuery) -> tuple[list[dict[str, Any]], int]:
    """One page of sessions, filtered, sorted and paginated in SQL, and how many matched.

    Rows hold ``id, harness, call_count, status, reward, created_at, updated_at`` (``created_at``
    / ``updated_at`` as epoch seconds). A page past the end is the last page (``f.page`` is set to it)."""
    dialect = store.dialect
    t = Session.__table__
    conds = _where(f, dialect, search_ready(store))
    key = _sort_expr(f.sort, dialect)
    ordering = key.asc() if f.order == "asc" else key.desc()
    stmt = (
        select(t.c.id, t.c.harness, t.c.call_count, t.c.status, t.c.reward, t.c.created_at, t.c.updated_at)
        .where(*conds)
        .order_by(
            ordering.nulls_last() if f.sort in ("harness", "status", "reward") else ordering,
            t.c.id.asc() if f.order == "asc" else t.c.id.desc(),
        )
        .limit(f.per_page)
        .offset((f.page - 1) * f.per_page)
    )
    count = select(func.count()).select_from(t).where(*conds)
    with store.engine.connect() as conn:
        total = int(conn.execute(count).scalar_one())
        last = max(1, -(-total // f.per_page))
        if f.page > last:  # past the end (a stale link, a hand-typed page): the last page
            f.page = last
            stmt = stmt.offset((last - 1) * f.per_page)
        rows = [
            {**r._mapping, "created_at": _epoch(r.created_at), "updated_at": _epoch(r.updated_at)}
            for r in conn.execute(stmt)
        ]
    return rows, total


def harness_names(store: Store) -> list[str]:
    """The harnesses seen in sessions, sorted (one scan of the sessions table)."""
    t = Session.__table__
    with store.engine.connect() as conn:
        return sorted(h for (h,) in conn.execute(select(t.c.harness).distinct()) if h)


def model_names(store: Store) -> list[str]:
    """The models seen in calls, sorted (one scan of the calls table)."""
    c = Call.__table__
    with store.engine.connect() as conn:
        return sorted(m for (m,) in conn.execute(select(c.c.model).distinct()) if m)


def sessions_stats(store: Store) -> dict[str, Any]:
    """What changes when something is recorded: sessions, calls, the last update (epoch seconds)."""
    t = Session.__table__
    with store.engine.connect() as conn:
        n, last, calls = conn.execute(
            select(func.count(), func.max(t.c.updated_at), func.coalesce(func.sum(t.c.call_count), 0))
        ).one()
    return {"count": int(n), "calls": int(calls or 0), "updated": _epoch(last) if last else None}


# -- task groups -----------------------------------------------------------------------------------------------


def meta_value(key: str) -> Any:
    """The SQL of ``outcome_metadata[key]`` as text (``json_extract`` / ``->>``), for grouping."""
    return cast(Session.__table__.c.outcome_metadata[key].as_string(), String)


def group_counts(store: Store, key: str, *, limit: int = 500) -> list[dict[str, Any]]:
    """The groups of ``key``: value, attempts, passing (positive numeric reward) attempts, mean
    numeric reward; largest first, then by value."""
    value = meta_value(key)
    reward = reward_expr(store.dialect)
    stmt = (
        select(
            value.label("value"),
            func.count().label("n"),
            func.sum(case((reward > 0, 1), else_=0)).label("pos"),
            func.avg(reward).label("mean"),
        )
        .where(value.is_not(None))
        .group_by(value)
        .order_by(func.count().desc(), value)
        .limit(limit)
    )
    with store.engine.connect() as conn:
        return [
            {"value": r.value, "attempts": int(r.n), "passed": int(r.pos or 0), "mean": r.mean}
            for r in conn.execute(stmt)
        ]


def group_members(store: Store, key: str, value: str) -> list[str]:
    """The ids of the sessions whose ``outcome_metadata[key]`` is ``value``, oldest first."""
    t = Session.__table__
    stmt = select(t.c.id).where(meta_value(key) == value).order_by(t.c.created_at, t.c.id)
    with store.engine.connect() as conn:
        return [r.id for r in conn.execute(stmt)]


# -- the dashboard ---------------------------------------------------------------------------------------------


@dataclass
class DashWindow:
    """A dashboard's window (epoch seconds), its calls' light columns (``received_at, done_at,
    harness, model, outcome, error, usage``: no bodies, no token ids) and its sessions' stored rewards."""

    since: float
    until: float
    calls: list[Any]
    rewards: list[Any]


def dash_window(
    store: Store,
    *,
    since: float | None,
    until: float | None,
    harness: str = "",
    model: str = "",
    span: float = 6 * 3600.0,
) -> DashWindow:
    """The window's calls and the rewards of the sessions updated in it. Without ``until``, the
    window ends a second after the last recorded call; without ``since``, it starts at the first
    call of the last ``span`` seconds before ``until``, floored to the minute."""
    c = Call.__table__.c
    with store.engine.connect() as conn:
        last = _epoch(conn.execute(select(func.max(c.received_at))).scalar())
        end = until if until is not None else (last or 0.0) + 1.0
        start = since
        if start is None:  # the data's own span, at most the last ``span`` seconds of it
            first = _epoch(
                conn.execute(select(func.min(c.received_at)).where(c.received_at >= _ts(end - span))).scalar()
            )
            start = 60.0 * math.floor((first if first is not None else end - span) / 60.0)
        stmt = select(c.received_at, c.done_at, c.harness, c.model, c.outcome, c.error, c.usage).where(
            c.received_at >= _ts(start), c.received_at < _ts(end)
        )
        if harness:
            stmt = stmt.where(c.harness == harness)
        if model:
            stmt = stmt.where(c.model == model)
        rows = list(conn.execute(stmt))
        s = Session.__table__.c
        rstmt = select(s.reward).where(s.outcome_at.is_not(None), s.updated_at >= _ts(start))
        if harness:
            rstmt = rstmt.where(s.harness == harness)
        rewards = [r for (r,) in conn.execute(rstmt)]
    return DashWindow(start, end, rows, rewards)
