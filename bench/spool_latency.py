"""What a client waits for under ``--durability wal``: the spool's share of the added latency.

Two parts, each A/B alternated in one run (the box is shared and noisy: only the ratios within
a run mean much):

1. ``raw``: one append of ``--line-bytes`` made durable, on the spool's filesystem: write + fsync
   of a file truncated before each append (what the spool did until the segments kept zeros
   ahead), write + fdatasync of the same, and an overwrite in place of zeros written ahead +
   fdatasync (no size change to journal). ``--gap-ms`` idle between appends (a device flushes
   slower after an idle gap).
2. ``recorder``: ``Recorder.durable`` (submit -> the spool thread encodes the capture line,
   writes and syncs it -> the client's future is set) for the ``Capture`` objects of one real
   SWE-like session (``bench/longhorizon.py``'s bodies through an in-process token-mode proxy
   against its fake vLLM upstream), each call recorded before the next, timed at its last
   ``--tail`` turns (~135k-152k tokens at 200 turns). Variants: ``main`` (the spool as before:
   plain appends; ``durable`` awaiting through ``asyncio.shield``), ``plain`` (plain appends,
   this tree's ``durable``) and ``zeros`` (this tree: zeros written ahead, overwritten in place).
   Also per call: the encode and the append (write + sync) as timed on the spool thread.

    python bench/spool_latency.py [--turns 200] [--rounds 3] [--reps 300] [--parts raw,recorder]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import longhorizon as lh  # noqa: E402

from orchard_rec.proxy.app import RECORDER, build_app  # noqa: E402
from orchard_rec.proxy.capture import Capture  # noqa: E402
from orchard_rec.proxy.config import ProxyConfig  # noqa: E402
from orchard_rec.proxy.recorder import Recorder  # noqa: E402
from orchard_rec.proxy.server import BackgroundServer  # noqa: E402
from orchard_rec.storage.store import Store  # noqa: E402


def _pct(v: list[float]) -> str:
    v = sorted(v)
    return f"median {statistics.median(v):.3f} / p90 {v[int(len(v) * 0.9)]:.3f} ms"


def raw(directory: Path, reps: int, line_bytes: int, gap_s: float, block: int = 50) -> dict[str, list[float]]:
    line = b"x" * (line_bytes - 1) + b"\n"
    zeros = 64 << 20

    def mk(name: str) -> int:
        return os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    fds = {"truncate, write, fsync (before)": mk("a"), "truncate, write, fdatasync": mk("b")}
    fds["zeros ahead, overwrite, fdatasync"] = z = mk("c")
    fds["zeros ahead, overwrite at the front, fdatasync"] = z0 = mk("d")  # everything acknowledged
    for fd in (z, z0):
        os.pwrite(fd, bytes(zeros), 0)
        os.fsync(fd)
    res: dict[str, list[float]] = {k: [] for k in fds}
    pos = 0
    try:
        # in blocks, not call by call: a truncation's freed blocks are discarded (``discard``
        # mounts) and journaled after it, which would slow whichever variant runs next
        for _ in range(reps // block):
            for name, fd in fds.items():
                for k in range(block + 5):
                    time.sleep(gap_s)
                    zeroed = name.startswith("zeros")
                    if not zeroed:
                        os.ftruncate(fd, 0)
                    t = time.perf_counter_ns()
                    os.pwrite(fd, line, pos if name == "zeros ahead, overwrite, fdatasync" else 0)
                    (os.fdatasync if "fdatasync" in name else os.fsync)(fd)
                    if k >= 5:  # the first few settle what the variant before left
                        res[name].append((time.perf_counter_ns() - t) / 1e6)
                    pos = (pos + len(line)) % (zeros - len(line))
    finally:
        for fd in fds.values():
            os.close(fd)
        for f in "abcd":
            (directory / f).unlink()
    return res


def captures(turns: int) -> list[Capture]:
    """The ``Capture`` objects (as the spool thread gets them) of one growing session, non-stream."""
    bodies = lh._bodies(turns)
    port = lh._free_port()
    up = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "longhorizon.py"), "--fake-upstream", str(port)]
    )
    caps: list[Capture] = []
    try:
        lh._wait(f"http://127.0.0.1:{port}/v1/models")
        with tempfile.TemporaryDirectory() as tmp:
            cfg = ProxyConfig(
                upstream=f"http://127.0.0.1:{port}/v1",
                db=f"sqlite:///{tmp}/s.db",
                mode="token",
                durability="wal",
                spool=f"{tmp}/s.spool",
            )
            with BackgroundServer(lambda: build_app(cfg)) as proxy:
                assert proxy.app is not None
                rec = proxy.app[RECORDER]
                enc = rec.lines.encode

                def tap(cap: Capture) -> bytes:
                    caps.append(cap)
                    return enc(cap)

                rec.lines.encode = tap  # type: ignore[method-assign]
                for body in bodies:
                    req = urllib.request.Request(
                        f"{proxy.url}/s/lat/v1/chat/completions",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    )
                    with urllib.request.urlopen(req, timeout=60) as r:
                        r.read()
                    assert rec.flush()
    finally:
        up.terminate()
        up.wait(10)
    return caps


async def _main_durable(rec: Recorder, cap: Capture) -> None:
    """``Recorder.durable`` as main had it before this change (through ``asyncio.shield``)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not fut.done():
            fut.set_result(None)

    def ack() -> None:
        loop.call_soon_threadsafe(settle)

    cap.submitted = True
    rec.submit(cap, ack)
    await asyncio.shield(fut)


