"""A fleet of upstreams behind one proxy address: which server a call goes to, and whether it answers.

``Fleet`` is sans-io: fed what happened (a call started or ended, a connection refused, a health
check answered), it says which server the next call should go to. Routing:

- ``session`` (default): consistent hashing on the session id with bounded loads (Mirrokni,
  Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018): the session's point on a
  ring of virtual nodes names its server, so its calls reach the server that holds its prefix
  cache; a server may not go above ``ceil((1 + epsilon) * average)`` calls in flight (the new call
  counted, and never below ``min_load``), past which the session takes the next server on the ring.
  The floor is measured: eight sessions on two vLLM servers, four at home on each, spilled whenever
  one server's four were generating while the other's were between turns (avg 2.5, bound 4). Calls without a session go
  to the least busy server.
- ``least-busy``: the fewest calls in flight (ties: the fewest calls so far).
- ``round-robin``: each healthy server in turn.

Health: a server is ejected when a connection to it fails (passively, by the relay) or when its
active check fails (``watch``: ``GET <base>/models`` every ``interval`` seconds, any status below
500 counts; a check that times out counts only the ``SLOW_CHECKS``-th time in a row: a busy
server answers late); it is re-admitted when a check passes again. Ejected servers get no calls while one is
healthy; when none is, every server is tried (the checks may be stale).

Retries: ``open_upstream`` tries another server only when the server never had the call: the
connection could not be made (refused, unreachable, connect timeout), or the request body could not
be written (a pooled connection to a server that died). Any other failure is the call's, a reset
before the status line included: the server may have started generating, and a generation is never
run twice.

The proxy's session state (tito ids, token mode's caches) is per session, not per server, so a
session that moves to another server goes on exactly.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchard_rec.errors import UpstreamProtocolError, UpstreamTimeout, UpstreamUnavailable
from orchard_rec.records import CallOutcome

__all__ = [
    "CONNECT_ERRORS",
    "Fleet",
    "Route",
    "Upstream",
    "never_started",
    "open_upstream",
    "upstream_errors",
    "watch",
]

log = logging.getLogger("orchard_rec.proxy")

Route = Literal["session", "least-busy", "round-robin"]

SLOW_CHECKS = 3
"""Health checks in a row that must time out before a server is ejected for it: a server busy
generating (vLLM's engine in its API process) may answer a check late, and is not dead."""

VNODES = 160
"""Points per server on the ring (more: a more even share of the sessions)."""

CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
)
"""Failures before the server had the call: safe to try another server."""


def never_started(exc: BaseException) -> bool:
    """Whether a failed request cannot have reached the server whole: no connection was made, or
    the request body could not be written (a stale keep-alive connection to a server that died: it
    never had the whole request, so it cannot have started it)."""
    if isinstance(exc, CONNECT_ERRORS):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and "Can not write request body" in str(exc)


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(eq=False)
class Upstream:
    """One server and what the proxy knows of it."""

    url: str
    inflight: int = 0
    calls: int = 0
    failures: int = 0
    ejections: int = 0
    healthy: bool = True
    slow_checks: int = 0
    """Health checks in a row that timed out (a busy server answers late: ``SLOW_CHECKS`` eject it)."""
    checked_at: float | None = None
    error: str | None = None

    def figures(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "inflight": self.inflight,
            "calls": self.calls,
            "failures": self.failures,
            "ejections": self.ejections,
            "slow_checks": self.slow_checks,
            "checked_at": self.checked_at,
            "error": self.error,
        }


