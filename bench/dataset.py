"""Dataset export: one process vs ``--engine ray`` on a local 2-CPU Ray cluster (issue 44).

    python bench/dataset.py [--sessions 64] [--turns 200] [--repeat 2]

Builds a SQLite database of long synthetic sessions (``bench/toolkit.py``'s generator: a
200-token prompt growing by 61 tokens a turn, ``--turns`` calls per session, one sample per
session), then exports it as a partitioned dataset to a local folder (``file://``):
- ``one process``: ``export_dataset`` in a fresh subprocess (its own peak RSS);
- ``ray, 2 workers``: ``export_dataset_ray`` with ``ray.init(num_cpus=2)`` in a fresh
  subprocess; wall time without Ray's start (measured apart), and each worker process's peak
  RSS (``ru_maxrss`` asked of every worker afterwards).
The two datasets are compared sample for sample. Ratios within one run; touches only files.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _peak() -> tuple[int, float]:
    import os

    return os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, db: str, out: str) -> dict[str, float]:
    if kind == "one":
        from orchard_rec.exporters.pipeline import export_dataset

        t = time.perf_counter()
        stats = export_dataset(db, out)
        return {
            "wall_s": time.perf_counter() - t,
            "samples": stats.samples,
            "tokens": stats.tokens,
            "peak_mb": _peak()[1],
        }
    import ray

    from orchard_rec.exporters.ray_engine import export_dataset_ray

    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    start = time.perf_counter() - t
    t = time.perf_counter()
    stats = export_dataset_ray(db, out)
    wall = time.perf_counter() - t
    peak = ray.remote(_peak)
    workers = dict(ray.get([peak.remote() for _ in range(16)]))
    ray.shutdown()
    return {
        "wall_s": wall,
        "ray_start_s": start,
        "samples": stats.samples,
        "tokens": stats.tokens,
        "peak_mb": _peak()[1],
        "worker_peak_mb": sorted(workers.values(), reverse=True),
    }


def _same(a: str, b: str) -> bool:
    from orchard_rec.datasets import open_dataset

    rows = [
        sorted((s.to_dict() for s in open_dataset(u).samples()), key=lambda d: d["index"]) for u in (a, b)
    ]
    return rows[0] == rows[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(*a.child)))
        return
    from toolkit import build_db

    work = Path(tempfile.mkdtemp(prefix="orchard-bench-ds-"))
    db = f"sqlite:///{work / 'bench.db'}"
    t = time.perf_counter()
    build_db(db, a.sessions * a.turns, a.turns)
    print(f"built {a.sessions} sessions x {a.turns} calls in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    results: dict[str, list[dict[str, float]]] = {"one": [], "ray": []}
    for r in range(a.repeat):
        for kind in ("one", "ray"):  # interleaved, so machine load hits both alike
            out = f"file://{work}/{kind}{r}"
            p = subprocess.run(
                [sys.executable, __file__, "--child", kind, db, out],
                capture_output=True,
                text=True,
                check=True,
            )
            results[kind].append(json.loads(p.stdout.strip().splitlines()[-1]))
    same = _same(f"file://{work}/one0", f"file://{work}/ray0")
    one = min(results["one"], key=lambda m: m["wall_s"])
    ray_ = min(results["ray"], key=lambda m: m["wall_s"])
    tokens = one["tokens"] / one["samples"]
    print(f"{a.sessions} sessions of {a.turns} calls ({tokens:.0f} tokens a sample), best of {a.repeat}")
    print("| engine | wall s | samples/s | tokens/s | peak RSS MB |")
    print("|---|---|---|---|---|")
    print(
        f"| one process | {one['wall_s']:.2f} | {one['samples'] / one['wall_s']:.1f} | "
        f"{one['tokens'] / one['wall_s']:.0f} | {one['peak_mb']:.0f} |"
    )
    workers = ", ".join(f"{m:.0f}" for m in ray_["worker_peak_mb"][:2])  # type: ignore[index]
    print(
        f"| ray, 2 workers | {ray_['wall_s']:.2f} (+{ray_['ray_start_s']:.1f} start) | "
        f"{ray_['samples'] / ray_['wall_s']:.1f} | {ray_['tokens'] / ray_['wall_s']:.0f} | "
        f"driver {ray_['peak_mb']:.0f}, workers {workers} |"
    )
    print(f"throughput ratio ray/one: {one['wall_s'] / ray_['wall_s']:.2f}; datasets equal: {same}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
