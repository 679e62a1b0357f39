"""Side-by-side proxy benchmark, in ONE run, interleaving rounds and rotating target order.

    python bench/run.py                 # ~6-8 minutes on 2 cores; writes bench/RESULTS.md and bench/latency.png
    python bench/run.py --quick         # one round, fewer requests (a smoke run)

Targets: ``direct`` (client -> fake upstream), ``floor`` (bench/floor.py, a bare aiohttp
forwarder), orchard-rec ``passthrough`` and ``token`` on SQLite and PostgreSQL (a throwaway
cluster, when the server binaries are there), ``token+responses`` (Responses -> chat
translation), ``tito`` (token-in/token-out; the fake upstream answers its completions), and
LiteLLM's proxy and rllm-model-gateway, each in its own venv under
``~/.cache/orchard-rec/bench`` (installed from the package index by ``bench/competitors.sh`` on
the first run), and ``orchard-token-slowdb`` (a database write that takes 50 ms per batch: the
responses must not slow down, and every call must still be recorded).
Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = Path(os.environ.get("ORCHARD_BENCH_CACHE", Path.home() / ".cache" / "orchard-rec" / "bench"))
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there, benchmark"}]}
RESP = {"model": "m", "input": "hello there, benchmark"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def stop(procs: list[subprocess.Popen]) -> None:  # type: ignore[type-arg]
    """Terminates every process, then waits for each (killed after 30 s)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a proxy's database writer process, ``--workers``' workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and every process under it (a child that ended meanwhile is
    not counted: none does while a target runs)."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(parts[11]) + int(parts[12])
    return total / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """The peak RSS of ``pid`` plus that of each process under it (the writer process)."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@dataclass
class Target:
    name: str
    base: str
    path: str = "/v1/chat/completions"
    body: dict = field(default_factory=lambda: CHAT)  # type: ignore[type-arg]
    proc: subprocess.Popen | None = None  # type: ignore[type-arg]
    db: str | None = None
    results: dict = field(default_factory=dict)  # type: ignore[type-arg]
    sent: int = 0


async def closed_loop(
    t: Target,
    concurrency: int,
    *,
    count: int | None = None,
    seconds: float | None = None,
    stream: bool = False,
) -> dict:  # type: ignore[type-arg]
    lat: list[float] = []
    ttft: list[float] = []
    gaps: list[float] = []
    errors = 0
    body = {**t.body, "stream": stream}
    stop = time.monotonic() + (seconds or 3600)
    left = [count if count is not None else 10**9]
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=10)) as http:

        async def worker() -> None:
            nonlocal errors
            while left[0] > 0 and time.monotonic() < stop:
                left[0] -= 1
                t0 = time.perf_counter()
                try:
                    async with http.post(
                        t.base + t.path, json=body, headers={"Authorization": "Bearer sk-bench"}
                    ) as r:
                        if stream:
                            last = None
                            async for _ in r.content.iter_any():
                                now = time.perf_counter()
                                if last is None:
                                    ttft.append(now - t0)
                                else:
                                    gaps.append(now - last)
                                last = now
                        else:
                            await r.read()
                        if r.status != 200:
                            errors += 1
                except (TimeoutError, aiohttp.ClientError):
                    errors += 1
                lat.append(time.perf_counter() - t0)
                t.sent += 1

        t_start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t_start
    return {"lat": lat, "ttft": ttft, "gaps": gaps, "errors": errors, "rps": len(lat) / wall if wall else 0.0}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def start_targets(
    args: argparse.Namespace, work: Path
) -> tuple[list[Target], list[subprocess.Popen], object | None]:  # type: ignore[type-arg]
    procs: list[subprocess.Popen] = []  # type: ignore[type-arg]
    up_port = free_port()
    procs.append(
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "fakeupstream.py"),
                "--port",
                str(up_port),
                "--chunk-delay",
                str(args.chunk_delay),
            ]
        )
    )
    upstream = f"http://127.0.0.1:{up_port}/v1"
    wait_http(upstream + "/models")
    targets = [Target("direct", f"http://127.0.0.1:{up_port}")]
    fp = free_port()
    p = subprocess.Popen([sys.executable, str(HERE / "floor.py"), "--port", str(fp), "--upstream", upstream])
    procs.append(p)
    targets.append(Target("floor", f"http://127.0.0.1:{fp}", proc=p))

    pg = None
    dbs = {"sqlite": lambda n: f"sqlite:///{work / (n + '.db')}"}
    if not args.no_pg:
        try:
            sys.path.insert(0, str(ROOT / "tests"))
            from pg import PgCluster  # type: ignore[import-not-found]

            pg = PgCluster().start()
            dbs["pg"] = lambda n: pg.new_database()  # type: ignore[union-attr]
        except Exception as exc:  # no server binaries: PostgreSQL rows are skipped, and said so
            print(f"PostgreSQL targets skipped: {exc}", file=sys.stderr)

    def orchard(
        name: str,
        mode: str,
        db: str,
        extra: list[str] | None = None,
        path: str = "/v1/chat/completions",
        body: dict | None = None,
        env: dict | None = None,
        tree: Path = ROOT,
    ) -> None:  # type: ignore[type-arg]
        if args.only and name not in args.only.split(",") and name.split("@")[0] not in args.only.split(","):
            return
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "orchard_rec.cli",
            "serve",
            "--upstream",
            upstream,
            "--db",
            db,
            "--port",
            str(port),
            "--mode",
            mode,
            "--spool",
            str(work / f"{name}.spool"),
            *(extra or []),
        ]
        # ``-m orchard_rec.cli`` from ``tree``: that tree's package (``--baseline``: another checkout)
        penv = {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}
        proc = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.DEVNULL, env=penv)
        procs.append(proc)
        wait_http(f"http://127.0.0.1:{port}/healthz")
        targets.append(
            Target(name, f"http://127.0.0.1:{port}", path=path, body=body or CHAT, proc=proc, db=db)
        )

    for kind, make in dbs.items():
        orchard(f"orchard-passthrough-{kind}", "passthrough", make(f"pass-{kind}"))
        orchard(f"orchard-token-{kind}", "token", make(f"token-{kind}"))  # default durability: process
        # the last byte after the spool's fsync (group commit): a power loss loses nothing
        orchard(
            f"orchard-token-{kind}-machine",
            "token",
            make(f"token-machine-{kind}"),
            extra=["--durability", "machine"],
        )
        # the opt-out: records after the response (kill -9 loses what is queued)
        orchard(
            f"orchard-token-{kind}-async",
            "token",
            make(f"token-async-{kind}"),
            extra=["--durability", "async"],
        )
    if "sqlite" in dbs:  # the records in a thread of the proxy (the default on 2+ cores: the writer process)
        orchard(
            "orchard-token-sqlite-thread",
            "token",
            dbs["sqlite"]("token-thread"),
            extra=["--db-writer", "thread"],
        )
    if args.baseline:  # the same default target from another source tree, in the same rounds
        orchard(
            "orchard-token-sqlite@baseline",
            "token",
            dbs["sqlite"]("token-base"),
            tree=Path(args.baseline).resolve(),
        )
    orchard("orchard-token+responses", "token", dbs["sqlite"]("resp"), path="/v1/responses", body=RESP)
    # a slow database: every batch write sleeps 50 ms; the bounded queue must absorb it
    orchard(
        "orchard-token-slowdb", "token", dbs["sqlite"]("slow"), env={"ORCHARD_FAULT_WRITE_DELAY_S": "0.05"}
    )

    if not args.no_competitors and not (CACHE / "litellm" / "bin" / "litellm").exists():
        subprocess.run(["bash", str(HERE / "competitors.sh")], check=False)

    def competitor(name: str, argv: list[str], port: int, health: str, env: dict | None = None) -> None:  # type: ignore[type-arg]
        if args.only and name not in args.only.split(","):
            return
        log = open(work / f"{name}.log", "w")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        try:
            wait_http(f"http://127.0.0.1:{port}{health}", timeout=120)
            targets.append(Target(name, f"http://127.0.0.1:{port}", proc=proc))
        except RuntimeError as exc:
            print(
                f"{name} skipped: {exc}; its log: {(work / f'{name}.log').read_text()[-2000:]}",
                file=sys.stderr,
            )

    litellm = CACHE / "litellm" / "bin" / "litellm"
    if litellm.exists() and not args.no_competitors:
        port = free_port()
        cfg = work / "litellm.yaml"
        cfg.write_text(
            f"model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n      api_base: {upstream}\n      api_key: sk-bench\n"
            "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
        )
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        }
        competitor(
            "litellm",
            [str(litellm), "--config", str(cfg), "--port", str(port), "--num_workers", "1"],
            port,
            "/health/liveliness",
            env,
        )
    rllm = CACHE / "rllm" / "bin" / "rllm-model-gateway"
    if rllm.exists() and not args.no_competitors:
        port = free_port()
        competitor(
            "rllm-model-gateway",
            [
                str(rllm),
                "--port",
                str(port),
                "--worker",
                upstream[: -len("/v1")],
                "--store",
                "sqlite",
                "--db-path",
                str(work / "rllm.db"),
                "--log-level",
                "ERROR",
            ],
            port,
            "/health",
        )
    return targets, procs, pg


def recorded(t: Target) -> int | None:
    if t.db is None:
        return None
    deadline = time.time() + 60
    while time.time() < deadline:
        h = json.loads(urllib.request.urlopen(t.base + "/healthz").read())
        if h["queue_depth"] == 0:
            break
        time.sleep(0.2)
    from orchard_rec.storage import Store

    return Store(t.db).count_calls()


def _other_sections(path: Path, ours: list[str]) -> list[str]:
    """The sections other benchmarks wrote into the report (viewer, durability, long sessions,
    teacher...): kept as they are when this run rewrites its own."""
    if not path.exists():
        return []
    produced = {ln.split("(")[0].strip() for ln in ours if ln.startswith("## ")}
    kept: list[str] = []
    keep = False
    for ln in path.read_text().splitlines():
        if ln.startswith("## "):
            keep = ln.split("(")[0].strip() not in produced
        if keep:
            kept.append(ln)
    return [""] + kept if kept else []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chunk-delay", type=float, default=0.002)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument(
        "--no-competitors", action="store_true", help="do not install or run LiteLLM and rllm-model-gateway"
    )
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"))
    ap.add_argument(
        "--no-toolkit",
        action="store_true",
        help="skip the toolkit benchmark (reconstruction and export on 100k calls)",
    )
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated target names to run (e.g. floor,orchard-token-sqlite), for quick comparisons",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        help="another source tree (e.g. a git worktree of an earlier commit): its `serve` as the target"
        " orchard-token-sqlite@baseline, run in the same interleaved rounds",
    )
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    n1 = 60 if args.quick else 200
    secs = 1.0 if args.quick else 1.5
    work = Path(tempfile.mkdtemp(prefix="orchard-bench-"))
    targets, procs, pg = start_targets(args, work)
    phases = [("c1", 1, False), ("stream", 1, True), ("c32", 32, False), ("c256", 256, False)]
    try:
        for t in targets:  # warm up connections and caches
            asyncio.run(closed_loop(t, 4, count=40))
        for r in range(rounds):
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            for t in order:
                for name, c, stream in phases:
                    cpu0 = cpu_seconds(t.proc.pid) if t.proc else 0.0
                    res = asyncio.run(
                        closed_loop(
                            t,
                            c,
                            count=n1 if c == 1 and not stream else (n1 // 3 if stream else None),
                            seconds=None if c == 1 else secs,
                            stream=stream,
                        )
                    )
                    res["cpu"] = (cpu_seconds(t.proc.pid) - cpu0) if t.proc else 0.0
                    t.results.setdefault(name, []).append(res)
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
        for t in targets:
            t.results["rss"] = rss_mb(t.proc.pid) if t.proc else 0.0
            t.results["recorded"] = recorded(t)
    finally:
        stop(procs)
        if pg is not None:
            pg.cleanup()  # type: ignore[attr-defined]
    toolkit = None
    if not args.no_toolkit and not args.only:
        print("toolkit: reconstruction and export on 100k one-call sessions ...", file=sys.stderr)
        r = subprocess.run(
            [
                sys.executable,
                str(HERE / "toolkit.py"),
                "--calls",
                "100000",
                "--turns",
                "1",
                "--formats",
                "jsonl,parquet,slime",
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        toolkit = json.loads(r.stdout.strip().splitlines()[-1])
    report(targets, rounds, args, work, toolkit)
    shutil.rmtree(work, ignore_errors=True)


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for p in ("orchard-rec", "aiohttp", "uvloop", "sqlalchemy", "orjson"):
        try:
            out.append(f"{p} {version(p)}")
        except PackageNotFoundError:  # uvloop is optional
            out.append(f"{p} (not installed)")
    for name, pkg in (("litellm", "litellm"), ("rllm", "rllm-model-gateway")):
        py = CACHE / name / "bin" / "python"
        if py.exists():
            v = subprocess.run(
                [str(py), "-c", f"import importlib.metadata as m; print(m.version({pkg!r}))"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            out.append(f"{pkg} {v}")
    return ", ".join(out)


def _verdicts(rows: list[dict]) -> list[str]:  # type: ignore[type-arg]
    """The issue's targets, as ratios within this run."""
    by = {r["target"]: r for r in rows}
    tok, floor = by.get("orchard-token-sqlite"), by.get("floor")
    if tok is None or floor is None:
        return []
    out = [
        "## Targets (orchard-rec token mode on SQLite, ratios within this run)",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]

    def row(name: str, value: float, goal: float, fmt: str, le: bool = True) -> None:
        ok = value <= goal if le else value >= goal
        out.append(f"| {name} | {fmt.format(value)} | {'yes' if ok else 'no'} |")

    row("added p50 (c=1) <= 2x the floor's", tok["added_p50_ms"] / floor["added_p50_ms"], 2.0, "{:.2f}x")
    if "rllm-model-gateway" in by:
        row(
            "added p50 (c=1) <= 0.3x rllm-model-gateway's",
            tok["added_p50_ms"] / by["rllm-model-gateway"]["added_p50_ms"],
            0.3,
            "{:.2f}x",
        )
    row("proxy CPU per call <= 2x the floor's", tok["cpu_ms"] / floor["cpu_ms"], 2.0, "{:.2f}x")
    for goal, whose in ((0.6, "issue 40's"), (0.8, "the first benchmark's aim")):
        row(
            f"throughput c=32 >= {goal}x the floor's ({whose})",
            tok["rps"]["c32"] / floor["rps"]["c32"],
            goal,
            "{:.2f}x",
            le=False,
        )
    if "litellm" in by:
        row(
            "throughput c=32 >= 10x LiteLLM's",
            tok["rps"]["c32"] / by["litellm"]["rps"]["c32"],
            10.0,
            "{:.1f}x",
            le=False,
        )
    row(
        "stream: added inter-chunk gap <= the floor's (+0.02 ms measurement noise)",
        tok["added_gap_ms"] - floor["added_gap_ms"],
        0.02,
        "{:+.3f} ms vs floor",
    )
    row("stream: added TTFT <= 2x the floor's", tok["added_ttft_ms"] / floor["added_ttft_ms"], 2.0, "{:.2f}x")
    slow = by.get("orchard-token-slowdb")
    if slow is not None:
        row(
            "slow database (50 ms per write): added p50 <= 1.5x the normal database's",
            slow["added_p50_ms"] / tok["added_p50_ms"],
            1.5,
            "{:.2f}x",
        )
        out.append(
            f"| slow database: every call recorded once drained | {slow['recorded']} / {slow['sent']} | {'yes' if slow['recorded'] == slow['sent'] else 'no'} |"
        )
    return out


