"""Prometheus metrics for one proxy app (own registry, so several apps can share a process)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["Metrics"]

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Caches(Collector):
    """The per-session caches (``app.cache_stats``), read when scraped: ``orchard_cache_entries``,
    ``orchard_cache_bytes``, ``orchard_cache_max_bytes`` (gauges) and ``orchard_cache_hits_total``,
    ``orchard_cache_misses_total`` (counters), labelled by ``cache``."""

    _GAUGES = (
        ("entries", "Sessions (keys) a per-session cache holds"),
        ("bytes", "Bytes a per-session cache holds (by its own count)"),
        ("max_bytes", "A per-session cache's bound in bytes"),
    )
    _COUNTERS = (
        ("hits", "Calls a per-session cache served (O(what is new))"),
        ("misses", "Calls a per-session cache did not hold (O(the context))"),
    )

    def __init__(self, read: Callable[[], dict[str, dict[str, int]]]) -> None:
        self._read = read

    def describe(self) -> Iterator[Metric]:
        """The names, without reading the caches (the registry asks when this is registered)."""
        return self._families({})

    def collect(self) -> Iterator[Metric]:
        return self._families(self._read())

    def _families(self, stats: dict[str, dict[str, int]]) -> Iterator[Metric]:
        for key, doc in self._GAUGES:
            g = GaugeMetricFamily(f"orchard_cache_{key}", doc, labels=["cache"])
            for name, s in stats.items():
                g.add_metric([name], s.get(key, 0))
            yield g
        for key, doc in self._COUNTERS:
            c = CounterMetricFamily(f"orchard_cache_{key}", doc, labels=["cache"])
            for name, s in stats.items():
                c.add_metric([name], s.get(key, 0))
            yield c


class _SpoolSync(Collector):
    """The spool's fsyncs (``Recorder.sync_stats``), read when scraped: ``orchard_spool_fsyncs_total``
    (counter), ``orchard_spool_unsynced_age_seconds`` (how long the oldest write not yet fsync'd has
    waited; 0 when none), ``orchard_spool_unsynced_max_age_seconds`` (the longest any write waited
    for its fsync so far: what a power loss could have taken at worst) and
    ``orchard_spool_fsync_interval_seconds`` (``process`` durability's bound on both; 0 otherwise)."""

    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self._read = read

    def describe(self) -> Iterator[Metric]:
        return self._families({})

    def collect(self) -> Iterator[Metric]:
        return self._families(self._read())

    def _families(self, s: dict[str, float]) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "orchard_spool_fsyncs", "fsyncs of the local spool", value=s.get("fsyncs", 0)
        )
        for name, key, doc in (
            ("unsynced_age_seconds", "unsynced_age_s", "Age of the oldest spool write not yet fsync'd"),
            ("unsynced_max_age_seconds", "max_unsynced_age_s", "Longest a spool write waited for its fsync"),
            ("fsync_interval_seconds", "fsync_interval_s", "Bound on a spool write's wait for its fsync"),
        ):
            yield GaugeMetricFamily(f"orchard_spool_{name}", doc, value=s.get(key, 0))


