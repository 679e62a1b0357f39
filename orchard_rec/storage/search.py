"""Full-text search inside conversations: message text, tool calls, tool results, answers.

One index entry per call holds only what that call added to its session: the request pieces
the session had not stored before (``Encoder.encode``'s new blobs: new messages, or what a
growing prompt appended) and the answer. A conversation's text is thus indexed once, however
many calls repeat it. The writer adds the entries in the same transaction as the calls
(``Store.write_batch``); migration ``0009_search`` creates the index and fills it for calls
recorded before.

- SQLite: an FTS5 table without content (``search_fts``, ``content=''``: the index only, the
  text stays where it is), its rowid the call's rowid in ``calls``.
- PostgreSQL: ``search_docs`` (call id, session id, a ``tsvector`` with the ``simple``
  configuration: no stemming, no stop words, code and tool output searchable as written) with a
  GIN index.

``session_match`` is the SQL of "the sessions whose text holds every word of the query".
What is indexed are the string values of messages and answers, less ids, roles, types,
signatures, encrypted content, images, log-probs and token ids (``text_of``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

import orjson
from sqlalchemy import text

from orchard_rec.storage.engine import runs

__all__ = ["SQLITE_TABLE", "available", "doc_text", "index_calls", "session_match", "text_of", "words"]

SQLITE_TABLE = "search_fts"
PG_TABLE = "search_docs"
_SKIP_KEYS = frozenset(
    {
        "id",
        "type",
        "role",
        "object",
        "model",
        "status",
        "index",
        "finish_reason",
        "stop_reason",
        "tool_call_id",
        "call_id",
        "tool_use_id",
        "signature",
        "encrypted_content",
        "image_url",
        "url",
        "data",
        "source",
        "logprobs",
        "prompt_logprobs",
        "top_logprobs",
        "token_ids",
        "prompt_token_ids",
        "usage",
        "system_fingerprint",
        "cache_control",
        "media_type",
    }
)
_WORD = re.compile(r"\w+", re.UNICODE)
# words as SQLite's unicode61 tokenizer cuts them (runs of letters, digits, underscore), so that
# "src/fix-bug-0.py" is the same words on both backends (PostgreSQL's parser would keep a path whole)
PG_VECTOR = "to_tsvector('simple', regexp_replace(:body, '[^[:alnum:]_]+', ' ', 'g'))"


def _strings(node: Any, out: list[str], depth: int = 0) -> None:
    if depth > 40:
        return
    if isinstance(node, str):
        if node and not node.startswith("data:"):
            out.append(node)
    elif isinstance(node, dict):
        if "function" in node and isinstance(node.get("function"), dict) and "parameters" in node["function"]:
            return  # a tool's definition, not the conversation
        if "input_schema" in node or depth == 40:
            return  # (at 40: its values, at 41, would add nothing)
        for k, v in node.items():
            if k in _SKIP_KEYS:
                continue
            if type(v) is str:  # a value's own call saved (most values are strings or numbers)
                if v and not v.startswith("data:"):
                    out.append(v)
            elif isinstance(v, (str, dict, list)):
                _strings(v, out, depth + 1)
    elif isinstance(node, list):
        if depth == 40:
            return
        for v in node:
            if type(v) is str:
                if v and not v.startswith("data:"):
                    out.append(v)
            elif isinstance(v, (str, dict, list)):
                _strings(v, out, depth + 1)


def text_of(obj: Any) -> str:
    """The searchable text of a message, a request piece or an answer."""
    out: list[str] = []
    _strings(obj, out)
    return "\n".join(out)


def doc_text(pieces: dict[bytes, str], bases: dict[bytes, tuple[bytes, int]], response: Any) -> str:
    """What one call adds to its session's text: its new request pieces, then its answer."""
    out: list[str] = []
    for h, piece in pieces.items():
        base = bases.get(h)
        if base is not None:  # a growing value: only what follows the part already indexed
            out.append(piece[base[1] :])
            continue
        out.append(_piece_text(piece))
    if response is not None:
        out.append(text_of(response))
    return "\n".join(s for s in out if s)


def available(conn: Any, dialect: str) -> bool:
    """Whether the database has the search index (revision 0009 or later)."""
    from sqlalchemy import inspect

    return bool(inspect(conn).has_table(SQLITE_TABLE if dialect == "sqlite" else PG_TABLE))