@dataclass(eq=False)
class Fleet:
    """The servers, their ring, and the routing policy (sans-io)."""

    urls: Iterable[str]
    route: Route = "session"
    epsilon: float = 0.5
    min_load: int = 8
    """Calls in flight a server may always hold, whatever the average: below this a spill buys no
    balance (a server batches them together) and costs the session its prefix cache."""
    servers: list[Upstream] = field(init=False)
    _ring: list[tuple[int, int]] = field(init=False)
    _turn: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        urls = list(dict.fromkeys(self.urls))
        if not urls:
            raise ValueError("a fleet needs at least one upstream")
        if self.epsilon <= 0:
            raise ValueError("epsilon must be above 0")
        self.servers = [Upstream(u) for u in urls]
        self._ring = sorted((_point(f"{u}#{i}"), n) for n, u in enumerate(urls) for i in range(VNODES))

    # -- routing -----------------------------------------------------------------------------------

    def candidates(self, exclude: Iterable[Upstream] = ()) -> list[Upstream]:
        """The servers a call may go to: the healthy ones not excluded, else every one not excluded."""
        left = [s for s in self.servers if s not in set(exclude)]
        return [s for s in left if s.healthy] or left

    def bound(self, among: list[Upstream]) -> int:
        """The most calls in flight a server may hold once the new call is counted."""
        total = sum(s.inflight for s in among) + 1
        return max(math.ceil((1 + self.epsilon) * total / len(among)), self.min_load)

    def pick(self, key: str | None, exclude: Iterable[Upstream] = ()) -> Upstream | None:
        """The server for a call of session ``key`` (None: no session); None when all are excluded."""
        if len(self.servers) == 1 and not exclude:  # a lone server takes every call, healthy or not
            return self.servers[0]
        among = self.candidates(exclude)
        if not among:
            return None
        if len(among) == 1:
            return among[0]
        if self.route == "round-robin":
            self._turn += 1
            return among[self._turn % len(among)]
        if self.route == "session" and key is not None:
            return self._ring_pick(key, among)
        return min(among, key=lambda s: (s.inflight, s.calls))

    def home(self, key: str) -> Upstream:
        """The session's server on the ring when every server is free (no load, no health)."""
        i = bisect.bisect(self._ring, (_point(key), -1)) % len(self._ring)
        return self.servers[self._ring[i][1]]

    def _ring_pick(self, key: str, among: list[Upstream]) -> Upstream:
        cap = self.bound(among)
        allowed = set(among)
        ring = self._ring
        start = bisect.bisect(ring, (_point(key), -1))
        seen: set[int] = set()
        for step in range(len(ring)):
            n = ring[(start + step) % len(ring)][1]
            if n in seen:
                continue
            seen.add(n)
            s = self.servers[n]
            if s in allowed and s.inflight + 1 <= cap:
                return s
            if len(seen) == len(self.servers):
                break
        return min(among, key=lambda s: s.inflight)  # unreachable: the least loaded always fits

    # -- what happened -----------------------------------------------------------------------------

    def begin(self, s: Upstream) -> None:
        s.inflight += 1
        s.calls += 1

    def end(self, s: Upstream) -> None:
        s.inflight -= 1

    def failed(self, s: Upstream, error: str) -> None:
        """A connection to ``s`` failed: ejected until a health check passes."""
        s.failures += 1
        self.eject(s, error)

    def eject(self, s: Upstream, error: str) -> None:
        if s.healthy:
            s.ejections += 1
            log.warning("upstream %s ejected: %s", s.url, error)
        s.healthy = False
        s.error = error[:300]

    def checked(self, s: Upstream, ok: bool, error: str | None = None, *, slow: bool = False) -> None:
        """An active health check's result: re-admits ``s``, or ejects it (a ``slow`` one, timed
        out, only the ``SLOW_CHECKS``-th in a row)."""
        s.checked_at = time.time()
        if ok:
            if not s.healthy:
                log.warning("upstream %s re-admitted", s.url)
            s.healthy, s.error, s.slow_checks = True, None, 0
            return
        s.slow_checks = s.slow_checks + 1 if slow else 0
        if slow and s.slow_checks < SLOW_CHECKS:
            s.error = (error or "health check timed out")[:300]
            return
        self.eject(s, error or "health check failed")

    # -- visibility --------------------------------------------------------------------------------

    def figures(self) -> list[dict[str, Any]]:
        return [s.figures() for s in self.servers]

    def summary(self) -> dict[str, Any]:
        """``/healthz``'s ``upstream``: the first server's URL, check time and error, and whether any
        server takes calls (``reachable``: None until a lone server's first check)."""
        first = self.servers[0]
        unknown = first.checked_at is None and len(self.servers) == 1
        return {
            "url": first.url,
            "reachable": None if unknown else any(s.healthy for s in self.servers),
            "checked_at": first.checked_at,
            "error": first.error,
        }

    def collector(self) -> Collector:
        return _FleetCollector(self)