def _toolkit_lines(rows: list[dict]) -> list[str]:  # type: ignore[type-arg]
    out = [
        "## Toolkit (`python bench/toolkit.py --calls 100000 --turns 1 --formats jsonl,parquet,slime`, one process each, one core)",
        "",
        "| calls | measure | wall s | calls/s | samples/s | peak RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['calls']} | {r['measure']} | {r['wall_s']:.2f} | {r['calls'] / r['wall_s']:.0f} | {r['samples'] / r['wall_s']:.0f} | {r['peak_rss_mb']:.1f} |"
        )
    big = max(r["calls"] for r in rows)
    at = {(r["calls"], r["measure"]): r for r in rows}
    out += ["", "| target | measured | met |", "|---|---|---|"]
    rec = at[(big, "reconstruct")]
    out.append(
        f"| reconstruction >= 20k calls/s | {rec['calls'] / rec['wall_s']:.0f} | {'yes' if rec['calls'] / rec['wall_s'] >= 20000 else 'no'} |"
    )
    for (n, kind), r in sorted(at.items()):
        if n == big and kind.startswith("export:"):
            v = r["samples"] / r["wall_s"]
            out.append(f"| export {kind[7:]} >= 20k samples/s | {v:.0f} | {'yes' if v >= 20000 else 'no'} |")
    small = min(r["calls"] for r in rows)
    for kind in sorted({r["measure"] for r in rows}):
        a, b = at[(small, kind)]["peak_rss_mb"], at[(big, kind)]["peak_rss_mb"]
        out.append(
            f"| {kind}: memory flat ({small} -> {big} calls) | {a:.0f} -> {b:.0f} MB | {'yes' if b <= a * 1.15 else 'no'} |"
        )
    return out