def index_calls(
    conn: Any,
    dialect: str,
    docs: Iterable[tuple[str, str | None, str]],
    rowids: dict[str, int] | None = None,
) -> int:
    """Add ``(call_id, session_id, text)`` entries (calls already inserted); empty texts skipped.
    ``rowids``: SQLite, the calls' rowids by id when the caller knows them (no lookup per entry)."""
    if rowids is not None and dialect == "sqlite":
        # multi-row statements: one step of the driver for many entries (an ``executemany`` steps,
        # and gives up and takes back the interpreter lock, once an entry), the index the same
        vals = [(rowids[cid], body) for cid, sid, body in docs if body and sid]
        for at, size in runs(len(vals), 256):
            sql = f"INSERT INTO {SQLITE_TABLE}(rowid, body) VALUES " + ", ".join(["(?, ?)"] * size)
            conn.exec_driver_sql(sql, tuple(chain.from_iterable(vals[at : at + size])))
        return len(vals)
    rows = [{"cid": cid, "sid": sid, "body": body} for cid, sid, body in docs if body and sid]
    if not rows:
        return 0
    if dialect == "sqlite":
        conn.execute(
            text(f"INSERT INTO {SQLITE_TABLE}(rowid, body) SELECT rowid, :body FROM calls WHERE id = :cid"),
            rows,
        )
    else:
        conn.execute(
            text(f"INSERT INTO {PG_TABLE}(call_id, session_id, tsv) VALUES (:cid, :sid, {PG_VECTOR})"),
            rows,
        )
    return len(rows)


def words(query: str) -> list[str]:
    return _WORD.findall(query)


def session_match(dialect: str, query: str, param: str = "fts") -> Any:
    """SQL selecting the ids of sessions whose indexed text holds every word of ``query``
    (None when it has no word)."""
    terms = words(query)
    if not terms:
        return None
    if dialect == "sqlite":
        match = " AND ".join('"' + w.replace('"', '""') + '"' for w in terms)
        return text(
            f"SELECT c.session_id FROM {SQLITE_TABLE} f JOIN calls c ON c.rowid = f.rowid "
            f"WHERE {SQLITE_TABLE} MATCH :{param}"
        ).bindparams(**{param: match})
    return text(
        f"SELECT session_id FROM {PG_TABLE} WHERE tsv @@ plainto_tsquery('simple', :{param})"
    ).bindparams(**{param: " ".join(terms)})


def backfill(conn: Any, dialect: str, batch: int = 500) -> int:
    """Index the calls recorded before the index existed: per session, its stored pieces
    (``blobs``: each message once) and every answer, under the session's first call.
    ``batch`` sessions at a time (three queries each batch)."""
    firsts = conn.execute(
        text("SELECT session_id, id FROM calls WHERE session_id IS NOT NULL AND seq = 1 ORDER BY session_id")
    ).all()
    n = 0
    for chunk in _chunks(firsts, batch):
        sids = {sid: cid for sid, cid in chunk}
        parts: dict[str, list[str]] = {sid: [] for sid in sids}
        params = {f"s{i}": sid for i, sid in enumerate(sids)}
        inside = ", ".join(f":s{i}" for i in range(len(sids)))
        blobs = conn.execute(
            text(f"SELECT session_id, data, base FROM blobs WHERE session_id IN ({inside})"), params
        )
        for sid, data, base in blobs:
            piece = bytes(data).decode("utf-8", errors="replace")
            parts[sid].append(piece if base is not None else _piece_text(piece))
        answers = conn.execute(
            text(f"SELECT session_id, response FROM calls WHERE session_id IN ({inside}) ORDER BY seq"),
            params,
        )
        for sid, resp in answers:
            if resp is not None:
                parts[sid].append(text_of(orjson.loads(resp) if isinstance(resp, (str, bytes)) else resp))
        n += index_calls(
            conn, dialect, [(cid, sid, "\n".join(p for p in parts[sid] if p)) for sid, cid in sids.items()]
        )
    return n


def _piece_text(piece: str) -> str:
    try:
        return text_of(orjson.loads(piece))
    except orjson.JSONDecodeError:
        return piece


def _chunks(it: Iterable[Any], n: int) -> Iterator[list[Any]]:
    buf: list[Any] = []
    for x in it:
        buf.append(x)
        if len(buf) >= n:
            yield buf
            buf = []
    if buf:
        yield buf
