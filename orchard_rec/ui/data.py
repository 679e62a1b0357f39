"""What the viewer shows, read from the database (never written).

The sessions table is filtered, sorted and paginated in SQL over the ``sessions`` table (one
page of rows and one ``count`` per request, whatever the number of sessions); the page's
models and token counts come from ``Store.iter_sessions_calls`` for those rows only. A
session's page reads its calls with ``Store.calls`` and its samples with
``reconstruct.iter_samples``, exactly what ``export --session`` writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy.engine import make_url

from orchard_rec.errors import OrchardError
from orchard_rec.pipeline import Selection, iter_samples
from orchard_rec.reconstruct import Sample, image_token_id
from orchard_rec.records import CallRecord, context_tokens
from orchard_rec.storage import queries
from orchard_rec.storage.queries import SessionQuery
from orchard_rec.storage.store import SessionSummary, Store
from orchard_rec.ui.chat import conversation, response_turn

__all__ = [
    "SORTS",
    "STATUSES",
    "SessionFilter",
    "UIError",
    "call_detail",
    "chat_of",
    "list_sessions",
    "open_store",
    "session_view",
    "sessions_stats",
]

STATUSES = ("completed", "truncated", "aborted", "failed", "none")
SORTS = ("id", "harness", "calls", "status", "reward", "started", "updated", "duration")


class UIError(Exception):
    """A problem the user can fix (no database, no schema, no such session): one line, no traceback."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def open_store(url: str) -> Store:
    """An existing orchard-rec database, opened for reading. Never creates or migrates one."""
    try:
        u = make_url(url)
    except Exception as exc:
        raise UIError(f"not a database URL: {url!r} ({exc})") from None
    if u.get_backend_name() == "sqlite":
        path = u.database or ""
        if path in ("", ":memory:") or not Path(path).is_file():
            raise UIError(f"no database at {url} (record something first: orchard-rec serve / demo)")
    store = Store(url, readonly=True)
    try:
        ready = queries.has_record_tables(store)
    except Exception as exc:
        store.close()
        raise UIError(f"cannot open {url}: {exc}") from None
    if not ready:
        store.close()
        raise UIError(f"{url} has no orchard-rec schema (orchard-rec db upgrade --db URL creates it)")
    return store


# -- the sessions table ----------------------------------------------------------------------------


@dataclass
class SessionFilter(SessionQuery):
    """The sessions table's filter, sort and page as the viewer's query string gives them
    (``storage.queries.SessionQuery``'s fields)."""

    @classmethod
    def from_query(cls, q: Any) -> SessionFilter:
        def num(name: str) -> float | None:
            v = (q.get(name) or "").strip()
            if not v:
                return None
            try:
                return float(v)
            except ValueError:
                raise UIError(f"{name} must be a number, got {v!r}") from None

        def when(name: str) -> float | None:
            v = (q.get(name) or "").strip()
            if not v:
                return None
            try:
                return float(v)
            except ValueError:
                pass
            try:
                dt = datetime.fromisoformat(v)
            except ValueError:
                raise UIError(f"{name} must be an ISO date/time or epoch seconds, got {v!r}") from None
            return dt.replace(tzinfo=dt.tzinfo or UTC).timestamp()

        def integer(name: str, default: int, lo: int, hi: int) -> int:
            v = (q.get(name) or "").strip()
            try:
                return min(hi, max(lo, int(v))) if v else default
            except ValueError:
                raise UIError(f"{name} must be an integer, got {v!r}") from None

        sort = q.get("sort") or "started"
        if sort not in SORTS:
            raise UIError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
        order = q.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise UIError(f"order must be asc or desc, got {order!r}")
        status = q.get("status") or ""
        if status and status not in STATUSES:
            raise UIError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        meta = [m.strip() for m in (q.getall("meta", []) if hasattr(q, "getall") else []) if m.strip()]
        for m in meta:
            if not m.partition("=")[0].strip():
                raise UIError(f"meta takes KEY=VALUE or KEY, got {m!r}")
        return cls(
            q=(q.get("q") or "").strip(),
            harness=(q.get("harness") or "").strip(),
            status=status,
            model=(q.get("model") or "").strip(),
            errors=(q.get("errors") or "") in ("1", "on", "true"),
            meta=meta,
            reward_min=num("reward_min"),
            reward_max=num("reward_max"),
            since=when("since"),
            until=when("until"),
            sort=sort,
            order=order,
            page=integer("page", 1, 1, 10**9),
            per_page=integer("per_page", 50, 1, 500),
        )

    def query(self, **changes: Any) -> list[tuple[str, str]]:
        """The query string of this filter (with ``changes``), for links; defaults left out."""
        d = {**self.__dict__, **changes}
        out: list[tuple[str, str]] = []
        for k, v in d.items():
            if v is None or v == "" or v is False or v == [] or (k, v) in _DEFAULTS:
                continue
            if k == "meta":
                out += [("meta", m) for m in v]
            else:
                out.append((k, "1" if v is True else str(v)))
        return out