class Metrics:
    def __init__(
        self,
        queue_depth: Callable[[], float],
        spool_depth: Callable[[], float] = lambda: 0,
        inflight: Callable[[], float] = lambda: 0,
        queued_bytes: Callable[[], float] = lambda: 0,
        paced: Callable[[], float] = lambda: 0,
        caches: Callable[[], dict[str, dict[str, int]]] | None = None,
        *,
        spool_sync: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        if caches is not None:
            r.register(_Caches(caches))
        if spool_sync is not None:
            r.register(_SpoolSync(spool_sync))
        self.calls = Counter("orchard_calls", "Calls handled", ["dialect", "outcome"], registry=r)
        self.errors = Counter(
            "orchard_errors", "Calls that ended in an error", ["dialect", "kind"], registry=r
        )
        self.bytes = Counter("orchard_bytes", "Body bytes relayed", ["direction"], registry=r)
        self.duration = Histogram(
            "orchard_call_duration_seconds",
            "Request received to last byte sent",
            ["dialect"],
            buckets=_LATENCY,
            registry=r,
        )
        self.ttfb = Histogram(
            "orchard_upstream_ttfb_seconds",
            "Request received to first upstream byte",
            ["dialect"],
            buckets=_LATENCY,
            registry=r,
        )
        depth = Gauge("orchard_writer_queue_depth", "Calls waiting to be committed", registry=r)
        depth.set_function(queue_depth)
        spool = Gauge(
            "orchard_spool_depth", "Records in the local spool, not yet in the database", registry=r
        )
        spool.set_function(spool_depth)
        busy = Gauge("orchard_inflight_calls", "Calls being relayed", registry=r)
        busy.set_function(inflight)
        qbytes = Gauge("orchard_writer_queue_bytes", "Bytes of the calls waiting to be committed", registry=r)
        qbytes.set_function(queued_bytes)
        pacing = Gauge(
            "orchard_paced_calls",
            "Calls so far that waited for the writer before being read (pacing)",
            registry=r,
        )
        pacing.set_function(paced)

        self._children: dict[tuple[str, str], tuple[list[float], _Hist, _Hist, list[float] | None]] = {}
        self._hists: dict[str, tuple[_Hist, _Hist]] = {}
        self._counts: list[tuple[Any, list[float]]] = []
        """Each counter child and its running total (``[value]``), set into the child by ``_flush``."""
        self._in = [0.0]
        self._out = [0.0]
        """Body bytes in and out so far."""
        self._counts.append((self.bytes.labels("in"), self._in))
        self._counts.append((self.bytes.labels("out"), self._out))

    def observe_call(
        self, dialect: str, outcome: str, bytes_in: int, bytes_out: int, duration: float, ttfb: float | None
    ) -> None:
        """One finished call, added up here without a lock (the event loop's thread calls this, and
        ``render``, which sets the totals into the prometheus_client metrics): what their ``inc`` and
        ``observe`` would make of it, the same floats added in the same order. The labelled children
        are made at a (dialect, outcome)'s first call, as ``inc`` would (their ``_created``)."""
        kids = self._children.get((dialect, outcome))
        if kids is None:
            kids = self._add(dialect, outcome)
        if bytes_in < 0 or bytes_out < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        calls, dur, first, errors = kids
        calls[0] += 1
        self._in[0] += bytes_in
        self._out[0] += bytes_out
        dur.sum += duration  # ``_Hist.observe``, written out (a call less for each)
        if duration <= dur.top:
            dur.counts[bisect_left(dur.bounds, duration)] += 1
        if ttfb is not None:
            first.sum += ttfb
            if ttfb <= first.top:
                first.counts[bisect_left(first.bounds, ttfb)] += 1
        if errors is not None:
            errors[0] += 1

    def _add(self, dialect: str, outcome: str) -> tuple[list[float], _Hist, _Hist, list[float] | None]:
        calls = [0.0]
        self._counts.append((self.calls.labels(dialect, outcome), calls))
        hists = self._hists.get(dialect)
        if hists is None:
            hists = self._hists[dialect] = (
                _Hist(self.duration.labels(dialect)),
                _Hist(self.ttfb.labels(dialect)),
            )
        errors: list[float] | None = None
        if outcome != "ok":
            errors = [0.0]
            self._counts.append((self.errors.labels(dialect, outcome), errors))
        kids = self._children[(dialect, outcome)] = (calls, hists[0], hists[1], errors)
        return kids

    def _flush(self) -> None:
        """The totals so far into the prometheus_client metrics (what ``generate_latest`` reads)."""
        for child, total in self._counts:
            child._value.set(total[0])
        for hists in self._hists.values():
            for h in hists:
                h.flush()

    def render(self) -> bytes:
        self._flush()
        return generate_latest(self.registry)


class _Hist:
    """A histogram child's observations added up: its sum and the count of each bucket (not
    cumulative), as ``Histogram.observe`` keeps them (a value goes to the first bucket whose bound
    it does not exceed; NaN to none)."""

    __slots__ = ("bounds", "child", "counts", "sum", "top")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)
        self.top = self.bounds[-1]
        self.sum = 0.0
        self.counts = [0.0] * len(self.bounds)

    def observe(self, v: float) -> None:
        self.sum += v
        if v <= self.top:  # +Inf: all but NaN
            self.counts[bisect_left(self.bounds, v)] += 1

    def flush(self) -> None:
        c = self.child
        c._sum.set(self.sum)
        for value, n in zip(c._buckets, self.counts, strict=True):
            value.set(n)