def report(
    targets: list[Target],
    rounds: int,
    args: argparse.Namespace,
    work: Path,
    toolkit: list[dict] | None = None,
) -> None:  # type: ignore[type-arg]
    direct = next(t for t in targets if t.name == "direct")
    d50 = statistics.median(pct(r["lat"], 50) for r in direct.results["c1"])
    d99 = statistics.median(pct(r["lat"], 99) for r in direct.results["c1"])
    dttft = statistics.median(pct(r["ttft"], 50) for r in direct.results["stream"])
    dgap = statistics.median(statistics.fmean(r["gaps"]) for r in direct.results["stream"] if r["gaps"])
    drps = {c: statistics.median(r["rps"] for r in direct.results[c]) for c in ("c1", "c32", "c256")}
    rows = []
    for t in targets:
        res = t.results
        a50 = [pct(r["lat"], 50) - d50 for r in res["c1"]]
        a99 = [pct(r["lat"], 99) - d99 for r in res["c1"]]
        ttft = [pct(r["ttft"], 50) - dttft for r in res["stream"]]
        gap = [statistics.fmean(r["gaps"]) - dgap for r in res["stream"] if r["gaps"]]
        rps = {c: [r["rps"] for r in res[c]] for c in ("c1", "c32", "c256")}
        calls32 = sum(len(r["lat"]) for r in res["c32"])
        cpu_ms = 1000 * sum(r["cpu"] for r in res["c32"]) / calls32 if t.proc and calls32 else 0.0
        errors = sum(r["errors"] for ph in ("c1", "stream", "c32", "c256") for r in res[ph])
        rows.append(
            {
                "target": t.name,
                "added_p50_ms": statistics.median(a50) * 1e3,
                "added_p50_range": (min(a50) * 1e3, max(a50) * 1e3),
                "added_p99_ms": statistics.median(a99) * 1e3,
                "added_ttft_ms": statistics.median(ttft) * 1e3,
                "added_gap_ms": statistics.median(gap) * 1e3 if gap else float("nan"),
                "rps": {c: statistics.median(v) for c, v in rps.items()},
                "rps_range": {c: (min(v), max(v)) for c, v in rps.items()},
                "cpu_ms": cpu_ms,
                "rss": res["rss"],
                "sent": t.sent,
                "recorded": res["recorded"],
                "errors": errors,
            }
        )
    floor = next(r for r in rows if r["target"] == "floor")
    lines = [
        "# orchard-rec proxy benchmark",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}. Command: `python bench/run.py{' --quick' if args.quick else ''}` ({rounds} interleaved rounds, target order rotated each round; "
        f"fake upstream: bench/fakeupstream.py, 16 stream chunks {args.chunk_delay * 1e3:.0f} ms apart). Direct: p50 {d50 * 1e3:.3f} ms, p99 {d99 * 1e3:.3f} ms, "
        f"throughput c=1/32/256: {drps['c1']:.0f}/{drps['c32']:.0f}/{drps['c256']:.0f} req/s.",
        "",
        "Added latency is over direct at c=1, non-stream (median of rounds; range across rounds in brackets). Stream: added time to first byte and added mean inter-chunk gap. "
        "CPU: the proxy's user+system time per call during the c=32 phase (its process and any child: the writer process). Throughput is requests/s through the proxy (closed loop, the load generator shares the 2 cores).",
        "",
        "| target | added p50 ms | added p99 ms | added TTFT ms | added gap ms | req/s c=1 | c=32 | c=256 | c=32 vs floor | CPU ms/call | RSS MB | recorded / sent | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rec = "-" if r["recorded"] is None else f"{r['recorded']} / {r['sent']}"
        rel = r["rps"]["c32"] / floor["rps"]["c32"] if floor["rps"]["c32"] else float("nan")
        lines.append(
            f"| {r['target']} | {r['added_p50_ms']:.3f} [{r['added_p50_range'][0]:.3f}, {r['added_p50_range'][1]:.3f}] | {r['added_p99_ms']:.3f} | {r['added_ttft_ms']:.3f} | "
            f"{r['added_gap_ms']:.3f} | {r['rps']['c1']:.0f} | {r['rps']['c32']:.0f} [{r['rps_range']['c32'][0]:.0f}, {r['rps_range']['c32'][1]:.0f}] | "
            f"{r['rps']['c256']:.0f} | {rel:.2f}x | {r['cpu_ms']:.3f} | {r['rss']:.0f} | {rec} | {r['errors']} |"
        )
    lines += ["", f"Versions: {_versions()}.", ""] + _verdicts(rows)
    if toolkit:
        lines += [""] + _toolkit_lines(toolkit)
    lines += _other_sections(Path(args.out), lines)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    with open(Path(args.out).with_suffix(".json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4.5))
        for t in targets:
            if t.name == "direct":
                continue
            ys = []
            for c in ("c1", "c32", "c256"):
                d = statistics.median(pct(r["lat"], 50) for r in direct.results[c])
                ys.append(max(1e-3, (statistics.median(pct(r["lat"], 50) for r in t.results[c]) - d) * 1e3))
            ax.plot([1, 32, 256], ys, marker="o", label=t.name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("added p50 latency over direct (ms)")
        ax.set_title("added latency vs concurrency (non-stream)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(Path(args.out).with_name("latency.png"), dpi=110)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)


if __name__ == "__main__":
    main()
