"""``served_factory``: the proxy a reliability test drives, once in this process (``workers1``,
the ``proxy_factory`` of ``tests/conftest.py``) and once as ``orchard-rec serve --workers 2`` in a
subprocess (``workers2``, ``factories.Served``; slow: a served process starts in ~1 s). Both have
``url``, ``flush()`` and ``store()``. Issue 39: the reliability tests pass with workers.

A test that reads the proxy's in-process state (its app, recorder, caplog) keeps ``proxy_factory``
and says why; one that starts ``serve`` itself takes ``workers`` and passes ``--workers``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from factories import Served


@pytest.fixture(params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["workers1", "workers2"])
def workers(request: pytest.FixtureRequest) -> int:
    """How many proxy processes serve: 1 (the proxy as it always ran), 2 (``serve --workers 2``)."""
    return int(request.param)


@pytest.fixture
def served_factory(
    workers: int, proxy_factory: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Any]]:
    started: list[Served] = []

    def make(upstream_url: str, db: str, **kwargs: Any) -> Any:
        if workers == 1:
            return proxy_factory(upstream_url, db, **kwargs)
        s = Served(upstream_url, db, tmp_path_factory.mktemp("served"), workers, **kwargs)
        started.append(s)
        return s

    yield make
    for s in started:
        code = s.stop()
        said = s.log.read_text()
        assert code == 0 and "Traceback" not in said, said[-3000:]
