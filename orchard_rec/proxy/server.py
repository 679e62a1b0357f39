"""Running aiohttp apps: in the foreground (``serve``) or on a background thread.

Handler cancellation is on: when a client disconnects, aiohttp cancels its handler,
which closes the upstream request; the recorder still gets the call (``aborted``).
SIGTERM and SIGINT stop accepting, let in-flight calls finish (up to
``shutdown_timeout``), then drain the recorder before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["BackgroundServer", "run_forever", "tune_interpreter"]


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
) -> None:
    runner = _runner(app, shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True, ssl_context=ssl_context)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port  # type: ignore[union-attr]
    if ready is not None:
        ready(bound)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def tune_interpreter() -> None:
    """Settings for a long-running server, applied by ``run_forever`` once it listens.

    The garbage collector: everything alive at start-up (modules, the app,
    SQLAlchemy's metadata) is frozen out of collection, and the young generation is collected every
    50k allocations instead of 700. Each call allocates a few hundred short-lived containers (parsed
    bodies, records); with the defaults, collections scanning every live object were the largest
    single cost of recording (measured: 110 -> 32 us per record built, bench/PROFILE.md).
    Cycles are still collected, just in bigger, rarer batches."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    # The writer thread builds records in Python; when the event loop wakes for a client it must
    # get the GIL back quickly. CPython hands it over only every switch interval (5 ms by default),
    # which showed as ~4 ms p99 and a longer gap between relayed chunks; 0.5 ms bounds that wait.
    sys.setswitchinterval(0.0005)


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
) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully (uvloop when installed)."""
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await _serve(app, host, port, stop, _tuned(ready), shutdown_timeout)

    with asyncio.Runner(loop_factory=loop_factory) as r:
        r.run(main())


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
            self.app = (
                self._app()
                if callable(self._app) and not isinstance(self._app, web.Application)
                else self._app
            )  # type: ignore[assignment]

            def ready(port: int) -> None:
                self.port = port
                self._ready.set()

            await _serve(
                self.app, self.host, self.port, self._stop, ready, self.shutdown_timeout, self.ssl_context
            )  # type: ignore[arg-type]

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