def recorder_pass(caps: list[Capture], variant: str, tail: int, directory: Path) -> dict[str, list[float]]:
    """One session's calls through a fresh recorder (its own database and spool)."""
    directory = Path(tempfile.mkdtemp(dir=directory, prefix=variant))
    store = Store(f"sqlite:///{directory}/db")
    store.upgrade()
    rec = Recorder(store, spool=directory / "spool", durability="wal")
    rec.start()
    assert rec.spool is not None
    if variant != "zeros":
        rec.spool.preallocate = 0
    out: dict[str, list[float]] = {"durable": [], "encode": [], "append": []}
    enc, app = rec.lines.encode, rec.spool.append_lines
    last: dict[str, float] = {}

    def timed(name: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(x: Any) -> Any:
            t = time.perf_counter_ns()
            r = fn(x)
            last[name] = (time.perf_counter_ns() - t) / 1e6
            return r

        return run

    rec.lines.encode = timed("encode", enc)  # type: ignore[method-assign,assignment]
    rec.spool.append_lines = timed("append", app)  # type: ignore[method-assign,assignment]
    durable: Callable[[Capture], Any] = (
        (lambda c: _main_durable(rec, c)) if variant == "main" else (lambda c: rec.durable(c))
    )

    async def drive() -> None:
        for k, cap in enumerate(caps):
            rec.begin()
            t = time.perf_counter_ns()
            await durable(cap)
            dt = (time.perf_counter_ns() - t) / 1e6
            await asyncio.to_thread(rec.flush)  # recorded before the next, as a session's turns are
            await asyncio.sleep(0.02)
            if k >= len(caps) - tail:
                out["durable"].append(dt)
                out["encode"].append(last["encode"])
                out["append"].append(last["append"])

    try:
        import uvloop

        uvloop.run(drive())
    except ImportError:  # pragma: no cover
        asyncio.run(drive())
    rec.close()
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="raw,recorder")
    ap.add_argument("--reps", type=int, default=300, help="raw: appends per variant")
    ap.add_argument("--line-bytes", type=int, default=26_000, help="raw: a capture line at ~150k tokens")
    ap.add_argument("--gap-ms", type=float, default=5.0, help="raw: idle between appends")
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--tail", type=int, default=40, help="recorder: turns timed, from the session's end")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="main,plain,zeros")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary directory)")
    a = ap.parse_args()
    parts = a.parts.split(",")
    sys.setswitchinterval(0.0005)  # as `serve` runs (proxy.server.tune_interpreter)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        d = Path(tmp)
        fs = subprocess.run(["stat", "-f", "-c", "%T", str(d)], capture_output=True, text=True).stdout.strip()
        print(
            f"# spool latency ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {d} on {fs}, {lh._load()})"
        )
        if "raw" in parts:
            r = raw(d, a.reps, a.line_bytes, a.gap_ms / 1e3)
            print(
                f"\nraw: one {a.line_bytes:,}-byte append made durable, {a.reps} each, alternated in blocks "
                f"of 50, {a.gap_ms} ms apart"
            )
            for name, v in r.items():
                print(f"- {name}: {_pct(v)}")
        if "recorder" in parts:
            caps = captures(a.turns)
            variants = a.variants.split(",")
            res: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
            for _ in range(a.rounds):
                for v in variants:
                    for key, vals in recorder_pass(caps, v, a.tail, d).items():
                        res[v].setdefault(key, []).extend(vals)
            print(
                f"\nrecorder: `Recorder.durable` at turns {a.turns - a.tail + 1}-{a.turns} of one session "
                f"({a.rounds} rounds alternated, {lh._load()})"
            )
            for v in variants:
                print(
                    f"- {v}: durable {_pct(res[v]['durable'])}; of which encode {_pct(res[v]['encode'])}, "
                    f"append {_pct(res[v]['append'])}"
                )


if __name__ == "__main__":
    main()
