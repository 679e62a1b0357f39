"""The database thread's CPU per call under the c=32 bench's load, in process, by part.

    python bench/dbthread.py [--calls 9600] [--batch 32] [--rounds 3] [--profile]

What ``bench/run.py``'s load makes the proxy's database thread do: every call the same one-message
chat request (``load``'s body, the same bytes each time, so all calls derive the one session),
token mode's plan, and ``bench/fakeupstream.py``'s token-mode answer. Each ``Capture`` is made as
the event loop makes it (``request.caller``/``take_body``: the request cache, the derived session;
``plan_for``; ``Plan.client_body_bytes``), then the database thread's work runs on it in batches
of ``--batch`` (what it gathers at c=32): ``Capture.to_record`` with the recorder's ``IdParser``,
``Store.write_batch`` into a fresh SQLite database (the default pragmas, search index included)
through ``serve``'s ``LoggedStore`` (the access log's lines, written to /dev/null).

Printed: microseconds of thread CPU (``time.thread_time``) per call, the best of ``--rounds``
rounds, for the whole (record + store) and for each part, the parts timed by wrapping the storage
functions (a wrapper costs ~0.3 us a call, so the parts' sum is a little above the whole).
``--profile``: a cProfile of one more round, by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import logging
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakeupstream import _bodies

from orchard_rec.proxy import logs
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.proxy.request import caller, take_body
from orchard_rec.proxy.server import tune_interpreter
from orchard_rec.proxy.token import plan_for
from orchard_rec.records import Dialect
from orchard_rec.storage import Store

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there, benchmark"}]})
HEADERS = {
    "Host": "127.0.0.1",
    "Authorization": "Bearer sk-bench",
    "Content-Type": "application/json",
    "User-Agent": "Python/3.12 aiohttp/3.12",
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "Content-Length": str(len(BODY)),
}
ANSWER = _bodies(1)[(False, True)]


def capture() -> Capture:
    """One call as the event loop leaves it for the database thread."""
    cap = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", None)
    caller(cap, HEADERS)
    body = take_body(cap, BODY, "application/json")
    plan = plan_for("token", Dialect.CHAT, body, cap.session_id, len(BODY), cap.path)
    assert plan is not None
    cap.upstream_request, cap.upstream_dialect = plan.body, plan.upstream
    cap.first_byte_at = time.time()
    cap.status_code = 200
    data, cap.client_response = plan.client_body_bytes(ANSWER, 200)
    cap.body, cap.id_cut, cap.bytes_out = ANSWER, plan.cut, len(data)
    cap.done_at = time.time()
    return cap


PARTS: dict[str, list[float]] = defaultdict(lambda: [0.0])


def _timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    acc = PARTS[name]
    clock = time.thread_time

    @functools.wraps(f)
    def run(*a: Any, **k: Any) -> Any:
        t = clock()
        try:
            return f(*a, **k)
        finally:
            acc[0] += clock() - t

    return run


@contextmanager
def parts() -> Iterator[None]:
    """Wrap the storage functions the database thread's time goes to (restored after)."""
    from orchard_rec.storage import delta, layout, search, store

    targets = [
        (store, "_row", "rows._row"),
        (store.Store, "_insert_calls", "Store._insert_calls"),
        (store.Store, "_bump_session", "Store._bump_session"),
        (store.search, "index_calls", "search.index_calls"),
        (store.search, "doc_text", "search.doc_text"),
        (store.Encoder, "encode", "Encoder.encode"),
        (delta.layout, "split_request", "  layout.split_request"),
        (delta.layout, "client_view", "  layout.client_view"),
        (delta.layout, "derive_upstream", "  layout.derive_upstream"),
        (delta.layout, "compress", "  layout.compress"),
        (delta, "_prefix", "  delta._prefix"),
        (store.Encoder, "commit", "Encoder.commit"),
        (logs, "_write_lines", "access log (logs._write_lines)"),
    ]
    targets = [t for t in targets if hasattr(t[0], t[1])]  # an older tree may lack one
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in targets]
    del layout, search
    for obj, attr, name in targets:
        setattr(obj, attr, _timed(name, getattr(obj, attr)))
    try:
        yield
    finally:
        for obj, attr, f in saved:
            setattr(obj, attr, f)


def one_round(
    n: int, batch: int, work: Path, tag: str, prof: cProfile.Profile | None = None
) -> dict[str, float]:
    caps = [capture() for _ in range(n)]
    plain = Store(f"sqlite:///{work / f'{tag}.db'}")
    plain.upgrade()
    store = logs.LoggedStore(plain)
    ids = IdParser()
    warm = 4 * batch  # the session's first calls (state cache, statements compiled) are not timed
    for i in range(0, warm, batch):
        store.write_batch([c.to_record(ids) for c in caps[i : i + batch]], known_new=True)
    rec = wb = 0.0
    clock = time.thread_time
    if prof is not None:
        prof.enable()
    for i in range(warm, n, batch):
        t0 = clock()
        records = [c.to_record(ids) for c in caps[i : i + batch]]
        t1 = clock()
        store.write_batch(records, known_new=True)
        t2 = clock()
        rec += t1 - t0
        wb += t2 - t1
    if prof is not None:
        prof.disable()
    plain.close()
    m = n - warm
    return {"record (Capture.to_record)": 1e6 * rec / m, "store (Store.write_batch)": 1e6 * wb / m}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=9600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    tune_interpreter()
    logs.configure_logging("info")  # as ``serve`` logs: one access line per call, here to /dev/null
    for h in logging.getLogger("orchard_rec").handlers:
        h.stream = open(os.devnull, "w")  # type: ignore[attr-defined]
    work = Path(tempfile.mkdtemp(prefix="orchard-dbthread-"))
    best: dict[str, float] = {}
    for k in range(a.rounds):
        got = one_round(a.calls, a.batch, work, f"r{k}")
        got["whole"] = sum(got.values())
        for key, v in got.items():
            best[key] = min(best.get(key, v), v)
    for key in ("whole", "record (Capture.to_record)", "store (Store.write_batch)"):
        print(f"{key:36s} {best[key]:7.1f} us/call")
    m = a.calls - 4 * a.batch
    by_part: dict[str, float] = {}
    for k in range(a.rounds):
        PARTS.clear()
        with parts():
            one_round(a.calls, a.batch, work, f"p{k}")
        for name, acc in PARTS.items():
            v = 1e6 * acc[0] / a.calls
            by_part[name] = min(by_part.get(name, v), v)
    print(f"parts (wrapped; best of {a.rounds}, per call incl. the {4 * a.batch} warm-up calls):")
    for name, v in by_part.items():
        print(f"  {name:34s} {v:7.1f} us/call")
    if a.profile:
        prof = cProfile.Profile(time.thread_time)
        one_round(a.calls, a.batch, work, "prof", prof)
        print(f"cProfile of {m} calls:")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    for f in work.iterdir():
        f.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
