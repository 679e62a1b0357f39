"""Storage linear in a session: calls keep only what is new (ids as int32 deltas, request
messages and tool lists as per-session blobs, upstream request as a recipe, events zstd).

Converts an existing database in place: every call is re-encoded, session by session in
sequence order, exactly as the writer encodes a new call (``orchard_rec.storage.delta``).
Requests recorded before the exact client text was kept come back as their stored JSON
(orjson's serialization of it).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_OLD = ("request", "upstream_request", "events", "prompt_ids", "completion_ids", "completion_logprobs")
_RENAMED = ("events", "prompt_ids", "completion_ids", "completion_logprobs")
_JSON = sa.JSON(none_as_null=True)


def _calls(*cols: Any) -> sa.TableClause:
    return sa.table("calls", sa.column("id", sa.String()), *cols)


def upgrade() -> None:
    from orchard_rec.records import CallOutcome, CallRecord, Dialect
    from orchard_rec.storage.delta import Encoder, SessionState

    op.create_table(
        "blobs",
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("digest", sa.LargeBinary(16), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "digest", name=op.f("pk_blobs")),
    )
    with op.batch_alter_table("calls") as batch:
        for name in ("request_skel", "request_refs", "upstream_refs"):
            batch.add_column(sa.Column(name, sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("upstream", _JSON, nullable=True))
        batch.add_column(sa.Column("response_ids", _JSON, nullable=True))
        for name in _RENAMED:
            batch.add_column(sa.Column(name + "_new", sa.LargeBinary(), nullable=True))

    conn = op.get_bind()
    old = _calls(
        sa.column("session_id", sa.String()),
        sa.column("seq", sa.BigInteger()),
        sa.column("dialect", sa.String()),
        sa.column("response", _JSON),
        *(sa.column(n, _JSON) for n in _OLD),
    )
    new = _calls(
        *(sa.column(n, sa.LargeBinary()) for n in ("request_skel", "request_refs", "upstream_refs")),
        sa.column("upstream", _JSON),
        sa.column("response", _JSON),
        sa.column("response_ids", _JSON),
        *(sa.column(n + "_new", sa.LargeBinary()) for n in _RENAMED),
    )
    blobs = sa.table(
        "blobs",
        sa.column("session_id", sa.String()),
        sa.column("digest", sa.LargeBinary()),
        sa.column("data", sa.LargeBinary()),
    )
    encoder = Encoder(parts=False)  # the 0004 schema: whole blob texts
    ids = [r.id for r in conn.execute(sa.select(old.c.id).order_by(old.c.session_id, old.c.seq, old.c.id))]
    state: SessionState | None = None
    current: object = object()
    for start in range(0, len(ids), 200):
        chunk = ids[start : start + 200]
        rows = {r.id: r for r in conn.execute(sa.select(old).where(old.c.id.in_(chunk)))}
        for cid in chunk:
            c = rows[cid]
            if c.session_id != current or c.session_id is None:
                current, state = c.session_id, SessionState()
            assert state is not None
            rec = CallRecord(
                call_id=c.id,
                session_id=c.session_id,
                dialect=Dialect(c.dialect),
                method="POST",
                path="",
                stream=False,
                status_code=None,
                outcome=CallOutcome.OK,
                received_at=0.0,
                first_byte_at=None,
                done_at=0.0,
                request=c.request,
                upstream_request=c.upstream_request,
                response=c.response,
                events=c.events,
                prompt_ids=None if c.prompt_ids is None else tuple(c.prompt_ids),
                completion_ids=None if c.completion_ids is None else tuple(c.completion_ids),
                completion_logprobs=None if c.completion_logprobs is None else tuple(c.completion_logprobs),
            )
            fields, fresh = encoder.encode(rec, state)
            if fresh:
                conn.execute(
                    blobs.insert(),
                    [
                        {"session_id": c.session_id or "", "digest": h, "data": p.encode()}
                        for h, p in fresh.items()
                    ],
                )
            values = {k: v for k, v in fields.items() if k not in _RENAMED}
            values.update({k + "_new": fields[k] for k in _RENAMED})
            conn.execute(new.update().where(new.c.id == cid).values(**values))
    with op.batch_alter_table("calls") as batch:
        for name in _OLD:
            batch.drop_column(name)
    with op.batch_alter_table("calls") as batch:
        for name in _RENAMED:
            batch.alter_column(name + "_new", new_column_name=name)


def downgrade() -> None:
    from orchard_rec.storage import layout
    from orchard_rec.storage.delta import Reader

    with op.batch_alter_table("calls") as batch:
        for name in _OLD:
            batch.add_column(sa.Column(name + "_old", _JSON, nullable=True))
    conn = op.get_bind()
    stored = _calls(
        sa.column("session_id", sa.String()),
        sa.column("seq", sa.BigInteger()),
        *(sa.column(n, sa.LargeBinary()) for n in ("request_skel", "request_refs", "upstream_refs")),
        *(sa.column(n, sa.LargeBinary()) for n in _RENAMED),
        sa.column("upstream", _JSON),
        sa.column("response", _JSON),
        sa.column("response_ids", _JSON),
    )
    target = _calls(sa.column("response", _JSON), *(sa.column(n + "_old", _JSON) for n in _OLD))
    reader = Reader(conn, parts=False)  # the 0004 schema: whole blob texts
    ids = [
        r.id
        for r in conn.execute(sa.select(stored.c.id).order_by(stored.c.session_id, stored.c.seq, stored.c.id))
    ]
    for start in range(0, len(ids), 200):
        chunk = ids[start : start + 200]
        rows = {r.id: r for r in conn.execute(sa.select(stored).where(stored.c.id.in_(chunk)))}
        for cid in chunk:
            c = rows[cid]
            prompt, completion = reader.tokens(c.id, c.prompt_ids, c.completion_ids)
            bodies = reader.bodies(c, prompt, completion)
            conn.execute(
                target.update()
                .where(target.c.id == cid)
                .values(
                    request_old=bodies["request"],
                    upstream_request_old=bodies["upstream_request"],
                    response=bodies["response"],
                    events_old=bodies["events"],
                    prompt_ids_old=None if prompt is None else list(prompt),
                    completion_ids_old=None if completion is None else list(completion),
                    completion_logprobs_old=None
                    if c.completion_logprobs is None
                    else list(layout.unpack_floats(bytes(c.completion_logprobs))),
                )
            )
    with op.batch_alter_table("calls") as batch:
        for name in ("request_skel", "request_refs", "upstream_refs", "upstream", "response_ids", *_RENAMED):
            batch.drop_column(name)
    with op.batch_alter_table("calls") as batch:
        for name in _OLD:
            batch.alter_column(name + "_old", new_column_name=name)
    op.drop_table("blobs")
