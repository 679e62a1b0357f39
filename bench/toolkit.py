"""Toolkit benchmark: reconstruction calls/s and export samples/s with peak memory.

    python bench/toolkit.py [--calls 100000] [--turns 10] [--formats jsonl,parquet,slime] [--drift]

Builds a SQLite database of synthetic recorded sessions (``--calls`` calls, ``--turns``
calls per session, growing prompts, exact ids and logprobs), then measures, each in a
fresh subprocess so peak RSS is its own:
- ``reconstruct``: records read from the database and merged into samples, nothing written;
- ``export:<fmt>``: the full ``orchard-rec export`` path (database -> samples -> file);
- with ``--drift`` the client resends every generated turn with one id replaced by three (a byte
  the client got as U+FFFD, issue 42), so no prompt extends a sample: ``reconstruct`` splits every
  call, ``reconstruct:realign`` (``--on-mismatch realign``) resyncs each drifted region.
Runs each measurement at 1/10 of the calls too, so "memory flat in the number of calls"
is visible in the same table. Loopback-free: touches only files.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build_db(url: str, calls: int, turns: int, seed: int = 7, drift: bool = False) -> None:
    from orchard_rec.records import CallOutcome, CallRecord, Dialect
    from orchard_rec.storage import Store

    rng = random.Random(seed)
    store = Store(url)
    store.upgrade()
    batch: list[CallRecord] = []
    t0 = time.time()
    for s in range(calls // turns):
        prompt = [rng.randrange(1000) for _ in range(200)]
        for k in range(turns):
            completion = [rng.randrange(1000) for _ in range(40)] + [2]
            batch.append(
                CallRecord(
                    call_id=f"{s:08d}{k:04d}",
                    session_id=f"s{s:07d}",
                    dialect=Dialect.CHAT,
                    method="POST",
                    path="/v1/chat/completions",
                    stream=False,
                    status_code=200,
                    outcome=CallOutcome.OK,
                    received_at=t0 + s + k * 0.01,
                    first_byte_at=None,
                    done_at=t0 + s + k * 0.01 + 0.005,
                    prompt_ids=tuple(prompt),
                    completion_ids=tuple(completion),
                    completion_logprobs=tuple(-0.1 for _ in completion),
                    finish_reason="stop",
                    request={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                )
            )
            resent = completion[:5] + [1001, 1002, 1003] + completion[6:] if drift else completion
            prompt = prompt + resent + [rng.randrange(1000) for _ in range(20)]
            if len(batch) >= 2000:
                store.write_batch(batch)
                batch = []
    store.write_batch(batch)
    store.close()


def _measure(kind: str, url: str, out_dir: str) -> dict[str, float]:
    """Runs in a child process: one measurement, its own peak RSS."""
    from orchard_rec.exporters.pipeline import export, select_samples
    from orchard_rec.storage import Store

    t = time.perf_counter()
    cpu = time.process_time()
    if kind.startswith("reconstruct"):
        store = Store(url)
        n_samples = n_calls = 0
        for s in select_samples(store, on_mismatch="realign" if kind.endswith("realign") else "split"):
            n_samples += 1
            n_calls += len(s.turns)
        store.close()
    else:
        fmt = kind.split(":", 1)[1]
        options = {"rollout_size": 4096} if fmt == "slime" else {}  # one rollout file per 4096 samples
        stats = export(url, fmt, Path(out_dir) / f"out.{fmt}", format_options=options)
        n_samples = stats.samples
        n_calls = stats.samples * 0  # not counted by exporters
    wall = time.perf_counter() - t
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu,
        "samples": n_samples,
        "calls": n_calls,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--formats", default="jsonl")
    ap.add_argument("--drift", action="store_true", help="turns resent with a U+FFFD's ids (issue 42)")
    ap.add_argument(
        "--json",
        action="store_true",
        help="also print the rows as one JSON line at the end (bench/run.py reads it)",
    )
    ap.add_argument("--child", nargs=3, metavar=("KIND", "URL", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_measure(*a.child)))
        return
    work = Path(tempfile.mkdtemp(prefix="orchard-bench-"))
    rows = []
    for n in (a.calls // 10, a.calls):
        url = f"sqlite:///{work / f'bench_{n}.db'}"
        t = time.perf_counter()
        build_db(url, n, a.turns, drift=a.drift)
        print(f"built {n} calls in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        kinds = ["reconstruct"] + (["reconstruct:realign"] if a.drift else [])
        for kind in kinds + [f"export:{f}" for f in a.formats.split(",") if f]:
            r = subprocess.run(
                [sys.executable, __file__, "--child", kind, url, str(work)],
                capture_output=True,
                text=True,
                check=True,
            )
            m = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append((n, kind, m))
    print(f"{'calls':>8} {'measure':<20} {'wall s':>8} {'calls/s':>10} {'samples/s':>10} {'peak RSS MB':>12}")
    for n, kind, m in rows:
        print(
            f"{n:>8} {kind:<20} {m['wall_s']:>8.2f} {n / m['wall_s']:>10.0f} {m['samples'] / m['wall_s']:>10.0f} {m['peak_rss_mb']:>12.1f}"
        )
    for f in work.iterdir():
        f.unlink()
    os.rmdir(work)
    if a.json:
        print(json.dumps([{**m, "calls": n, "measure": kind} for n, kind, m in rows]))


if __name__ == "__main__":
    main()