class _FleetCollector(Collector):
    """``orchard_upstream_inflight``, ``orchard_upstream_healthy`` (gauges), ``orchard_upstream_calls``,
    ``orchard_upstream_failures``, ``orchard_upstream_ejections`` (counters), labelled by ``upstream``."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        servers = self.fleet.servers
        g = GaugeMetricFamily(
            "orchard_upstream_inflight", "Calls in flight on an upstream", labels=["upstream"]
        )
        h = GaugeMetricFamily(
            "orchard_upstream_healthy", "1: the upstream takes calls; 0: ejected", labels=["upstream"]
        )
        for s in servers:
            g.add_metric([s.url], s.inflight)
            h.add_metric([s.url], 1 if s.healthy else 0)
        yield g
        yield h
        for name, doc in (
            ("calls", "Calls sent to an upstream"),
            ("failures", "Connections to an upstream that failed"),
            ("ejections", "Times an upstream was ejected"),
        ):
            c = CounterMetricFamily(f"orchard_upstream_{name}", doc, labels=["upstream"])
            for s in servers:
                c.add_metric([s.url], getattr(s, name))
            yield c


# -- the async side ----------------------------------------------------------------------------------


def open_upstream(
    fleet: Fleet,
    client: Any,
    key: str | None,
    method: str,
    url_of: Callable[[str], str],
    metadata: dict[str, Any],
    routing_header: str | None = None,
    *,
    prefer: str | None = None,
    picked: Callable[[str], None] | None = None,
    **kw: Any,
) -> _Opened:
    """The response of the server ``fleet`` picks for session ``key`` (``url_of(base)``: the URL
    there; ``client``: the proxy's ``upclient.UpstreamClient``, or an aiohttp ``ClientSession``), recorded as ``metadata["upstream"]`` (the call's); ``routing_header`` carries ``key``.
    ``prefer``: the server to try first while it is healthy (a call's own server, for the rest of
    its generation); ``picked(url)`` is told each server just before the request goes to it.
    A server that never had the call (``never_started``) is ejected and the next one tried; any
    other failure is the call's and propagates. An async context manager (a plain class: the
    generator-based one of ``contextlib`` costs a few microseconds per call on the event loop)."""
    if routing_header and key:
        kw["headers"][routing_header] = key
    return _Opened(fleet, client, key, method, url_of, metadata, prefer, picked, kw)


class _Opened:
    """``open_upstream``'s context: the request sent on entry (retried on another server while
    none had it), the response released and the server's count taken back on exit."""

    __slots__ = (
        "client",
        "fleet",
        "key",
        "kw",
        "metadata",
        "method",
        "picked",
        "prefer",
        "resp",
        "server",
        "url_of",
    )

    def __init__(
        self,
        fleet: Fleet,
        client: Any,
        key: str | None,
        method: str,
        url_of: Callable[[str], str],
        metadata: dict[str, Any],
        prefer: str | None,
        picked: Callable[[str], None] | None,
        kw: dict[str, Any],
    ) -> None:
        self.fleet, self.client, self.key, self.method, self.url_of = fleet, client, key, method, url_of
        self.metadata, self.prefer, self.picked, self.kw = metadata, prefer, picked, kw
        self.server: Upstream | None = None
        self.resp: Any = None

    async def __aenter__(self) -> Any:
        fleet = self.fleet
        tried: list[Upstream] = []
        while True:
            s = _preferred(fleet, self.prefer, tried) or fleet.pick(self.key, tried)
            assert s is not None  # pick is None only once every server was tried, and then we raised
            self.metadata["upstream"] = s.url
            if self.picked is not None:
                self.picked(s.url)
            fleet.begin(s)
            try:
                resp = await self.client.request(self.method, self.url_of(s.url), **self.kw)
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                fleet.end(s)
                retry = never_started(exc)
                if retry or isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
                    fleet.failed(s, f"{type(exc).__name__}: {exc}")  # passive ejection
                tried.append(s)
                if not retry or len(tried) >= len(fleet.servers):
                    raise
                continue
            except BaseException:
                fleet.end(s)
                raise
            self.server, self.resp = s, resp
            return await resp.__aenter__()

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        s, resp = self.server, self.resp
        assert s is not None and resp is not None
        try:
            if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
                self.fleet.failed(s, f"{type(exc).__name__}: {exc}")
            await resp.__aexit__(et, exc, tb)
        finally:
            self.fleet.end(s)


