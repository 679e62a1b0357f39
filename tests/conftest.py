"""Shared fixtures: a real PostgreSQL cluster, the vLLM-faithful demo upstream, and proxies.
Before the first test, what the selected tests need beyond pip is installed (``prereqs.py``).

Every test that touches storage takes ``db_url``, which runs it twice: on a fresh
SQLite file and on a fresh database of the throwaway PostgreSQL cluster.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pg import PgCluster

from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy.app import RECORDER, build_app
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.storage.store import Store


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install what the selected tests need and the machine lacks (``prereqs.py``;
    ``ORCHARD_TEST_INSTALL=0`` installs nothing)."""
    if session.config.option.collectonly or not session.items:
        return
    import prereqs

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    prereqs.ensure(session.items, reporter.write_line if reporter is not None else print)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgCluster]:
    cluster = PgCluster().start()
    try:
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(
    params=[
        "sqlite",
        # starting the throwaway cluster takes 10-60 s: the fast tier (-m "not slow") runs SQLite only
        pytest.param("postgresql", marks=[pytest.mark.postgres, pytest.mark.slow]),
    ]
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'orchard.db'}"
    return request.getfixturevalue("pg").new_database()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'orchard.db'}"


@dataclass
class Upstream:
    server: BackgroundServer
    fake: DemoUpstream

    @property
    def url(self) -> str:
        return self.server.url + "/v1"


@pytest.fixture
def upstream_factory() -> Iterator[Callable[..., Upstream]]:
    started: list[BackgroundServer] = []

    def make(**kwargs: Any) -> Upstream:
        fake = DemoUpstream(**kwargs)
        srv = BackgroundServer(fake.app()).start()
        started.append(srv)
        return Upstream(srv, fake)

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def upstream(upstream_factory: Callable[..., Upstream]) -> Upstream:
    return upstream_factory()


@dataclass
class Proxy:
    server: BackgroundServer
    config: ProxyConfig

    @property
    def url(self) -> str:
        return self.server.url

    def flush(self) -> None:
        assert self.server.app is not None
        assert self.server.app[RECORDER].flush(30), "recorder did not drain"

    def store(self) -> Store:
        return Store(self.config.db)


@pytest.fixture
def proxy_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Proxy]]:
    started: list[BackgroundServer] = []

    def make(upstream_url: str, db: str, **kwargs: Any) -> Proxy:
        if kwargs.get("spool") is None:  # each proxy its own spool, outside the work tree
            kwargs["spool"] = str(tmp_path_factory.mktemp("spool") / "proxy.spool")
        cfg = ProxyConfig(upstream=upstream_url, db=db, **kwargs)
        srv = BackgroundServer(lambda: build_app(cfg)).start()
        started.append(srv)
        return Proxy(srv, cfg)

    yield make
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def hf_tokenizer():  # type: ignore[no-untyped-def]
    """The demo model's tokenizer as a Hugging Face tokenizer (what retokenizing exports use)."""
    from orchard_rec.tokenizer import load_hf_tokenizer

    return load_hf_tokenizer("demo")


@pytest.fixture(scope="session")
def recorded_db(tmp_path_factory) -> str:  # type: ignore[no-untyped-def]
    """Six sessions over three dialects, in three groups ("task"), with rewards."""
    from e2e.agents import AGENTS
    from factories import session_base

    from orchard_rec.demo.upstream import DemoUpstream
    from orchard_rec.proxy import BackgroundServer, ProxyConfig, build_app
    from orchard_rec.proxy.app import RECORDER
    from orchard_rec.records import Outcome
    from orchard_rec.storage import Store

    db = f"sqlite:///{tmp_path_factory.mktemp('rec') / 'o.db'}"
    with BackgroundServer(DemoUpstream().app()) as up:
        cfg = ProxyConfig(upstream=up.url + "/v1", db=db)
        with BackgroundServer(lambda: build_app(cfg)) as proxy:
            for k, dialect in enumerate(["chat", "responses", "messages", "chat", "responses", "messages"]):
                AGENTS[dialect](session_base(proxy.url, f"sess-{k}", dialect), None)
            proxy.app[RECORDER].flush()
    store = Store(db)
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    for k, r in enumerate(rewards):
        store.set_outcome(f"sess-{k}", Outcome(reward=r, status="completed", metadata={"task": f"t{k % 3}"}))
    store.close()
    return db
