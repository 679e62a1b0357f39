"""``orchard-rec demo``: the whole loop on embedded defaults, in a temp folder.

Starts the demo upstream and the proxy (SQLite) on loopback ports, drives the scripted
agent through ``/s/demo/v1`` with the real openai SDK, waits for the recorder, and
returns what was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchard_rec.demo.agent import run_agent
from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy.app import RECORDER, build_app
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.records import CallRecord
from orchard_rec.storage.store import Store

__all__ = ["DemoResult", "run_demo"]

SESSION = "demo"


@dataclass
class DemoResult:
    workdir: Path
    db_url: str
    session_id: str
    calls: list[CallRecord]
    marker: str


def run_demo(workdir: Path, *, mode: str = "token") -> DemoResult:
    workdir.mkdir(parents=True, exist_ok=True)
    sandbox = workdir / "sandbox"
    sandbox.mkdir(exist_ok=True)
    db_url = f"sqlite:///{workdir / 'orchard.db'}"
    upstream = DemoUpstream()
    with BackgroundServer(upstream.app()) as up:
        cfg = ProxyConfig(upstream=up.url + "/v1", db=db_url, mode=mode)  # type: ignore[arg-type]
        with BackgroundServer(lambda: build_app(cfg)) as proxy:
            run_agent(f"{proxy.url}/s/{SESSION}/v1", sandbox)
            assert proxy.app is not None
            proxy.app[RECORDER].flush()
    store = Store(db_url)
    try:
        calls = store.calls(SESSION)
    finally:
        store.close()
    marker = (sandbox / "marker.txt").read_text().strip() if (sandbox / "marker.txt").exists() else ""
    return DemoResult(workdir, db_url, SESSION, calls, marker)