_SHOWN_APART = ("event_ms", "response_headers")
"""Call metadata the views show in their own places, not as metadata: the stream events'
arrival times (``ui.calls.stream_events``) and the upstream's response headers (the Headers tab)."""
_DEFAULTS = (("sort", "started"), ("order", "desc"), ("page", 1), ("per_page", 50))


@dataclass
class SessionRow:
    id: str
    harness: str | None
    calls: int
    status: str | None
    reward: Any
    started: float
    updated: float
    model: str | None = None
    context_tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0

    @property
    def duration(self) -> float:
        return max(0.0, self.updated - self.started)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "duration": self.duration}


@dataclass
class SessionPage:
    rows: list[SessionRow]
    total: int
    filter: SessionFilter
    harnesses: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.filter.per_page))

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "page": self.filter.page,
            "pages": self.pages,
            "per_page": self.filter.per_page,
            "sessions": [r.to_json() for r in self.rows],
        }


def list_sessions(store: Store, f: SessionFilter, *, with_harnesses: bool = False) -> SessionPage:
    """One page of sessions: filter, sort and paginate in SQL; enrich only that page's rows."""
    found, total = queries.session_page(store, f)
    rows = [
        SessionRow(
            id=r["id"],
            harness=r["harness"],
            calls=int(r["call_count"] or 0),
            status=r["status"],
            reward=_loads(r["reward"]),
            started=r["created_at"] or 0.0,
            updated=r["updated_at"] or 0.0,
        )
        for r in found
    ]
    harnesses = harness_names(store) if with_harnesses else []
    models = model_names(store) if with_harnesses else []
    _enrich(store, rows)
    return SessionPage(rows, total, f, harnesses, models)


_NAMES_CACHE: dict[tuple[str, str], tuple[float, list[str]]] = {}


def _cached_names(store: Store, kind: str, ttl: float, scan: Callable[[Store], list[str]]) -> list[str]:
    """``scan(store)`` (a full-table scan), kept for ``ttl`` seconds per database and ``kind``."""
    now = time.monotonic()
    hit = _NAMES_CACHE.get((store.url, kind))
    if hit is not None and now - hit[0] < ttl:
        return hit[1]
    names = scan(store)
    _NAMES_CACHE[(store.url, kind)] = (now, names)
    return names


def harness_names(store: Store, ttl: float = 30.0) -> list[str]:
    """The harnesses seen (one full scan of the sessions table, so cached for ``ttl`` seconds)."""
    return _cached_names(store, "harness", ttl, queries.harness_names)


def model_names(store: Store, ttl: float = 30.0) -> list[str]:
    """The models seen in calls (one scan of the calls table, so cached for ``ttl`` seconds)."""
    return _cached_names(store, "model", ttl, queries.model_names)


def _loads(v: Any) -> Any:
    return orjson.loads(v) if isinstance(v, (str, bytes)) else v


def _enrich(store: Store, rows: list[SessionRow]) -> None:
    """Model and token counts of the page's sessions (their calls' ids, no bodies)."""
    if not rows:
        return
    by_id = {r.id: r for r in rows}
    for summary, calls in store.iter_sessions_calls(list(by_id)):
        row = by_id.get(summary.id)
        if row is None:
            continue
        for c in calls:
            row.model = c.model or row.model
            p = len(c.prompt_ids or ())
            n = len(c.completion_ids or ())
            row.prompt_tokens += p
            row.completion_tokens += n
            row.context_tokens = max(row.context_tokens, context_tokens(c) or 0)
            if c.error or c.outcome.value != "ok":
                row.errors += 1


def sessions_stats(store: Store) -> dict[str, Any]:
    """What changes when something is recorded: for polling."""
    return queries.sessions_stats(store)


