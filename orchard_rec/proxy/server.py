"""Running aiohttp apps: in the foreground (``serve``) or on a background thread.

Handler cancellation is on: when a client disconnects, aiohttp cancels its handler,
which closes the upstream request; the recorder still gets the call (``aborted``).
SIGTERM and SIGINT stop accepting, let in-flight calls finish (up to
``shutdown_timeout``), then drain the recorder before the process exits; a second
SIGINT/SIGTERM stops at once. ``serve_proxy`` is ``orchard-rec serve``: start and stop
messages and one access-log line per recorded call on the ``orchard_rec`` logger.
``RecordingProxy`` is "start a proxy, run something through it, flush, stop" for the
CLI's ``run``, the demo and the slime trainer glue.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from orchard_rec.proxy.front import ENTRY, Entry, Front
from orchard_rec.proxy.logs import LoggedStore, configure_logging
from orchard_rec.settings import Settings

if TYPE_CHECKING:
    from orchard_rec.proxy.config import ProxyConfig

__all__ = [
    "BackgroundServer",
    "RecordingProxy",
    "configure_logging",
    "run_forever",
    "serve_proxy",
    "tune_interpreter",
]

log = logging.getLogger("orchard_rec.server")


def _runner(app: web.Application, shutdown_timeout: float) -> web.AppRunner:
    return web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout)


async def _serve(
    app: web.Application,
    host: str,
    port: int,
    stop: asyncio.Event,
    ready: Callable[[int], None] | None,
    shutdown_timeout: float,
    ssl_context: Any = None,
    reuse_port: bool = False,
    unix_path: str | None = None,
) -> None:
    runner = _runner(app, shutdown_timeout)
    await runner.setup()
    if unix_path is not None:  # a worker's private socket (``proxy.workers``: /metrics of them all)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(unix_path)  # left by a worker killed before
        await web.UnixSite(runner, unix_path).start()
    entry = app.get(ENTRY)
    if entry is not None and Settings.one("front").strip().lower() != "aiohttp":
        await _serve_front(
            app, runner, entry, host, port, stop, ready, shutdown_timeout, ssl_context, reuse_port
        )
        return
    site = web.TCPSite(
        runner,
        host,
        port,
        backlog=4096,
        reuse_address=True,
        reuse_port=reuse_port or None,
        ssl_context=ssl_context,
    )
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()  # the app's resources (upstream session, recorder) are released
        raise
    sockets = getattr(site._server, "sockets", None)
    bound = sockets[0].getsockname()[1] if sockets else port
    if ready is not None:
        ready(bound)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


async def _serve_front(
    app: web.Application,
    runner: web.AppRunner,
    entry: Entry,
    host: str,
    port: int,
    stop: asyncio.Event,
    ready: Callable[[int], None] | None,
    shutdown_timeout: float,
    ssl_context: Any,
    reuse_port: bool,
) -> None:
    """The proxy's calls on its own server (``proxy.front``), aiohttp's for every other request."""
    front = Front(app, runner, entry)
    try:
        bound = await front.start(host, port, reuse_port=reuse_port, ssl_context=ssl_context)
    except BaseException:
        await runner.cleanup()
        raise
    if ready is not None:
        ready(bound)
    try:
        await stop.wait()
    finally:
        try:
            await front.close(shutdown_timeout)
        finally:
            await runner.cleanup()


def tune_interpreter() -> None:
    """Settings for a long-running server, applied by ``run_forever`` once it listens.

    The garbage collector: everything alive at start-up (modules, the app,
    SQLAlchemy's metadata) is frozen out of collection, and the young generation is collected every
    50k allocations instead of 700. Each call allocates a few hundred short-lived containers (parsed
    bodies, records); with the defaults, collections scanning every live object were the largest
    single cost of recording (measured: 110 -> 32 us per record built, bench/PROFILE.md).
    Cycles are still collected, just in bigger, rarer batches. ``ORCHARD_GC_THRESHOLD=a,b,c``
    overrides the thresholds (measurement, tuning).

    A collection stops the event loop for as long as it scans (~0.6 us per young object at a
    150k-token context): with 50k young objects a pause of 20-70 ms. What keeps them rare is that a
    call leaves few new containers behind (the request parsed on its session's previous one, the
    writer's statements built once, no per-batch garbage in reference cycles), not the threshold:
    at 5k or 10k the pauses are 2-6 ms but ten times as frequent, with 20 ms gen-1 passes."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_gc_threshold())
    # The writer thread builds records in Python; when the event loop wakes for a client it must
    # get the GIL back quickly. CPython hands it over only every switch interval (5 ms by default),
    # which showed as ~4 ms p99 and a longer gap between relayed chunks; 0.5 ms bounds that wait.
    sys.setswitchinterval(0.0005)


def _gc_threshold() -> tuple[int, int, int]:
    threshold: tuple[int, int, int] = Settings.one("gc_threshold")
    return threshold


def _tuned(ready: Callable[[int], None] | None) -> Callable[[int], None]:
    def on_ready(port: int) -> None:
        tune_interpreter()
        if ready is not None:
            ready(port)

    return on_ready


def run_forever(
    app: web.Application,
    host: str,
    port: int,
    *,
    ready: Callable[[int], None] | None = None,
    shutdown_timeout: float = 30.0,
    on_stop: Callable[[], None] | None = None,
    reuse_port: bool = False,
    unix_path: str | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully (uvloop when installed).

    ``on_stop`` runs at the first signal (e.g. to say what is being drained); a second signal
    ends the process at once (exit 130). ``reuse_port``: ``SO_REUSEPORT``, the port shared with
    the other workers of ``serve --workers N`` (the kernel spreads connections among them)."""
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                log.warning("second interrupt: stopping now, without waiting for calls in flight")
                logging.shutdown()
                os._exit(130)
            if on_stop is not None:
                on_stop()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, on_signal)
        # a worker of ``serve --workers`` blocks them until here: one that came while it started is handled now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        await _serve(
            app, host, port, stop, _tuned(ready), shutdown_timeout, reuse_port=reuse_port, unix_path=unix_path
        )

    with asyncio.Runner(loop_factory=loop_factory) as r:
        r.run(main())


def serve_proxy(
    cfg: ProxyConfig, host: str, port: int, *, shutdown_timeout: float = 30.0, reuse_port: bool = False
) -> None:
    """``orchard-rec serve``: the proxy in the foreground, with its start, access and stop log
    (``reuse_port``: one of the workers of ``serve --workers N``, ``proxy.workers``)."""
    from orchard_rec.proxy.app import RECORDER, build_app

    app = build_app(cfg)
    if cfg.mode != "passthrough":  # answers carry id arrays: their parser's kernels, before serving
        from orchard_rec.proxy import idcut

        idcut.warm()
    recorder = app[RECORDER]
    recorder.store = LoggedStore(recorder.store)  # type: ignore[assignment]
    started = time.monotonic()
    me = (
        ""
        if cfg.worker is None
        else f"worker {cfg.worker} (pid {os.getpid()}, spool {recorder.spool_path}): "
    )

    def ready(bound: int) -> None:
        if cfg.worker is not None:
            log.info("%slistening on http://%s:%d", me, host, bound)
            return
        log.info(
            "orchard-rec proxy listening on http://%s:%d  upstream %s  database %s  mode %s  durability %s  auth %s",
            host,
            bound,
            " ".join(cfg.upstreams) + (f" (route {cfg.route})" if cfg.fleet else ""),
            _safe_db(cfg.db),
            cfg.mode,
            cfg.durability,
            "on" if cfg.api_keys else "off",
        )
        log.info("ready: OPENAI_BASE_URL=http://%s:%d/s/<session>/v1  (Ctrl-C stops)", host, bound)
        if cfg.ui:
            log.info("viewer: http://%s:%d/ui/", host, bound)

    def on_stop() -> None:
        log.info(
            "%sshutting down: draining %d call(s) in flight and %d record(s) (up to %.0fs; Ctrl-C again stops at once)",
            me,
            recorder.inflight,
            recorder.depth,
            shutdown_timeout,
        )

    run_forever(
        app,
        host,
        port,
        ready=ready,
        shutdown_timeout=shutdown_timeout,
        on_stop=on_stop,
        reuse_port=reuse_port,
        unix_path=cfg.peers[cfg.worker] if cfg.peers and cfg.worker is not None else None,
    )
    waiting = recorder.spool_depth
    if waiting and recorder.spool is not None:
        log.warning(
            "%sstopped after %.0fs: %d call(s) recorded, %d waiting in the spool %s (the database did not"
            " take them%s; the next serve on this database replays them)",
            me,
            time.monotonic() - started,
            recorder.written,
            waiting,
            recorder.spool.path,
            f": {recorder.last_error}" if recorder.last_error else "",
        )
    else:
        log.info(
            "%sstopped after %.0fs: %d call(s) recorded", me, time.monotonic() - started, recorder.written
        )


def _safe_db(url: str) -> str:
    with contextlib.suppress(Exception):
        from sqlalchemy.engine import make_url

        return str(make_url(url).render_as_string(hide_password=True))
    return url


class BackgroundServer:
    """An aiohttp app on a loopback port, in a daemon thread with its own event loop."""

    def __init__(
        self,
        app: web.Application | Callable[[], web.Application],
        host: str = "127.0.0.1",
        port: int = 0,
        shutdown_timeout: float = 10.0,
        ssl_context: Any = None,
    ) -> None:
        self._app = app
        self.ssl_context = ssl_context
        """An ``ssl.SSLContext`` to serve HTTPS (the intercept tests' upstream)."""
        self.host = host
        self.port = port
        self.shutdown_timeout = shutdown_timeout
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.app: web.Application | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context is not None else 'http'}://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        self._thread = threading.Thread(target=self._main, name="orchard-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("server did not start within 60 s")
        if self._error is not None:
            raise RuntimeError(f"server failed to start: {self._error}") from self._error
        return self

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            app = (
                self._app()
                if callable(self._app) and not isinstance(self._app, web.Application)
                else self._app
            )
            self.app = app

            def ready(port: int) -> None:
                self.port = port
                self._ready.set()

            await _serve(
                app, self.host, self.port, self._stop, ready, self.shutdown_timeout, self.ssl_context
            )

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced to start()
            self._error = exc
            self._ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(60)
            self._thread = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class RecordingProxy(BackgroundServer):
    """A recording proxy on a loopback port in a background thread: start, run things through
    ``url``, ``flush()`` to have every finished call in the database, ``stop()`` (flushes first)."""

    def __init__(self, cfg: ProxyConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        from orchard_rec.proxy.app import build_app

        super().__init__(lambda: build_app(cfg), host, port)
        self.config = cfg

    def flush(self, timeout: float = 30.0) -> bool:
        from orchard_rec.proxy.app import RECORDER

        return self.app is None or bool(self.app[RECORDER].flush(timeout))

    def stop(self) -> None:
        if self.app is not None and self._thread is not None:
            self.flush()
        super().stop()

    def __enter__(self) -> RecordingProxy:
        self.start()
        return self
