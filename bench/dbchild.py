"""The database writer process's CPU per call under the c=32 bench's load (``--db-writer process``).

    python bench/dbchild.py [--calls 9600] [--batch 32] [--rounds 3] [--profile] [--stream [CHUNKS]]

The calls of ``bench/dbthread.py`` (the c=32 bench's: one-message chat, token mode,
``bench/fakeupstream.py``'s answer), spooled as the event loop spools them (``capline.snapshot``,
``capline.Encoder.encode``), then handed in batches of ``--batch`` lines:

- in process, to the child's own work (``dbproc._Child.write``: ``capline.record_of_line`` and
  ``Store.write_batch`` through ``serve``'s ``LoggedStore``, the access lines to /dev/null), timed
  by ``time.thread_time``, with ``--profile`` a cProfile of it;
- through a real writer process (``dbproc.WriterProcess``, the pipe protocol included): the
  parent's thread CPU for ``WriterProcess.write`` and the child's CPU from
  ``/proc/<pid>/task/*/schedstat`` (Linux), per call.

``--stream``: streamed calls instead, ``bench/streamrec.py``'s (a token-mode chat stream of
``CHUNKS`` one-token chunks, default 32, relayed through ``StreamRelay``), per call and per chunk.

Printed: microseconds of CPU per call, the best of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

try:  # the tree on PYTHONPATH (another tree's package measured with this script), else this one
    import orchard_rec  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dbthread import capture

from orchard_rec.proxy import capline, dbproc, logs
from orchard_rec.proxy.server import tune_interpreter
from orchard_rec.storage import Store


def lines(n: int, stream: int = 0) -> list[bytes]:
    enc = capline.Encoder()
    if not stream:
        return [enc.encode(capline.snapshot(capture())) for _ in range(n)]
    from fakeupstream import _bodies
    from streamrec import relayed

    frames = _bodies(stream)[(True, True)]
    return [enc.encode(capline.snapshot(relayed(frames, i % 64)[0])) for i in range(n)]


def _db(work: Path, tag: str) -> str:
    url = f"sqlite:///{work / f'{tag}.db'}"
    s = Store(url)
    s.upgrade()
    s.close()
    return url


def in_process(ls: list[bytes], batch: int, url: str, prof: cProfile.Profile | None = None) -> float:
    child = dbproc._Child(url, access_log=True)
    warm = 4 * batch
    for i in range(0, warm, batch):
        assert child.write(ls[i : i + batch], True)["ok"]
    clock = time.thread_time
    if prof is not None:
        prof.enable()
    t = clock()
    for i in range(warm, len(ls), batch):
        child.write(ls[i : i + batch], True)  # as the live database thread: none of it stored yet
    t = clock() - t
    if prof is not None:
        prof.disable()
    child.store.close()
    return 1e6 * t / (len(ls) - warm)


def _cpu(pid: int) -> float:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def through_process(ls: list[bytes], batch: int, url: str) -> tuple[float, float]:
    proc = dbproc.WriterProcess(url, access_log=True)
    proc.start()
    while not proc.ready():
        time.sleep(0.02)
    warm = 4 * batch
    for i in range(0, warm, batch):
        assert proc.write(ls[i : i + batch], first=True).ok
    pid = proc.pid
    assert pid is not None
    clock = time.thread_time
    c0, t0 = _cpu(pid), clock()
    for i in range(warm, len(ls), batch):
        proc.write(ls[i : i + batch], first=True)
    parent, child = clock() - t0, _cpu(pid) - c0
    proc.close()
    m = len(ls) - warm
    return 1e6 * parent / m, 1e6 * child / m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=9600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--stream", type=int, nargs="?", const=32, default=0, metavar="CHUNKS")
    a = ap.parse_args()
    tune_interpreter()
    logs.configure_logging("info")  # as ``serve`` logs: one access line per call, here to /dev/null
    for h in logging.getLogger("orchard_rec").handlers:
        h.stream = open(os.devnull, "w")  # type: ignore[attr-defined]
    work = Path(tempfile.mkdtemp(prefix="orchard-dbchild-"))
    ls = lines(a.calls, a.stream)
    best: dict[str, float] = {}
    # the child's stderr (its access lines) to /dev/null: it inherits this process's
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    for k in range(a.rounds):
        got = {"in process: the child's work": in_process(ls, a.batch, _db(work, f"i{k}"))}
        os.dup2(null, 2)
        try:
            parent, child = through_process(ls, a.batch, _db(work, f"p{k}"))
        finally:
            os.dup2(saved, 2)
        got["process: the parent's thread"] = parent
        got["process: the child"] = child
        for key, v in got.items():
            best[key] = min(best.get(key, v), v)
    per = a.stream + 2  # a stream's chunks: the first (role, prompt ids), one a token, [DONE]
    for key, v in best.items():
        print(f"{key:36s} {v:7.1f} us/call" + (f"  {v / per:5.2f} us/chunk" if a.stream else ""))
    if a.profile:
        prof = cProfile.Profile(time.thread_time)
        in_process(ls, a.batch, _db(work, "prof"), prof)
        print(f"cProfile of {a.calls - 4 * a.batch} calls in process:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(45)
    for f in work.iterdir():
        f.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
