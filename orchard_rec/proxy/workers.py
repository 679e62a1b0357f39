"""``serve --workers N``: N proxy processes on one port, each with its own spool, watched by a parent.

The parent binds the port with ``SO_REUSEPORT`` (and keeps it bound, never listening, so a
restarted worker gets it back), then forks N workers; each listens on the same address with
``SO_REUSEPORT`` and the kernel spreads the connections among them. A worker is a whole proxy
(``server.serve_proxy``): its own event loop, recorder and spool, ``SPOOL.w<k>`` (``spool_paths``).
Any call may land on any worker: every worker writes to the one database, and what a session's
next call needs (tito's token branches, token mode's parsed prefixes) is rebuilt from the
database on a cache miss, as for replicas behind a load balancer. Each call records which
worker took it (``metadata["worker"] = {"index", "pid"}``).

- A worker that dies (``kill -9``, the OOM killer) is started again at once with the same index,
  so its spool is replayed by the new one: nothing a client had received is lost.
- SIGTERM / SIGINT of the parent is forwarded to every worker (SIGTERM: each drains as a single
  ``serve`` does); a second one stops them at once. Workers run in their own process group (a
  terminal's Ctrl-C reaches the parent only, which forwards it once) and get SIGTERM if the
  parent dies (``PR_SET_PDEATHSIG``).
- Before the workers start, the parent replays the spools no worker of this run will own: those
  of a previous run with more workers (``SPOOL.w5`` when now N = 2), and ``SPOOL`` itself (a
  single-process run). It then holds ``SPOOL``'s lock, so a second ``serve`` on the same spool is
  refused as before.
- ``/metrics``: whichever worker takes the scrape asks the others over their private Unix sockets
  (``ProxyConfig.peers``, in a temporary folder of the parent's) and answers all of them, each
  sample labelled ``worker="<k>"`` (``gather_metrics``): sum over ``worker`` for the totals.
  ``/healthz`` is the answering worker's own, and says which (``worker``).
- The trainer's policy version (``POST /v1/orchard/policy``) reaches one worker; it tells the
  others over the same sockets (``tell_peers``), so every worker fences its calls with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from orchard_rec.proxy.config import ProxyConfig

__all__ = [
    "gather_metrics",
    "orphan_spools",
    "replay_orphans",
    "replay_spool",
    "serve_workers",
    "spool_paths",
    "tell_peers",
    "workers_count",
]

log = logging.getLogger("orchard_rec.server")

_FAST_DEATH_S = 5.0
"""A worker that dies sooner than this after its start counts towards ``_MAX_FAST_DEATHS``."""
_MAX_FAST_DEATHS = 10
"""Workers dying at start this many times in a row: something is wrong with all of them (the
database, the port); the parent stops instead of restarting them forever."""


def workers_count(value: str) -> int:
    """``--workers``: a count >= 1, or ``auto`` (the cores this process may run on)."""
    if value.strip().lower() == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - not Linux
            return max(1, os.cpu_count() or 1)
    n = int(value)
    if n < 1:
        raise ValueError(f"{n} workers")
    return n


def spool_paths(base: Path, n: int) -> list[Path]:
    """The spools of N workers: ``base`` itself for one, else ``base.w0`` ... ``base.w<N-1>``."""
    if n == 1:
        return [base]
    return [base.with_name(f"{base.name}.w{k}") for k in range(n)]


def orphan_spools(base: Path, n: int) -> list[Path]:
    """Spool files of earlier runs that none of N workers will own (a run with more workers, or
    with one, whose spool is ``base``), not empty."""
    mine = set(spool_paths(base, n))
    found = [base] if base.is_file() else []
    pre = base.name + ".w"
    found += sorted(
        (p for p in base.parent.glob(pre + "*") if p.name[len(pre) :].isdigit()),
        key=lambda p: int(p.name[len(pre) :]),
    )
    return [p for p in found if p not in mine and p.stat().st_size > 0]


def replay_spool(cfg: ProxyConfig, path: Path, timeout: float = 60.0) -> int:
    """Store what the spool ``path`` holds (a recorder that replays it, then closes). Returns the
    records left in it (0: all stored; more when the database did not take them in ``timeout``)."""
    from orchard_rec.proxy.recorder import Recorder
    from orchard_rec.storage.store import Store

    store = Store(cfg.db)
    rec = Recorder(store, spool=path, durability="process")
    rec.start()
    try:
        deadline = time.monotonic() + timeout
        while rec.spool_depth and time.monotonic() < deadline and rec.last_error is None:
            time.sleep(0.05)  # a database that fails (down) is not waited for: the next start replays
        return rec.spool_depth
    finally:
        rec.close()
        store.close()


def replay_orphans(cfg: ProxyConfig, base: Path, n: int) -> None:
    """Replay ``orphan_spools(base, n)`` before N workers (or the single process) start."""
    for path in orphan_spools(base, n):
        log.info("replaying the spool %s of an earlier run", path)
        left = replay_spool(cfg, path)
        if left:
            log.warning(
                "%d record(s) stay in the spool %s (the database did not take them); the next serve replays them",
                left,
                path,
            )


async def gather_metrics(peers: tuple[str, ...], me: int, own: bytes, timeout: float = 2.0) -> bytes:
    """``/metrics`` of ``serve --workers N``: every worker's metrics (``own`` and the others', asked
    over their private sockets, ``/metrics?worker``) as one exposition, each sample labelled
    ``worker="<k>"``; sum over ``worker`` for the proxy's totals. A worker that does not answer
    (restarting) is left out of this scrape; ``orchard_workers_answered`` says how many did."""
    import asyncio

    import aiohttp

    async def ask(k: int, path: str) -> tuple[int, bytes | None]:
        try:
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=path), timeout=aiohttp.ClientTimeout(total=timeout)
                ) as http,
                http.get("http://worker/metrics?worker") as r,
            ):
                return k, await r.read() if r.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return k, None

    got = await asyncio.gather(*(ask(k, p) for k, p in enumerate(peers) if k != me))
    texts = sorted([(me, own), *((k, t) for k, t in got if t is not None)])
    return _merge(texts)


async def tell_peers(
    peers: tuple[str, ...], me: int, path: str, body: bytes, headers: dict[str, str], timeout: float = 2.0
) -> int:
    """``POST path`` (``?worker``: not passed on again) with ``body`` to every other worker over its
    private socket: what one worker is told that all must know (the trainer's policy version).
    Returns how many answered 2xx (a worker restarting misses it)."""
    import asyncio

    import aiohttp

    async def tell(sock: str) -> bool:
        try:
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=sock), timeout=aiohttp.ClientTimeout(total=timeout)
                ) as http,
                http.post(f"http://worker{path}?worker", data=body, headers=headers) as r,
            ):
                await r.read()
                return r.status < 300
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    told = await asyncio.gather(*(tell(p) for k, p in enumerate(peers) if k != me))
    return sum(told)


def _merge(texts: list[tuple[int, bytes]]) -> bytes:
    """Expositions of several workers as one, each sample labelled with its worker's index."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    for k, text in texts:
        for fam in text_string_to_metric_families(text.decode()):
            into = families.get(fam.name)
            if into is None:
                into = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            into.samples.extend(
                Sample(s.name, {**s.labels, "worker": str(k)}, s.value, s.timestamp, s.exemplar)
                for s in fam.samples
            )
    answered = GaugeMetricFamily("orchard_workers_answered", "Workers whose metrics this scrape holds")
    answered.add_metric([], len(texts))
    families[answered.name] = answered

    class _All:
        def collect(self) -> Any:
            return iter(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_All())
    return bytes(generate_latest(registry))


def _reserve(host: str, port: int) -> socket.socket:
    """The port, bound with ``SO_REUSEPORT`` and never listening: the workers' sockets join it."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    return s


def _worker(cfg: ProxyConfig, host: str, port: int, shutdown_timeout: float) -> None:
    """A worker's process: the proxy in the foreground, signals its own (``run_forever``)."""
    from orchard_rec.proxy.server import serve_proxy

    os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the parent, which forwards it once
    # held until the event loop handles them (``run_forever``): a SIGTERM while this worker starts
    # (its spool replaying) is a graceful stop, not the default's sudden death
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: drain if orphaned
    serve_proxy(cfg, host, port, shutdown_timeout=shutdown_timeout, reuse_port=True)


class _Parent:
    def __init__(self, cfg: ProxyConfig, host: str, port: int, n: int, shutdown_timeout: float) -> None:
        self.cfg, self.host, self.port, self.n = cfg, host, port, n
        self.shutdown_timeout = shutdown_timeout
        self.ctx = multiprocessing.get_context("fork")  # no thread runs in the parent
        self.procs: dict[int, BaseProcess] = {}
        self.started: dict[int, float] = {}
        self.signals = 0
        self.fast_deaths = 0
        self.restarts = 0
        self.rundir = tempfile.mkdtemp(prefix="orchard-workers-")  # short: a socket path has < 108 bytes
        self.peers = tuple(os.path.join(self.rundir, f"w{k}.sock") for k in range(n))

    def start(self, k: int, spool: Path) -> None:
        cfg = self.cfg.model_copy(update={"spool": str(spool), "worker": k, "peers": self.peers})
        p = self.ctx.Process(
            target=_worker,
            args=(cfg, self.host, self.port, self.shutdown_timeout),
            name=f"orchard-worker-{k}",
        )
        p.start()
        self.procs[k] = p
        self.started[k] = time.monotonic()

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info(
                "shutting down: each of %d worker(s) drains its calls in flight (up to %.0fs; Ctrl-C again stops at once)",
                len(self.procs),
                self.shutdown_timeout,
            )
        for p in self.procs.values():
            if p.pid is not None and p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM if self.signals == 1 else signal.SIGINT)

    def watch(self, spools: list[Path]) -> int:
        """Until every worker has ended after a signal: restart the ones that die before. Exit code."""
        while self.procs:
            wait([p.sentinel for p in self.procs.values()], timeout=1.0)
            for k, p in list(self.procs.items()):
                if p.exitcode is None:
                    continue
                p.join()
                del self.procs[k]
                if self.signals:
                    continue
                lived = time.monotonic() - self.started[k]
                self.fast_deaths = self.fast_deaths + 1 if lived < _FAST_DEATH_S else 0
                if self.fast_deaths >= _MAX_FAST_DEATHS:
                    log.error("workers keep dying at start (the last: exit code %s); stopping", p.exitcode)
                    self.on_signal(signal.SIGTERM, None)
                    continue
                self.restarts += 1
                log.warning(
                    "worker %d (pid %s) ended (exit code %s) after %.0fs; starting it again (its spool %s is replayed)",
                    k,
                    p.pid,
                    p.exitcode,
                    lived,
                    spools[k],
                )
                if self.fast_deaths:
                    time.sleep(min(5.0, 0.2 * 2**self.fast_deaths))
                self.start(k, spools[k])
        if self.fast_deaths >= _MAX_FAST_DEATHS:
            return 1
        return 130 if self.signals > 1 else 0  # stopped at once, as a single ``serve``