def _preferred(fleet: Fleet, url: str | None, tried: list[Upstream]) -> Upstream | None:
    """The server at ``url`` when it is healthy and not tried yet (else the fleet picks)."""
    if url is None:
        return None
    for s in fleet.servers:
        if s.url == url:
            return s if s.healthy and s not in tried else None
    return None


_SLOW = ("TimeoutError", "ServerTimeoutError", "SocketTimeoutError")


async def check(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str], timeout: float
) -> str | None:
    """One health check of base ``url``: None when it answers (a status below 500), else why not."""
    target = url + "/models" if url.endswith("/v1") else url
    try:
        async with client.get(target, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            await r.read()
            return None if r.status < 500 else f"health check answered {r.status}"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


async def watch(
    fleet: Fleet, client: aiohttp.ClientSession, interval: float, headers: dict[str, str], timeout: float
) -> None:
    """Check every server every ``interval`` seconds, all at once (runs until cancelled)."""
    while True:
        results = await asyncio.gather(*(check(client, s.url, headers, timeout) for s in fleet.servers))
        for s, error in zip(fleet.servers, results, strict=True):
            fleet.checked(s, error is None, error, slow=error is not None and error.startswith(_SLOW))
        await asyncio.sleep(interval)


class upstream_errors:  # a class used as the function it was: ``with upstream_errors(cap, url):``
    """Map the upstream client's failures to the proxy's errors, recorded on the call's capture
    ``cap`` (``upstream``: the server, unless the call's ``metadata["upstream"]`` names the one
    the fleet picked). Both front doors map them so. (A plain class: ``contextlib``'s
    generator-based context costs a few microseconds per call on the event loop.)"""

    __slots__ = ("cap", "upstream")

    def __init__(self, cap: Any, upstream: str) -> None:
        self.cap = cap
        self.upstream = cap.metadata.get("upstream", upstream)

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        cap, upstream = self.cap, self.upstream
        if isinstance(
            exc, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
        ):
            cap.fail(CallOutcome.FAILED, f"{type(exc).__name__}: {exc}")
            raise UpstreamUnavailable(f"upstream {upstream} is unreachable: {exc}") from exc
        if isinstance(exc, TimeoutError):
            cap.fail(CallOutcome.FAILED, "upstream timed out")
            raise UpstreamTimeout(f"upstream {upstream} timed out") from exc
        if isinstance(exc, aiohttp.ClientError):
            cap.fail(CallOutcome.FAILED, f"{type(exc).__name__}: {exc}")
            raise UpstreamProtocolError(
                f"upstream {upstream} answered something the proxy cannot relay: {exc}"
            ) from exc