# -- one session ---------------------------------------------------------------------------------


def _call_row(c: CallRecord, t0: float, span: float) -> dict[str, Any]:
    fb = c.first_byte_at
    wait_end = fb if fb is not None else c.done_at
    return {
        "seq": c.seq,
        "call_id": c.call_id,
        "dialect": c.dialect.value,
        "path": c.path,
        "stream": c.stream,
        "status_code": c.status_code,
        "outcome": c.outcome.value,
        "model": c.model,
        "error": c.error,
        "finish_reason": c.finish_reason,
        "prompt_tokens": None if c.prompt_ids is None else len(c.prompt_ids),
        "completion_tokens": None if c.completion_ids is None else len(c.completion_ids),
        "received_at": c.received_at,
        "first_byte_at": fb,
        "done_at": c.done_at,
        "ttfb_ms": None if fb is None else round((fb - c.received_at) * 1000, 1),
        "latency_ms": round((c.done_at - c.received_at) * 1000, 1),
        "bar": {
            "left": 100 * (c.received_at - t0) / span,
            "wait": max(0.15, 100 * (wait_end - c.received_at) / span),
            "stream": max(0.0, 100 * (c.done_at - wait_end) / span) if fb is not None else 0.0,
        },
        "metadata": {k: v for k, v in (c.metadata or {}).items() if k not in _SHOWN_APART},
    }


def upstream_error(c: CallRecord) -> Any:
    """What went wrong in a call: the proxy's error, else the error body an upstream answered
    with (a 400's ``{"error": {...}}``, relayed as is), else None."""
    if c.error is not None:
        return c.error
    if c.status_code is not None and c.status_code >= 400:
        resp = c.response
        if isinstance(resp, dict):
            return resp.get("error", resp)
        return resp if resp is not None else f"HTTP {c.status_code}"
    return None


def call_detail(c: CallRecord, url_base: str = "$ORCHARD_URL") -> dict[str, Any]:
    """A call's full record, as the raw-JSON views show it; ``url_base``: where "copy as curl" points."""
    from orchard_rec.ui.calls import curl_of, stream_events

    meta = dict(c.metadata or {})
    shown = {k: meta.pop(k) for k in _SHOWN_APART if k in meta}

    return {
        "seq": c.seq,
        "call_id": c.call_id,
        "dialect": c.dialect.value,
        "method": c.method,
        "path": c.path,
        "status_code": c.status_code,
        "outcome": c.outcome.value,
        "headers": dict(c.headers or {}),
        "request": c.request,
        "upstream_request": c.upstream_request,
        "response": c.response,
        "error": upstream_error(c),
        "usage": c.usage,
        "metadata": meta,
        "response_headers": shown.get("response_headers"),
        "chat": chat_of(c),
        "events": stream_events(c),
        "curl": curl_of(c, url_base),
    }


def chat_of(c: CallRecord) -> list[dict[str, Any]]:
    """The conversation a call sent, then the answer it got (flagged ``answer``)."""
    turns = conversation(c.request, c.dialect.value)
    answer = response_turn(c.response, c.dialect.value)
    if answer is not None:
        answer["answer"] = True
        turns.append(answer)
    return turns


def _decode_one(tok: Any, i: int) -> str:
    try:
        return str(tok.decode([i], skip_special_tokens=False))
    except TypeError:
        return str(tok.decode([i]))


def recorded_vocab(calls: Sequence[CallRecord]) -> dict[int, str]:
    """Token texts the upstream itself reported (chat ``logprobs.content[].token``) for generated ids."""
    vocab: dict[int, str] = {}
    for c in calls:
        ids = c.completion_ids
        resp = c.response
        if not ids or not isinstance(resp, dict):
            continue
        for choice in resp.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            content = (
                (choice.get("logprobs") or {}).get("content")
                if isinstance(choice.get("logprobs"), dict)
                else None
            )
            if isinstance(content, list) and len(content) == len(ids):
                for i, entry in zip(ids, content):
                    if isinstance(entry, dict) and isinstance(entry.get("token"), str):
                        vocab.setdefault(int(i), entry["token"])
            break
    return vocab


