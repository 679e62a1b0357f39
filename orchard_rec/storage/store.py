"""The database behind the proxy: engine set-up, batched writes, and reads.

Writes come only from ``write_batch`` (called by the recorder's writer thread, never
on the event loop). Sequence numbers are handed out by the database itself: one
``INSERT .. ON CONFLICT DO UPDATE SET call_count = call_count + n RETURNING`` per
session and batch takes the session row's lock until commit, so several writers
(threads or proxy replicas on one PostgreSQL) never hand out the same number and
never leave a gap. ``write_batch`` is idempotent by call id: a record already stored
is skipped, so replaying a batch after a failure stores each call exactly once.

Sequence numbers follow commit order. With several replicas, a call can commit before
an earlier call of the same session still queued in another replica, so readers that
need causal order (reconstruction) sort a session by ``received_at``: a call that
follows another's answer was received after it.

Each call is stored as what is new relative to its session (``storage.delta``,
``storage.layout``); every read returns whole records: the request exactly as the client
sent it, the response as the client received it, the ids, the upstream request. Images in
requests are stored once in ``images`` (shared by all sessions; ``image`` reads one back):
a new image is inserted only if absent (``ON CONFLICT DO NOTHING``, in digest order, so
concurrent writers on PostgreSQL neither fail nor deadlock on the same screenshot).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain, compress
from operator import itemgetter
from typing import Any

from sqlalchemy import JSON, DateTime, bindparam, create_engine, event, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from orchard_rec.dialects.images import ImageRef
from orchard_rec.records import (
    SESSION_ID_RULE,
    CallRecord,
    Outcome,
    session_id_problem,
)
from orchard_rec.settings import Settings
from orchard_rec.storage import layout, search
from orchard_rec.storage.delta import Encoder, Reader, SessionState
from orchard_rec.storage.engine import (
    Direct,
    _dumps,
    _has_column,
    _loads,
    _sqlite_pragmas,
    _sqlite_readonly_creator,
    _sqlite_readonly_pragmas,
    runs,
)
from orchard_rec.storage.models import Blob, Call, Image, Session
from orchard_rec.storage.outcome import InvalidOutcome, OutcomeChange, sanitize
from orchard_rec.storage.outcome import check as check_outcome
from orchard_rec.storage.outcome import merge as merge_outcome
from orchard_rec.storage.rows import (
    _LIGHT_COLUMNS,
    _dim,
    _epoch,
    _light_record,
    _mime,
    _record,
    _row,
    _sqlite_epoch,
    _sqlite_time,
    _ts,
)

__all__ = ["SessionSummary", "Store", "default_db_url"]


_NULLS: dict[int, tuple[None, ...]] = {}


def _nulls(n: int) -> tuple[None, ...]:
    """``(None,) * n``, made once per size (a column of a statement's rows is NULL in all if it
    equals it)."""
    t = _NULLS.get(n)
    if t is None:
        t = _NULLS[n] = (None,) * n
    return t


def default_db_url() -> str:
    return "sqlite:///./orchard.db"


@dataclass(frozen=True, slots=True)
class SessionSummary:
    id: str
    call_count: int
    harness: str | None
    created_at: float
    updated_at: float
    outcome: Outcome | None = None


_SESSION_COLUMNS = (
    "id",
    "call_count",
    "harness",
    "created_at",
    "updated_at",
    "reward",
    "status",
    "step_values",
    "outcome_metadata",
    "outcome_at",
)


def _summary_of_row(row: Any) -> SessionSummary:
    """From the ``s_``-labelled session columns of a joined row (no ORM object: this runs once
    per session on the export path)."""
    return _summary(row, "s_")


def _summary(s: Any, prefix: str = "") -> SessionSummary:
    def get(name: str) -> Any:
        return getattr(s, prefix + name)

    outcome = None
    if get("outcome_at") is not None:
        reward, steps, meta = sanitize(get("id"), get("reward"), get("step_values"), get("outcome_metadata"))
        outcome = Outcome(reward=reward, status=get("status"), step_values=steps, metadata=meta)
    return SessionSummary(
        get("id"),
        get("call_count"),
        get("harness"),
        _epoch(get("created_at")) or 0.0,
        _epoch(get("updated_at")) or 0.0,
        outcome,
    )


class Store:
    """One database, SQLite or PostgreSQL, by SQLAlchemy URL."""

    def __init__(self, url: str, *, echo: bool = False, readonly: bool = False) -> None:
        """``readonly``: for commands that only read. Nothing is created (a missing SQLite file
        fails instead of appearing empty), no PRAGMA that writes runs (``journal_mode=WAL``
        would fail in a read-only folder), and PostgreSQL transactions are read-only."""
        self.url = url
        self.readonly = readonly
        kwargs: dict[str, Any] = {
            "echo": echo,
            "json_serializer": _dumps,
            "json_deserializer": _loads,
        }
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            if readonly:
                kwargs["creator"] = _sqlite_readonly_creator(url)
        else:
            kwargs["pool_pre_ping"] = True
            if readonly and url.startswith("postgresql"):
                kwargs["connect_args"] = {"options": "-c default_transaction_read_only=on"}
        self.engine: Engine = create_engine(url, **kwargs)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_readonly_pragmas if readonly else _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._insert_sql: str | None = None
        self._bump_stmt: Any = None
        self._bump_sql: tuple[str, tuple[str, ...]] | None = None
        self._insert_conv: list[tuple[str, Any]] = []
        self._insert_get: Any = None
        self._insert_fix: list[tuple[int, Any]] = []
        self._insert_multi: dict[tuple[int, tuple[bool, ...]], str] = {}
        self._insert_rows = 1
        self.direct = True
        """SQLite: the writer's statements go straight to the driver as SQLite takes them best (calls
        by multi-row inserts, the search index by the rowids they got, the session upsert); False:
        as on PostgreSQL (one ``executemany``, the index looking each call up, the ORM's upsert)."""
        self._search: bool | None = None  # has the search index (0009)? Looked up on the first write
        self._wconn: Any = None
        """SQLite with ``direct``: the writer's connection (``_transaction``), from process ``_wpid``."""
        self._wpid = 0
        self._wlock = threading.Lock()
        self.encoder = Encoder(Settings.one("state_cache_bytes"))
        """The writer's per-session cache (last call's ids, request split, blob digests), bounded by
        ``ORCHARD_STATE_CACHE_MB`` (default 1024: ~400 sessions at a 150k-token context by its
        estimate, which counts the ids the id parser's cache shares). A session that fell out of it
        is read back from the database on its next call: O(its context), ~10 ms at 158k tokens (its
        ids, its last request's blobs; the split rebuilt from its parts, not parsed), so a proxy
        serving more sessions at once than its caches hold pays that on every call."""

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def upgrade(self) -> None:
        """Bring the schema to the newest migration (creates a new database)."""
        from orchard_rec.storage.migrate import upgrade

        upgrade(self.url, engine=self.engine)
        self._search = None

    def _searchable(self, db: Any) -> bool:
        if self._search is None:
            self._search = search.available(db, self.dialect)
        return self._search

    def close(self) -> None:
        if self._wlock.acquire(timeout=30):  # not under a batch writing on it
            try:
                self._drop_writer()
            finally:
                self._wlock.release()
        self.engine.dispose()

    # -- writes ----------------------------------------------------------------------------

    def write_batch(self, records: Sequence[CallRecord], *, known_new: bool = False) -> int:
        """Store records that are not stored yet, in one transaction. Returns how many were new.

        ``known_new``: the caller knows none is stored (a live batch's first attempt), so the
        lookup is skipped; a duplicate id then fails the whole transaction instead of being skipped.
        """
        if not records:
            return 0
        with self._transaction() as db:  # a Connection: no ORM session (~30 us a batch)
            drv = Direct(db) if self.direct and self.dialect == "sqlite" else None
            try:
                got = self._write(db, drv, records, known_new)
            finally:
                if drv is not None:
                    drv.close()
        if got is None:
            return 0
        self.encoder.commit(got[1])  # the transaction committed: the sessions' states move on
        return got[0]

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """``engine.begin()``; SQLite with ``direct``: a transaction on the writer's own connection,
        kept between batches (a pool checkout, its return and reset cost ~60 us a batch), unless
        another thread writes on it now (then one from the pool). A batch that fails gives its
        connection up: the next one starts on a new connection, as after ``engine.begin()``."""
        if not (self.direct and self.dialect == "sqlite") or not self._wlock.acquire(blocking=False):
            with self.engine.begin() as db:
                yield db
            return
        try:
            conn = self._wconn
            if conn is None or self._wpid != os.getpid() or conn.closed:
                conn = self._wconn = self.engine.connect()
                self._wpid = os.getpid()
            done = False
            try:
                with conn.begin():
                    yield conn
                done = True
            finally:
                if not done:
                    self._drop_writer()
        finally:
            self._wlock.release()

    def _drop_writer(self) -> None:
        conn, self._wconn = self._wconn, None
        if conn is not None and self._wpid == os.getpid():  # (a forked child's is its parent's)
            try:
                conn.close()
            except Exception:  # a broken connection: the pool has let it go already
                pass

    def _write(
        self, db: Any, drv: Direct | None, records: Sequence[CallRecord], known_new: bool
    ) -> tuple[int, dict[str, SessionState]] | None:
        """``write_batch`` in its transaction; ``drv``: the statements that can go straight to the
        driver (SQLite), else None (through ``db``)."""
        ids = [r.call_id for r in records]
        existing = set() if known_new else set(db.scalars(select(Call.id).where(Call.id.in_(ids))))
        fresh: dict[str, CallRecord] = {}
        for r in records:
            if r.call_id not in existing and r.call_id not in fresh:
                fresh[r.call_id] = r
        if not fresh:
            return None
        by_session: dict[str, list[CallRecord]] = defaultdict(list)
        for r in fresh.values():
            if r.session_id is not None:
                by_session[r.session_id].append(r)
        seqs: dict[str, int] = {}
        now = datetime.now(UTC)
        states: dict[str, SessionState] = {}
        order: list[CallRecord] = []
        for sid in sorted(by_session):  # fixed lock order: no deadlock between replicas
            group = sorted(by_session[sid], key=lambda r: (r.received_at, r.call_id))
            # the harness is named by a generation call: a probe first (``curl .../v1/models``)
            # must not label a Codex session ``curl``
            harness = next((r.harness for r in group if r.harness and r.dialect.is_generation), None)
            last = self._bump_session(drv or db, sid, len(group), now, harness)
            for i, r in enumerate(group):
                seqs[r.call_id] = last - len(group) + 1 + i
            cached = self.encoder.state(sid)
            if cached is not None:
                states[sid] = cached.copy()
                self.encoder.hits += 1
            elif last > len(group):  # the session has calls this writer has not seen
                states[sid] = self._load_state(db, sid)
                self.encoder.misses += 1
            else:
                states[sid] = SessionState()
            order.extend(group)
        order.extend(r for r in fresh.values() if r.session_id is None)
        rows: list[dict[str, Any]] = []
        blobs: list[tuple[Any, ...]] = []
        images: dict[str, ImageRef] = {}
        parts = self.encoder.parts
        docs: list[tuple[str, str | None, str]] | None = [] if self._searchable(db) else None
        for r in order:
            sid = r.session_id or ""
            st = states.get(sid)
            if st is None:  # (not ``setdefault``: a state made for every call, dropped by all but one)
                st = states[sid] = SessionState()
            fields, new = self.encoder.encode(r, st)
            rows.append(_row(r, seqs.get(r.call_id), fields))
            if docs is not None:
                docs.append((r.call_id, r.session_id, search.doc_text(new, st.bases, r.response)))
            if not new:
                continue
            if parts:
                stored, found = self.encoder.blob_rows(st, new)
                blobs.extend((sid, *b) for b in stored)
                images.update(found)
            else:
                blobs.extend((sid, h, piece.encode()) for h, piece in new.items())
        if images:
            self._insert_images(db, images)
        if blobs:
            self._insert_blobs(drv or db, blobs)
        rowids = self._insert_calls(db, rows, drv)
        if docs:
            # by the rowids straight to the driver; else each call looked up (SQLAlchemy's ``text``)
            search.index_calls(db if drv is None or rowids is None else drv, self.dialect, docs, rowids)
        return len(fresh), states

    def _load_state(self, db: Any, sid: str) -> SessionState:
        """A session's last calls as the writer's cache would hold them (a cache miss: once per session)."""
        st = SessionState()
        conn = db
        reader = Reader(conn)
        t = Call.__table__
        last = conn.execute(
            select(t.c.id, t.c.prompt_ids, t.c.completion_ids)
            .where(t.c.session_id == sid, t.c.prompt_ids.is_not(None))
            .order_by(t.c.seq.desc())
            .limit(1)
        ).first()
        if last is not None:
            p, c = reader.ids(last.id, last.prompt_ids, last.completion_ids, sid)
            st.tokens, st.completion, st.tokens_id = p or (), c or (), last.id
        for col, attr in (("request_refs", "refs"), ("upstream_refs", "up_refs")):
            row = conn.execute(
                select(t.c.id, t.c[col])
                .where(t.c.session_id == sid, t.c[col].is_not(None))
                .order_by(t.c.seq.desc())
                .limit(1)
            ).first()
            if row is not None:
                refs = reader.refs(col, row.id, row[1], sid)
                setattr(st, attr, refs)
                setattr(st, attr + "_id", row.id)
                st.known.update(refs)
        if st.up_refs:  # the texts the next call's translated messages are compared with
            texts = reader.blobs(sid, st.up_refs)
            st.up_texts = [texts[h] for h in st.up_refs]
        if st.refs_id is not None:  # the last request's split: its pieces are recognised, not re-hashed
            skel = conn.execute(select(t.c.request_skel).where(t.c.id == st.refs_id)).scalar()
            if skel is not None:
                texts = reader.blobs(sid, st.refs)
                literals = layout.decompress(bytes(skel))
                split = layout.rejoin(literals, st.refs, texts) or layout.split_request(
                    layout.join_request(literals, st.refs, texts), deltas=False
                )
                if split.refs == st.refs:
                    st.split = split
                    prompt = split.pieces.get("prompt")
                    last = conn.execute(
                        select(t.c.dialect, t.c.response, t.c.completion_ids).where(t.c.id == st.refs_id)
                    ).first()
                    if prompt and len(prompt) == 1 and last is not None and last.dialect == "completions":
                        # what the session's next prompt may go on with (``Encoder._continue``)
                        resp = _loads(last.response) if last.response is not None else None
                        c0 = (resp.get("choices") or [None])[0] if isinstance(resp, dict) else None
                        ctext = c0.get("text") if isinstance(c0, dict) else None
                        cids = (
                            None
                            if last.completion_ids is None
                            else layout.unpack_ints(bytes(last.completion_ids))
                        )
                        st.cont = (
                            st.refs_id,
                            ctext if isinstance(ctext, str) else None,
                            None if cids is None else tuple(cids),
                            prompt[0][0],
                            prompt[0][1],
                        )
        return st

    def _insert_blobs(self, db: Any, blobs: list[tuple[Any, ...]]) -> None:
        mark = "?" if self.dialect == "sqlite" else "%s"
        cols = "session_id, digest, data"
        if self.encoder.parts:
            cols += ", base, base_len, images, base_call, base_style"
        marks = ", ".join([mark] * (cols.count(",") + 1))
        sql = f"INSERT INTO blobs ({cols}) VALUES ({marks}) ON CONFLICT (session_id, digest) DO NOTHING"
        db.exec_driver_sql(sql, blobs)

    def _insert_images(self, db: Any, images: dict[str, ImageRef]) -> None:
        """Those not stored yet (the bytes of an image another call stored never travel again)."""
        conn = db
        wanted = sorted(images)
        have: set[str] = set()
        for i in range(0, len(wanted), 500):
            have.update(
                conn.execute(select(Image.digest).where(Image.digest.in_(wanted[i : i + 500]))).scalars()
            )
        new = [
            (d, _mime(ref.mime), _dim(ref.width), _dim(ref.height), len(ref.data), ref.data)
            for d in wanted
            if d not in have and (ref := images[d]).data is not None
        ]
        if not new:
            return
        mark = "?" if self.dialect == "sqlite" else "%s"
        sql = (
            "INSERT INTO images (digest, mime, width, height, size, data) "
            f"VALUES ({', '.join([mark] * 6)}) ON CONFLICT (digest) DO NOTHING"
        )
        conn.exec_driver_sql(sql, new)

    def _insert_calls(
        self, db: Any, rows: list[dict[str, Any]], drv: Direct | None = None
    ) -> dict[str, int] | None:
        """Pre-serialized values, straight to the driver; on SQLite the rows' rowids by call id
        (what the search index is keyed by), else None.

        The same values SQLAlchemy's JSON and DateTime bind processors would produce (orjson
        text; SQLite's ``YYYY-MM-DD HH:MM:SS.ffffff`` UTC strings, timezone-aware datetimes for
        PostgreSQL), without its per-row, per-column processing, which cost more than the
        database's own work (bench/PROFILE.md). SQLite takes them as multi-row ``INSERT .. VALUES
        (..), (..)`` statements (in order: the rowids are the ones an ``executemany`` assigns),
        PostgreSQL as one ``executemany``.
        """
        if self._insert_sql is None:
            self._prepare_insert(db)
        get, n = self._insert_get, len(rows)
        # by column: every value at C speed, then the few columns that need converting
        cols: list[tuple[Any, ...]] = list(zip(*map(get, rows), strict=True))
        for i, f in self._insert_fix:
            col = cols[i]
            if col.count(None) != n:
                cols[i] = tuple([None if v is None else f(v) for v in col])
        conn: Any = db if drv is None else drv
        if self.dialect != "sqlite" or not self.direct:
            assert self._insert_sql is not None
            conn.exec_driver_sql(self._insert_sql, list(zip(*cols, strict=True)))
            return None
        # the rows are numbered in order from the table's largest rowid (this transaction holds the
        # write lock since ``_bump_session``); checked, else the search index looks them up
        before = conn.exec_driver_sql("SELECT max(rowid) FROM calls").scalar() or 0
        last = before
        for at, size in runs(n, self._insert_rows):
            part = [c[at : at + size] for c in cols] if size != n else cols
            # a column NULL in every row of the statement is written as NULL, not bound (a bound
            # NULL costs the driver more than SQLite's whole work on some columns)
            bound = tuple(map(_nulls(size).__ne__, part))  # (compared at C speed)
            sql = self._insert_multi.get((size, bound))
            if sql is None:
                sql = self._multi_sql(size, bound)
            values = tuple(chain.from_iterable(zip(*compress(part, bound), strict=True)))
            last = conn.exec_driver_sql(sql, values).lastrowid
        if last - before != n:
            return None
        return {row["id"]: before + 1 + k for k, row in enumerate(rows)}

    def _multi_sql(self, size: int, bound: tuple[bool, ...]) -> str:
        """The ``calls`` insert of ``size`` rows, ``?`` for each ``bound`` column, else ``NULL``."""
        assert self._insert_sql is not None
        head = self._insert_sql.split(" VALUES ")[0]
        one = "(" + ", ".join("?" if b else "NULL" for b in bound) + ")"
        if len(self._insert_multi) >= 256:  # a few shapes per workload; never without bound
            self._insert_multi.clear()
        sql = self._insert_multi[(size, bound)] = f"{head} VALUES " + ", ".join([one] * size)
        return sql

    def _prepare_insert(self, db: Any) -> None:
        """The ``calls`` insert's statement and value conversions (once: the columns may depend on
        the database's revision)."""
        table = Call.__table__
        cols = list(table.columns)
        if not _has_column(db, "calls", "policy_versions"):  # a 0007 database
            cols = [c for c in cols if c.name not in ("policy_versions", "routed_experts")]
        sqlite = self.dialect == "sqlite"
        marks = ["?" if sqlite else ("%s::json" if isinstance(c.type, JSON) else "%s") for c in cols]
        names = ", ".join(self.engine.dialect.identifier_preparer.quote(c.name) for c in cols)
        self._insert_sql = f"INSERT INTO {Call.__tablename__} ({names}) VALUES ({', '.join(marks)})"
        conv: list[Any] = []
        for c in cols:
            if isinstance(c.type, JSON):
                conv.append(_dumps)
            elif isinstance(c.type, DateTime):  # ``_row`` holds epochs
                conv.append(_sqlite_epoch if sqlite else _ts)
            elif c.name == "stream" and sqlite:
                conv.append(int)
            else:
                conv.append(None)
        self._insert_conv = list(zip([c.name for c in cols], conv))
        self._insert_get = itemgetter(*(c.name for c in cols))
        self._insert_fix = [(i, f) for i, f in enumerate(conv) if f is not None]
        if sqlite:  # rows per statement: within the build's bound on parameters (999 before 3.32)
            raw = db.connection.driver_connection
            limit = 999
            if hasattr(raw, "getlimit"):
                import sqlite3

                limit = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            self._insert_rows = 1 << (max(1, min(64, limit // len(cols))).bit_length() - 1)

    def _bump_session(self, db: Any, sid: str, n: int, now: datetime, harness: str | None) -> int:
        from sqlalchemy.dialects import postgresql, sqlite

        if self._bump_stmt is None:  # built once: a new upsert per batch left ~100 objects in
            # reference cycles (its ``excluded`` alias) for the garbage collector, on every batch
            insert: Any = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
            table: Any = Session.__table__
            c = table.c
            p_now = bindparam("now", type_=c.updated_at.type)
            p_n = bindparam("n", type_=c.call_count.type)
            stmt = insert(table).values(
                id=bindparam("sid", type_=c.id.type),
                created_at=p_now,
                updated_at=p_now,
                call_count=p_n,
                harness=bindparam("harness", type_=c.harness.type),
            )
            self._bump_stmt = stmt.on_conflict_do_update(
                index_elements=[c.id],
                set_={
                    "call_count": c.call_count + p_n,
                    "updated_at": p_now,
                    "harness": func.coalesce(c.harness, stmt.excluded.harness),
                },
            ).returning(c.call_count)
            if self.dialect == "sqlite":  # its SQL and the order of its parameters, for the driver
                compiled = self._bump_stmt.compile(dialect=self.engine.dialect)
                self._bump_sql = (str(compiled), tuple(compiled.positiontup or ()))
        params = {"sid": sid, "now": now, "n": n, "harness": harness}
        if (
            self.direct and self._bump_sql is not None
        ):  # SQLite: straight to the driver (the ORM's execute: ~100 us)
            sql, names = self._bump_sql
            params["now"] = _sqlite_time(now)  # what the DateTime bind processor writes
            got = db.exec_driver_sql(sql, tuple(params[k] for k in names)).scalar_one()
            return int(got)
        return int(db.execute(self._bump_stmt, params).scalar_one())

    # -- reads -----------------------------------------------------------------------------

    def set_outcome(self, session_id: str, outcome: Outcome) -> None:
        """Attach (or replace) a session's whole outcome; the session row is created if no call
        came yet. ``update_outcome`` merges instead (what the CLI and HTTP use)."""
        check_outcome(outcome)
        self._outcome_txn(session_id, lambda _stored: outcome)

    def update_outcome(self, session_id: str, change: OutcomeChange) -> Outcome:
        """Merge ``change`` into the stored outcome in one transaction (``storage.outcome`` has
        the rules); the merged outcome is returned."""
        merged: list[Outcome] = []

        def apply(stored: Outcome | None) -> Outcome:
            merged[:] = [merge_outcome(stored, change)]
            return merged[0]

        self._outcome_txn(session_id, apply)
        return merged[0]

    def _outcome_txn(self, session_id: str, apply: Callable[[Outcome | None], Outcome]) -> None:
        from sqlalchemy.exc import IntegrityError

        problem = session_id_problem(session_id)  # the one rule, on SQLite as on PostgreSQL
        if problem is not None:
            raise InvalidOutcome(f"invalid session id: {problem} ({SESSION_ID_RULE})", param="session_id")

        try:
            self._set_outcome(session_id, apply)
        except IntegrityError:  # the writer created the session row meanwhile (its first call)
            self._set_outcome(session_id, apply)

    def _set_outcome(self, session_id: str, apply: Callable[[Outcome | None], Outcome]) -> None:
        now = datetime.now(UTC)
        with self._sessions.begin() as db:
            s = db.get(Session, session_id, with_for_update=self.dialect == "postgresql")
            if s is None:
                s = Session(id=session_id, created_at=now, updated_at=now, call_count=0)
                db.add(s)
            outcome = apply(_summary(s).outcome)
            s.reward = dict(outcome.reward) if isinstance(outcome.reward, dict) else outcome.reward
            s.status = outcome.status
            s.step_values = None if outcome.step_values is None else list(outcome.step_values)
            s.outcome_metadata = dict(outcome.metadata)
            s.outcome_at = now

    def sessions(
        self, ids: Sequence[str] | None = None, *, since: float | None = None, harness: str | None = None
    ) -> list[SessionSummary]:
        stmt = select(Session).order_by(Session.created_at, Session.id)
        if ids:
            stmt = stmt.where(Session.id.in_(list(ids)))
        if since is not None:
            stmt = stmt.where(Session.updated_at >= _ts(since))
        if harness is not None:
            stmt = stmt.where(Session.harness == harness)
        with self._sessions() as db:
            return [_summary(s) for s in db.scalars(stmt)]

    def session(self, session_id: str) -> SessionSummary | None:
        with self._sessions() as db:
            s = db.get(Session, session_id)
            return None if s is None else _summary(s)

    def calls(self, session_id: str | None = None, *, untagged: bool = False) -> list[CallRecord]:
        return list(self.iter_calls(session_id, untagged=untagged))

    def iter_calls(
        self, session_id: str | None = None, *, untagged: bool = False, batch: int = 500
    ) -> Iterator[CallRecord]:
        """Calls in session order (seq), streamed from the database in batches."""
        stmt = select(Call)
        if session_id is not None:
            stmt = stmt.where(Call.session_id == session_id).order_by(Call.seq)
        elif untagged:
            stmt = stmt.where(Call.session_id.is_(None)).order_by(Call.received_at, Call.id)
        else:
            stmt = stmt.order_by(Call.session_id, Call.seq, Call.received_at, Call.id)
        with self._sessions() as db:
            reader = Reader(db.connection())
            for row in db.scalars(stmt.execution_options(yield_per=batch)):
                yield _record(row, reader)

    def iter_sessions_calls(
        self,
        ids: Sequence[str] | None = None,
        *,
        since: float | None = None,
        harness: str | None = None,
        batch: int = 2000,
        lazy: bool = False,
    ) -> Iterator[tuple[SessionSummary, Any]]:
        """Each selected session with its calls (light records: no bodies or timings; full records
        for a session whose requests hold stored images, which reconstruction needs), in causal
        order (``received_at``, then ``seq``), one session at a time, from ONE streaming query
        ordered by session that also carries each session's row (outcome) - memory does not
        grow with the number of sessions.

        ``lazy``: each session's calls come as an iterator that decodes one call at a time (ids
        rebuilt from the deltas on the call just before): consume it before the next session.
        Memory is then a few calls' ids, not the sum of a session's prompts.
        """
        if lazy:
            yield from self._iter_sessions_lazy(ids, since=since, harness=harness, batch=batch)
            return
        for summary, calls in self._iter_sessions_lazy(ids, since=since, harness=harness, batch=batch):
            yield summary, list(calls)

    def _iter_sessions_lazy(
        self, ids: Sequence[str] | None, *, since: float | None, harness: str | None, batch: int
    ) -> Iterator[tuple[SessionSummary, Iterator[CallRecord]]]:
        t = Call.__table__
        st = Session.__table__
        cols = [t.c[name] for name in _LIGHT_COLUMNS] + [
            st.c[name].label("s_" + name) for name in _SESSION_COLUMNS
        ]
        stmt = select(*cols).join(st, st.c.id == t.c.session_id)
        if ids:
            stmt = stmt.where(t.c.session_id.in_(list(ids)))
        if since is not None:
            stmt = stmt.where(st.c.updated_at >= _ts(since))
        if harness is not None:
            stmt = stmt.where(st.c.harness == harness)
        stmt = stmt.order_by(t.c.session_id, t.c.received_at, t.c.seq)
        with self.engine.connect() as conn, self.engine.connect() as side, OrmSession(bind=side) as orm:
            reader = Reader(
                side, keep=2
            )  # one reader: a session's blobs and images fetched once, not per call
            rows = iter(conn.execution_options(yield_per=batch).execute(stmt))
            pending = next(rows, None)

            def shows_images(sid: str) -> bool:
                b = Blob.__table__
                found = side.execute(
                    select(b.c.digest).where(b.c.session_id == sid, b.c.images.is_not(None)).limit(1)
                ).first()
                return found is not None

            def session_calls(sid: str, full: bool) -> Iterator[CallRecord]:
                nonlocal pending
                while pending is not None and pending.session_id == sid:
                    row, pending = pending, next(rows, None)
                    rec = _light_record(row, reader)
                    if full or rec.prompt_ids is None or rec.completion_ids is None:
                        # bodies are needed to retokenize this one, or for the images its prompt shows
                        c = orm.get(Call, rec.call_id)
                        if c is not None:
                            rec = _record(c, reader)
                        orm.expunge_all()
                    yield rec

            while pending is not None:
                sid = pending.session_id
                calls = session_calls(sid, shows_images(sid))
                yield _summary_of_row(pending), calls
                for _ in calls:  # whatever the consumer left of this session
                    pass

    def image(self, digest: str) -> tuple[str | None, bytes] | None:
        """``(media type, bytes)`` of a stored image by its SHA-256 (hex, ``ImageRef.digest``); None if absent."""
        with self.engine.connect() as conn:
            row = conn.execute(select(Image.mime, Image.data).where(Image.digest == digest.lower())).first()
        return None if row is None else (row[0], bytes(row[1]))

    def image_info(self, digest: str) -> ImageRef | None:
        """The stored image's reference (digest, media type, dimensions) without its bytes."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(Image.digest, Image.mime, Image.width, Image.height).where(
                    Image.digest == digest.lower()
                )
            ).first()
        return None if row is None else ImageRef(row[0], row[1], row[2], row[3])

    def image_stats(self) -> dict[str, int]:
        """``{"images": how many, "bytes": their bytes}`` over the whole database."""
        with self.engine.connect() as conn:
            n, size = conn.execute(select(func.count(), func.coalesce(func.sum(Image.size), 0))).one()
        return {"images": int(n), "bytes": int(size)}

    def count_calls(self) -> int:
        with self._sessions() as db:
            return int(db.scalar(select(func.count()).select_from(Call)) or 0)

    def get_call(self, call_id: str) -> CallRecord | None:
        with self._sessions() as db:
            row = db.get(Call, call_id)
            return None if row is None else _record(row, Reader(db.connection()))

    def request_text(self, call_id: str) -> str | None:
        """The call's request exactly as the client sent it (as ``get_call`` rebuilds it), without
        the rest of its record; None if the call or its text is not stored (the spool's replay)."""
        with self._sessions() as db:
            row = db.get(Call, call_id)
            if row is None or row.request_skel is None:
                return None
            reader = Reader(db.connection())
            literals = layout.decompress(bytes(row.request_skel))
            refs = (
                reader.refs("request_refs", row.id, row.request_refs, row.session_id)
                if row.request_refs is not None
                else []
            )
            blobs = reader.blobs(row.session_id, refs) if refs else {}
            return layout.join_request(literals, refs, blobs)

    def prompt_ids(self, call_id: str) -> tuple[int, ...] | None:
        """The call's prompt ids alone; None if the call or its ids are not stored."""
        with self._sessions() as db:
            row = db.execute(
                select(Call.prompt_ids, Call.completion_ids, Call.session_id).where(Call.id == call_id)
            ).first()
            if row is None or row[0] is None:
                return None
            return Reader(db.connection()).tokens(call_id, row[0], row[1], row[2])[0]

    def seq_of(self, call_id: str) -> int | None:
        with self._sessions() as db:
            return db.scalar(select(Call.seq).where(Call.id == call_id))
