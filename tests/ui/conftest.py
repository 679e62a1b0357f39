"""Fixtures for the viewer: a database recorded through the real proxy, the viewer on loopback,
and Debian's headless Chromium driven by Playwright (never a downloaded browser build)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import session_base

from orchard_rec.proxy import BackgroundServer
from orchard_rec.ui import build_ui_app, open_store

CHROMIUM = os.environ.get("ORCHARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def record_sessions(db: str) -> dict[str, str]:
    """Sessions recorded through the proxy with the demo upstream: linear ones over the three
    dialects (no drift) and drifting ones (the upstream re-tokenizes history: splits, or one
    realigned sample). Returns session id -> kind."""
    from e2e.agents import AGENTS

    from orchard_rec.demo.upstream import DemoUpstream
    from orchard_rec.proxy import ProxyConfig, build_app
    from orchard_rec.proxy.app import RECORDER
    from orchard_rec.records import Outcome
    from orchard_rec.storage import Store

    kinds: dict[str, str] = {}
    spool = Path(tempfile.mkdtemp(prefix="ui-spool-")) / "p.spool"
    for drift in (False, True):
        with BackgroundServer(DemoUpstream(drift=drift).app()) as up:
            cfg = ProxyConfig(upstream=up.url + "/v1", db=db, spool=str(spool))
            with BackgroundServer(lambda cfg=cfg: build_app(cfg)) as proxy:
                for dialect in ("chat", "responses", "messages"):
                    sid = f"{'drift' if drift else 'linear'}-{dialect}"
                    AGENTS[dialect](session_base(proxy.url, sid, dialect), None)
                    kinds[sid] = "drift" if drift else "linear"
                assert proxy.app is not None
                proxy.app[RECORDER].flush()
    store = Store(db)
    rewards = [1.0, 0.0, 0.75, 1.0, 0.25, 0.0]
    statuses = ["completed", "failed", "completed", "completed", "truncated", "completed"]
    for k, sid in enumerate(sorted(kinds)):
        store.set_outcome(sid, Outcome(reward=rewards[k], status=statuses[k], metadata={"task": f"t{k % 3}"}))
    store.close()
    shutil.rmtree(spool.parent, ignore_errors=True)
    return kinds


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    db = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'rec.db'}"
    return db, record_sessions(db)


@pytest.fixture
def ui_server() -> Iterator[Callable[..., BackgroundServer]]:
    started: list[tuple[BackgroundServer, Any]] = []

    def make(db: str, **kwargs: Any) -> BackgroundServer:
        store = open_store(db)
        srv = BackgroundServer(lambda: build_ui_app(store, **kwargs)).start()
        started.append((srv, store))
        return srv

    yield make
    for srv, store in started:
        srv.stop()
        store.close()


# package scope, not session: while Playwright's sync API is running, the main thread has a running
# event loop, and every later test's asyncio.run() outside tests/ui would fail ("cannot be called
# from a running event loop"); the browser is closed when the last test of tests/ui has run.
@pytest.fixture(scope="package")
def browser_context() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: apt-get install chromium (the test command does, unless ORCHARD_TEST_INSTALL=0)"
        )
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="orchard-chromium-")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1320, "height": 900},
        )
        try:
            yield ctx
        finally:
            ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


class Page:
    """A Playwright page that collects JavaScript errors (page errors and console errors)."""

    def __init__(self, ctx: Any) -> None:
        self.page = ctx.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on(
            "console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None
        )

    def goto(self, url: str) -> Any:
        resp = self.page.goto(url)
        assert resp is not None and resp.ok, (url, resp and resp.status)
        return self.page

    def settle(self) -> None:
        """Wait until progressive rendering has put every token element in the DOM."""
        self.page.wait_for_function("document.body.dataset.tokensReady === '1'", timeout=120_000)


@pytest.fixture
def page(browser_context: Any) -> Iterator[Page]:
    p = Page(browser_context)
    yield p
    p.page.close()
    assert not p.errors, p.errors


def screenshot(page: Any, name: str, **kw: Any) -> None:
    """Write docs screenshots when ORCHARD_UI_SCREENSHOTS names a folder (e.g. docs/img)."""
    folder = os.environ.get("ORCHARD_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), **kw)