def _sample_tokens(s: Sample) -> dict[str, Any]:
    p = s.prompt_length
    kind = [0] * p + [1] * s.response_length  # 0 prompt, 1 observation, 2 generated
    for t in s.turns:
        for k in range(p + t.start, p + t.end):
            kind[k] = 2
    return {
        "index": s.index,
        "ids": s.tokens,
        "mask": [0] * p + list(s.loss_mask),
        "lp": [None] * p
        + [float(x) if kind[p + k] == 2 else None for k, x in enumerate(s.rollout_log_probs)],
        "kind": kind,
        "w": None if s.token_weights is None else [None] * p + list(s.token_weights),
        # the policy version that sampled each generated token (asynchronous RL), drawn as a band
        "v": None if (per := s.versions_per_token()) is None else [None] * p + per,
    }


def _first_mismatch(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class SessionView:
    summary: SessionSummary
    calls: list[CallRecord]
    call_rows: list[dict[str, Any]]
    samples: list[Sample]
    sample_tokens: list[dict[str, Any]]
    splits: dict[int, dict[str, Any]]
    vocab: dict[int, str]
    token_source: str
    start: float
    span: float

    def data(self, *, with_calls: bool = False) -> dict[str, Any]:
        """The page's data blob (and the session JSON API)."""
        out: dict[str, Any] = {
            "session": _summary_json(self.summary),
            "calls": self.call_rows,
            "vocab": {str(k): v for k, v in self.vocab.items()},
            "token_source": self.token_source,
            "samples": self.sample_tokens,
        }
        if with_calls:
            out["call_details"] = {str(c.seq): call_detail(c) for c in self.calls}
        return out


def _summary_json(s: SessionSummary) -> dict[str, Any]:
    o = s.outcome
    return {
        "id": s.id,
        "harness": s.harness,
        "calls": s.call_count,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "outcome": None
        if o is None
        else {
            "reward": o.reward,
            "status": o.status,
            "step_values": None if o.step_values is None else list(o.step_values),
            "metadata": dict(o.metadata),
        },
    }


def session_view(
    store: Store,
    session_id: str,
    *,
    tokenizer: Any = None,
    on_mismatch: str = "split",
    credit: str = "assistant",
) -> SessionView:
    summary = store.session(session_id)
    if summary is None:
        raise UIError(f"no session {session_id!r}", 404)
    calls = sorted(store.calls(session_id), key=lambda c: (c.seq or 0, c.received_at))
    if on_mismatch not in ("split", "realign"):
        raise UIError(f"on_mismatch must be split or realign, got {on_mismatch!r}")
    try:
        selection = Selection(
            sessions=[session_id],
            on_mismatch=on_mismatch,
            credit=credit,
            image_token=image_token_id(tokenizer),  # thumbnails name their token runs
        )
        samples = list(iter_samples(store, selection))
    except (ValueError, OrchardError) as exc:  # an unknown credit policy, say
        raise UIError(str(exc)) from None
    t0 = min((c.received_at for c in calls), default=summary.created_at)
    t1 = max((c.done_at for c in calls), default=t0)
    span = max(t1 - t0, 1e-3)
    rows = [_call_row(c, t0, span) for c in calls]
    ids = {i for s in samples for i in s.tokens}
    if tokenizer is not None:
        vocab = {i: _decode_one(tokenizer, i) for i in ids}
        source = "tokenizer"
    else:
        rec = recorded_vocab(calls)
        vocab = {i: rec[i] for i in ids if i in rec}
        source = "recorded text" if vocab else "ids only"
    splits: dict[int, dict[str, Any]] = {}
    for s in samples:
        reason = s.metadata.get("reason")
        parent_index = s.metadata.get("split_from")
        if reason is None or not isinstance(parent_index, int) or parent_index >= len(samples):
            continue
        parent = samples[parent_index]
        pos = _first_mismatch(parent.tokens, s.tokens)
        lo = max(0, pos - 12)
        splits[s.index] = {
            "reason": reason,
            "parent": parent.index,
            "position": pos,
            "start": lo,
            "held": parent.tokens[lo : pos + 24],
            "sent": s.tokens[lo : pos + 24],
            "held_len": len(parent.tokens),
            "sent_len": s.prompt_length,
        }
    return SessionView(
        summary=summary,
        calls=calls,
        call_rows=rows,
        samples=samples,
        sample_tokens=[_sample_tokens(s) for s in samples],
        splits=splits,
        vocab=vocab,
        token_source=source,
        start=t0,
        span=span,
    )
