"""``Metrics.observe_call`` adds calls up without prometheus_client's per-call locks; ``/metrics``
must read exactly as when every call went through ``inc`` and ``observe`` (names, labels, values,
``_created``), whatever the calls' values (bucket bounds, beyond the last bound, NaN, 0)."""

from __future__ import annotations

import math
import random
from typing import Any

import prometheus_client.metrics
import pytest
from prometheus_client import generate_latest

from orchard_rec.proxy.metrics import Metrics


def _metrics() -> Metrics:
    return Metrics(lambda: 3, lambda: 1, lambda: 2, lambda: 4096, lambda: 0)


def _observe_directly(m: Metrics, children: dict[Any, Any], *call: Any) -> None:
    """The implementation before: each call through prometheus_client's ``inc`` / ``observe``."""
    dialect, outcome, bytes_in, bytes_out, duration, ttfb = call
    kids = children.get((dialect, outcome))
    if kids is None:
        kids = children[(dialect, outcome)] = (
            m.calls.labels(dialect, outcome),
            m.duration.labels(dialect),
            m.ttfb.labels(dialect),
            m.errors.labels(dialect, outcome) if outcome != "ok" else None,
        )
    calls, dur, first, errors = kids
    calls.inc()
    m.bytes.labels("in").inc(bytes_in)
    m.bytes.labels("out").inc(bytes_out)
    dur.observe(duration)
    if ttfb is not None:
        first.observe(ttfb)
    if errors is not None:
        errors.inc()


def _calls(n: int) -> list[tuple[Any, ...]]:
    rng = random.Random(7)
    edges = [0.0005, 0.001, 0.0025, 0.1, 1, 300, 301.5, 0.0, 1e-9, math.nan, 1e6]
    out = []
    for k in range(n):
        dialect = rng.choice(["chat", "chat", "responses", "messages"])
        outcome = rng.choice(["ok", "ok", "ok", "upstream_error", "aborted"])
        duration = edges[k] if k < len(edges) else rng.expovariate(1 / 0.05)
        ttfb = None if k % 7 == 3 else (edges[-1 - k] if k < len(edges) else rng.random() * duration)
        out.append((dialect, outcome, rng.randrange(0, 1 << 20), rng.randrange(0, 1 << 16), duration, ttfb))
    return out


def test_metrics_read_as_when_every_call_went_through_prometheus_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prometheus_client.metrics.time, "time", lambda: 1796000000.25)  # ``_created``
    fast, slow = _metrics(), _metrics()  # ``slow`` read as before: the registry alone
    children: dict[Any, Any] = {}
    assert fast.render() == generate_latest(slow.registry)
    calls = _calls(3000)
    for k, call in enumerate(calls):
        fast.observe_call(*call)
        _observe_directly(slow, children, *call)
        if k in (0, 5, 11, 400, 2999):  # scraped now and then: the totals so far
            assert fast.render() == generate_latest(slow.registry)
    text = fast.render().decode()
    assert 'orchard_call_duration_seconds_bucket{dialect="chat",le="+Inf"}' in text
    assert 'orchard_errors_total{dialect="responses",kind="aborted"}' in text
    assert "orchard_calls_created" in text and "orchard_upstream_ttfb_seconds_sum" in text


def test_a_negative_byte_count_is_refused_as_by_the_counter() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        _metrics().observe_call("chat", "ok", -1, 0, 0.1, None)
