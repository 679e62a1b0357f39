"""The access log's batch writer (``logs.LoggedStore``): one write per batch when ``serve``'s own
handler alone would see the lines, byte for byte what ``logging`` writes line by line; through
``logging`` whenever a filter or another handler is there."""

from __future__ import annotations

import io
import json
import logging
import re
from typing import Any

import pytest
from factories import call

from orchard_rec.proxy import logs


class _Store:
    def write_batch(self, records: Any, **kw: Any) -> int:
        return len(records)


@pytest.fixture
def served_logging():  # type: ignore[no-untyped-def]
    root = logging.getLogger("orchard_rec")
    saved = (list(root.handlers), root.level, root.propagate)
    yield root
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])
    root.propagate = saved[2]


def _records() -> list[Any]:
    return [
        call("s-1", prompt_ids=[1, 2, 3], completion_ids=[4, 5]),
        call(None, usage={"input_tokens": 7}),
        call("s-2", status_code=502),
    ]


def _capture(root: logging.Logger) -> io.StringIO:
    out = io.StringIO()
    root.handlers[0].setStream(out)  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_batch_lines_equal_what_logging_writes(served_logging, fmt: str) -> None:  # type: ignore[no-untyped-def]
    logs.configure_logging("info", fmt)
    records = _records()
    fast = _capture(served_logging)
    assert logs._only_handler() is served_logging.handlers[0]
    logs.LoggedStore(_Store()).write_batch(records)
    slow = _capture(served_logging)
    logs._log_each(records, logs.LoggedStore.write_batch.__code__)
    a, b = fast.getvalue().splitlines(), slow.getvalue().splitlines()
    assert len(a) == len(b) == 3
    if fmt == "json":
        for x, y in zip(a, b, strict=True):
            dx, dy = json.loads(x), json.loads(y)
            assert abs(dx.pop("ts") - dy.pop("ts")) < 5 and dx == dy
            assert list(json.loads(x)) == list(json.loads(y))  # the same keys in the same order
    else:
        strip = re.compile(r"^\d\d:\d\d:\d\d ")
        assert [strip.sub("", x) for x in a] == [strip.sub("", y) for y in b]
        assert all(strip.match(x) for x in a)
        assert a[0].endswith("POST /v1/chat/completions session=s-1 status=200 outcome=ok tokens=3/2 2.0ms")
        assert "session=- " in a[1] and "tokens=7/-" in a[1]


def test_a_filter_or_another_handler_gets_every_line_through_logging(served_logging) -> None:  # type: ignore[no-untyped-def]
    logs.configure_logging("info", "text")
    _capture(served_logging)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    served_logging.addHandler(Keep())
    assert logs._only_handler() is None
    logs.LoggedStore(_Store()).write_batch(_records())
    assert len(seen) == 3 and seen[0].fields["session"] == "s-1"  # type: ignore[attr-defined]
    served_logging.removeHandler(served_logging.handlers[-1])
    logs.access_log.addFilter(lambda r: True)
    try:
        assert logs._only_handler() is None
    finally:
        logs.access_log.filters.clear()
    served_logging.setLevel("WARNING")
    out = _capture(served_logging)
    logs.LoggedStore(_Store()).write_batch(_records())
    assert out.getvalue() == ""
