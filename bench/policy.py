"""What policy-version tracking costs the proxy, per call, in ONE run (issue 38: <= 3 % CPU).

    python bench/policy.py              # ~2 minutes on 2 cores
    python bench/policy.py --quick

Two token-mode proxies on SQLite against bench/fakeupstream.py, the same in all but
``ORCHARD_POLICY_TRACKING``: ``on`` (the default: every call fenced, the version it was sent
and finished under, spans stored) and ``off``. The trainer has told both proxies a version
(``POST /v1/orchard/policy``), so every call carries spans. Rounds interleave and rotate the order;
the figure is proxy CPU seconds per call (``/proc/<pid>/stat``), tracking on over off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from run import HERE, ROOT, Target, closed_loop, cpu_seconds, free_port, stop, wait_http


def _serve(name: str, upstream: str, work: Path, tracking: str) -> Target:
    port = free_port()
    cmd = [sys.executable, "-m", "orchard_rec.cli", "serve", "--upstream", upstream, "--port", str(port)]
    cmd += ["--db", f"sqlite:///{work / (name + '.db')}", "--spool", str(work / f"{name}.spool")]
    env = {**os.environ, "ORCHARD_POLICY_TRACKING": tracking}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/healthz")
    req = urllib.request.Request(
        base + "/v1/orchard/policy",
        data=b'{"version": "step-7"}',
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()
    return Target(name, base, proc=proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    rounds, calls = (2, 100) if args.quick else (args.rounds, args.calls)
    work = Path(tempfile.mkdtemp(prefix="orchard-bench-policy-"))
    up_port = free_port()
    up = subprocess.Popen([sys.executable, str(HERE / "fakeupstream.py"), "--port", str(up_port)])
    procs = [up]
    try:
        upstream = f"http://127.0.0.1:{up_port}/v1"
        wait_http(upstream + "/models")
        targets = [_serve("on", upstream, work, "on"), _serve("off", upstream, work, "off")]
        procs += [t.proc for t in targets if t.proc is not None]
        cpu = {t.name: 0.0 for t in targets}
        n = {t.name: 0 for t in targets}
        for t in targets:
            asyncio.run(closed_loop(t, 4, count=40))
        for r in range(rounds):
            for t in targets[r % 2 :] + targets[: r % 2]:
                assert t.proc is not None
                c0 = cpu_seconds(t.proc.pid)
                res = asyncio.run(closed_loop(t, 8, count=calls))
                cpu[t.name] += cpu_seconds(t.proc.pid) - c0
                n[t.name] += len(res["lat"]) - res["errors"]
            print(f"round {r + 1}/{rounds}", file=sys.stderr)
        per = {k: cpu[k] / max(1, n[k]) * 1e3 for k in cpu}
        out = {
            "cpu_ms_per_call": per,
            "calls": n,
            "ratio_on_over_off": per["on"] / per["off"] if per["off"] else None,
        }
        print(json.dumps(out))
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