def _lock(path: Path) -> IO[bytes]:
    f = open(path, "ab")  # noqa: SIM115 - held for the parent's lifetime
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise RuntimeError(f"spool {path} is in use by another orchard-rec") from None
    return f


def serve_workers(
    cfg: ProxyConfig, host: str, port: int, n: int, *, shutdown_timeout: float = 30.0, base: Path
) -> int:
    """``orchard-rec serve --workers N`` (N >= 2): returns the exit code once every worker ended."""
    holder = _reserve(host, port)
    bound = holder.getsockname()[1]
    base.parent.mkdir(parents=True, exist_ok=True)  # the default, .orchard-spool/, may not exist yet
    replay_orphans(cfg, base, n)
    lock = _lock(base)
    spools = spool_paths(base, n)
    parent = _Parent(cfg, host, bound, n, shutdown_timeout)
    old = {sig: signal.signal(sig, parent.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for k, spool in enumerate(spools):
            parent.start(k, spool)
        log.info(
            "orchard-rec proxy: %d workers on http://%s:%d  database %s  mode %s  durability %s  spools %s.w0..w%d",
            n,
            host,
            bound,
            _safe(cfg.db),
            cfg.mode,
            cfg.durability,
            base,
            n - 1,
        )
        log.info("ready: OPENAI_BASE_URL=http://%s:%d/s/<session>/v1  (Ctrl-C stops)", host, bound)
        code = parent.watch(spools)
        log.info("stopped: %d worker(s) ended (%d restarted on the way)", n, parent.restarts)
        return code
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        for p in parent.procs.values():  # an exception in the parent: the workers drain
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(p.pid, signal.SIGTERM)  # type: ignore[arg-type]
        holder.close()
        shutil.rmtree(parent.rundir, ignore_errors=True)
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        lock.close()


def _safe(url: str) -> str:
    from orchard_rec.proxy.server import _safe_db

    return _safe_db(url)
