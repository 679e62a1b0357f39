"""Prometheus metrics for one proxy app (own registry, so several apps can share a process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(
        self,
        queue_depth: Callable[[], float],
        spool_depth: Callable[[], float] = lambda: 0,
        inflight: Callable[[], float] = lambda: 0,
        queued_bytes: Callable[[], float] = lambda: 0,
        paced: Callable[[], float] = lambda: 0,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
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

        self._children: dict[tuple[str, str], tuple[object, ...]] = {}
        self._bytes_in = self.bytes.labels("in")
        self._bytes_out = self.bytes.labels("out")

    def observe_call(
        self, dialect: str, outcome: str, bytes_in: int, bytes_out: int, duration: float, ttfb: float | None
    ) -> None:
        """One finished call: the labelled children are looked up once per (dialect, outcome), not per call."""
        kids = self._children.get((dialect, outcome))
        if kids is None:
            kids = self._children[(dialect, outcome)] = (
                self.calls.labels(dialect, outcome),
                self.duration.labels(dialect),
                self.ttfb.labels(dialect),
                self.errors.labels(dialect, outcome) if outcome != "ok" else None,
            )
        calls, dur, first, errors = kids
        calls.inc()  # type: ignore[attr-defined]
        self._bytes_in.inc(bytes_in)
        self._bytes_out.inc(bytes_out)
        dur.observe(duration)  # type: ignore[attr-defined]
        if ttfb is not None:
            first.observe(ttfb)  # type: ignore[attr-defined]
        if errors is not None:
            errors.inc()  # type: ignore[attr-defined]

    def render(self) -> bytes:
        return generate_latest(self.registry)
