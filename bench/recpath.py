"""The event loop's CPU per call for recording under ``process`` durability, in process, by part.

    python bench/recpath.py [--calls 20000] [--rounds 5] [--profile]

What the proxy's event loop does per non-stream call to record it under the default durability
(``process``) with the writer process ready, on ``bench/dbthread.py``'s captures (the c=32 bench's
load: one session, token mode's plan, ``bench/fakeupstream.py``'s answer): ``Recorder.durable``
(the call's spool line encoded and written to a real spool file, and handed to the database thread
as that line: ``handoff.Inline._spool_one``) and ``Metrics.observe_call``. The database thread is
not started: its queue is drained here without work, untimed, and the spool acknowledged the way
it does (every ~32 calls).

Printed: microseconds of thread CPU (``time.thread_time``) per call, the best of ``--rounds``
rounds: ``durable`` as a whole and its parts (``Encoder.encode``, ``Spool.append_line``), each
timed alone on the same captures, ``snapshot`` (the copy made instead of the line hand-off when the
writer process is not ready: not on this path), and ``observe_call``.
``--profile``: a cProfile of one more round of ``durable``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dbthread import capture

from orchard_rec.proxy import capline
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.metrics import Metrics
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.proxy.server import tune_interpreter
from orchard_rec.storage import Store
from orchard_rec.storage.spool import Spool

ACK_EVERY = 32


def _recorder(work: Path, tag: str) -> Recorder:
    store = Store(f"sqlite:///{work / f'{tag}.db'}")
    rec = Recorder(store, spool=work / f"{tag}.spool", durability="process", writer="process")
    rec.spool = Spool(rec.spool_path, preallocate=0, keep_bytes=rec.knobs.spool_keep_bytes)  # as start()
    rec._thread = True  # type: ignore[assignment]  # "started": durable writes inline
    rec.proc = _Ready()  # type: ignore[assignment]  # serve's default: the writer process takes the lines
    rec._dbq._asleep = False  # as under load: the database thread looks for calls, no put wakes it
    return rec


class _Ready:
    """Stands in for a ready writer process (``durable`` asks ``is_ready`` alone)."""

    is_ready = True


def _drain(rec: Recorder) -> None:
    """What the database thread would take off the queue (untimed), acknowledged in the spool."""
    q = rec._dbq
    end = None
    while not q.empty():
        item = q.get_nowait()
        end = item[2] if item[2] is not None else end
        rec._release(item[4], len(item[0]))
    if end is not None and rec.spool is not None:
        rec.spool.ack(end)


def _durable(caps: list[Capture], rec: Recorder, prof: cProfile.Profile | None = None) -> float:
    """Seconds of thread CPU for ``durable`` of each capture (on an event loop, as the handler)."""
    clock = time.thread_time

    async def run() -> float:
        spent = 0.0
        for i in range(0, len(caps), ACK_EVERY):
            chunk = caps[i : i + ACK_EVERY]
            for _ in chunk:
                rec.begin()
            if prof is not None:
                prof.enable()
            t = clock()
            for c in chunk:
                await rec.durable(c)
            spent += clock() - t
            if prof is not None:
                prof.disable()
            _drain(rec)
        return spent

    return asyncio.run(run())


def _part(caps: list[Capture], f: Callable[[Capture], object]) -> float:
    clock = time.thread_time
    t = clock()
    for c in caps:
        f(c)
    return clock() - t


def one_round(n: int, work: Path, tag: str) -> dict[str, float]:
    out: dict[str, float] = {}
    caps = [capture() for _ in range(n)]
    rec = _recorder(work, tag)
    out["durable (in all)"] = _durable(caps, rec)
    rec.spool.close()  # type: ignore[union-attr]

    caps = [capture() for _ in range(n)]
    out["  snapshot"] = _part(caps, capline.snapshot)
    enc = capline.Encoder()
    lines: list[bytes] = []
    out["  Encoder.encode"] = _part(caps, lambda c: lines.append(enc.encode(c)))
    spool = Spool(work / f"{tag}.2.spool", preallocate=0, keep_bytes=4 << 20)
    clock = time.thread_time
    t = clock()
    for k, line in enumerate(lines):
        end = spool.append_line(line)
        if k % ACK_EVERY == ACK_EVERY - 1:
            spool.ack(end)
    out["  Spool.append_line"] = clock() - t
    spool.close()

    metrics = Metrics(lambda: 0)
    out["Metrics.observe_call"] = _part(
        caps, lambda c: metrics.observe_call("chat", "ok", c.bytes_in, c.bytes_out, 0.0021, 0.0013)
    )
    return {k: 1e6 * v / n for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    tune_interpreter()
    work = Path(tempfile.mkdtemp(prefix="orchard-recpath-"))
    best: dict[str, float] = {}
    for k in range(a.rounds):
        for key, v in one_round(a.calls, work, f"r{k}").items():
            best[key] = min(best.get(key, v), v)
    print(f"per call, us of thread CPU, best of {a.rounds} rounds of {a.calls} calls:")
    for key, v in best.items():
        print(f"  {key:30s} {v:7.2f}")
    if a.profile:
        caps = [capture() for _ in range(a.calls)]
        prof = cProfile.Profile(time.thread_time)
        _durable(caps, _recorder(work, "prof"), prof)
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    for f in work.iterdir():
        f.unlink()


if __name__ == "__main__":
    main()
