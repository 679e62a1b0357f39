"""Dashboards over time: calls and tokens per minute, latency percentiles, error rate, reward
distribution, per harness and model.

One read of the window's calls (times, harness, model, outcome, error, usage: no bodies, no
token ids) and one of its sessions' rewards; bucketed here. The window defaults to the recorded
data's span, at most its last six hours (not the clock's: a database copied from elsewhere shows);
a bucket is a whole number of minutes, about 120 of them across the window. Tokens come from
the usage the upstream reported (``prompt_tokens``/``completion_tokens``, or Anthropic's
``input_tokens``/``output_tokens``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from orchard_rec.reconstruct import numeric_reward
from orchard_rec.storage.models import Call, Session
from orchard_rec.storage.store import Store

__all__ = ["DashQuery", "dashboard"]

DEFAULT_SPAN = 6 * 3600.0


@dataclass
class DashQuery:
    since: float | None = None
    until: float | None = None
    harness: str = ""
    model: str = ""


def _epoch(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def _ts(x: float) -> datetime:
    return datetime.fromtimestamp(x, tz=UTC)


def _pct(sorted_values: list[float], p: float) -> float | None:
    """The ``p`` quantile by nearest rank (None for no value)."""
    if not sorted_values:
        return None
    k = max(0, math.ceil(p * len(sorted_values)) - 1)
    return sorted_values[k]


def _tokens(usage: Any) -> tuple[int, int]:
    if not isinstance(usage, dict):
        return 0, 0
    p = usage.get("prompt_tokens", usage.get("input_tokens"))
    c = usage.get("completion_tokens", usage.get("output_tokens"))
    return (p if isinstance(p, int) else 0), (c if isinstance(c, int) else 0)


def _read(store: Store, q: DashQuery) -> tuple[float, float, list[Any], list[float | None]]:
    """The window, its calls' light columns, and its sessions' numeric rewards."""
    c = Call.__table__.c
    with store.engine.connect() as conn:
        last = _epoch(conn.execute(select(func.max(c.received_at))).scalar())
        until = q.until if q.until is not None else (last or 0.0) + 1.0
        since = q.since
        if since is None:  # the data's own span, at most the last six hours of it
            first = _epoch(
                conn.execute(
                    select(func.min(c.received_at)).where(c.received_at >= _ts(until - DEFAULT_SPAN))
                ).scalar()
            )
            since = 60.0 * math.floor((first if first is not None else until - DEFAULT_SPAN) / 60.0)
        stmt = select(c.received_at, c.done_at, c.harness, c.model, c.outcome, c.error, c.usage).where(
            c.received_at >= _ts(since), c.received_at < _ts(until)
        )
        if q.harness:
            stmt = stmt.where(c.harness == q.harness)
        if q.model:
            stmt = stmt.where(c.model == q.model)
        rows = list(conn.execute(stmt))
        s = Session.__table__.c
        rstmt = select(s.reward).where(s.outcome_at.is_not(None), s.updated_at >= _ts(since))
        if q.harness:
            rstmt = rstmt.where(s.harness == q.harness)
        rewards = [numeric_reward(_json(r)) for (r,) in conn.execute(rstmt)]
    return since, until, rows, rewards


def dashboard(store: Store, q: DashQuery) -> dict[str, Any]:
    since, until, rows, rewards = _read(store, q)
    span = max(until - since, 60.0)
    bucket = 60.0 * max(1, round(span / 120 / 60))
    n = max(1, math.ceil(span / bucket))
    calls = [0] * n
    errors = [0] * n
    prompt = [0] * n
    completion = [0] * n
    lat: list[list[float]] = [[] for _ in range(n)]
    by_harness: dict[str, list[int]] = defaultdict(lambda: [0] * n)
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for received, done, harness, model, outcome, error, usage in rows:
        t0, t1 = _epoch(received) or 0.0, _epoch(done) or 0.0
        i = min(n - 1, int((t0 - since) // bucket))
        bad = outcome != "ok" or error is not None
        p, k = _tokens(_json(usage))
        ms = max(0.0, (t1 - t0) * 1000)
        calls[i] += 1
        errors[i] += bad
        prompt[i] += p
        completion[i] += k
        lat[i].append(ms)
        by_harness[harness or "(none)"][i] += 1
        row = table.setdefault(
            (harness or "(none)", model or "(none)"),
            {"calls": 0, "errors": 0, "prompt": 0, "completion": 0, "lat": []},
        )
        row["calls"] += 1
        row["errors"] += bad
        row["prompt"] += p
        row["completion"] += k
        row["lat"].append(ms)
    per_min = 60.0 / bucket
    for xs in lat:
        xs.sort()
    breakdown = []
    for (h, m), row in sorted(table.items(), key=lambda kv: -kv[1]["calls"]):
        ls = sorted(row.pop("lat"))
        breakdown.append(
            {
                "harness": h,
                "model": m,
                **row,
                "error_rate": row["errors"] / row["calls"],
                "p50_ms": _pct(ls, 0.5),
                "p99_ms": _pct(ls, 0.99),
            }
        )
    return {
        "since": since,
        "until": until,
        "bucket_s": bucket,
        "t": [since + k * bucket for k in range(n)],
        "calls_per_min": [x * per_min for x in calls],
        "by_harness": {h: [x * per_min for x in v] for h, v in sorted(by_harness.items())},
        "prompt_tokens_per_min": [x * per_min for x in prompt],
        "completion_tokens_per_min": [x * per_min for x in completion],
        "p50_ms": [_pct(x, 0.5) for x in lat],
        "p90_ms": [_pct(x, 0.9) for x in lat],
        "p99_ms": [_pct(x, 0.99) for x in lat],
        "error_rate": [None if not k else e / k for e, k in zip(errors, calls)],
        "totals": {
            "calls": len(rows),
            "errors": sum(errors),
            "prompt_tokens": sum(prompt),
            "completion_tokens": sum(completion),
        },
        "rewards": _histogram([r for r in rewards if r is not None]),
        "breakdown": breakdown,
    }


def _json(v: Any) -> Any:
    import orjson

    return orjson.loads(v) if isinstance(v, (str, bytes)) else v


def _histogram(values: list[float], bins: int = 10) -> dict[str, Any]:
    """Counts of ``values`` in ``bins`` equal bins over [min(0, lo), max(1, hi)]."""
    if not values:
        return {"edges": [], "counts": [], "n": 0, "mean": None}
    lo, hi = min(0.0, min(values)), max(1.0, max(values))
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return {
        "edges": [lo + k * width for k in range(bins + 1)],
        "counts": counts,
        "n": len(values),
        "mean": sum(values) / len(values),
    }
