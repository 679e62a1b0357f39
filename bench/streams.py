"""Thousands of concurrent streams: CPU per relayed chunk and the gap between chunks at the client.

    python bench/streams.py [--streams 200,1000,2000] [--chunks 32] [--delay 0.1] [--rounds 1]

A loopback fake vLLM (``fakeupstream.py``) paces ``--chunks`` SSE chunks ``--delay`` s apart
(plus its first chunk and ``[DONE]``). K streaming chat calls at once go through each target,
interleaved within one run: the bare aiohttp forwarder (``floor.py``), ``orchard-rec serve``
(default mode and durability: token, process), ``serve --workers 2`` (``serve-workers2``), and
the same ``serve`` from ``--baseline TREE`` (another checkout, for a before/after within one run).
The load comes from ``--clients`` separate processes (raw asyncio streams, uvloop when
installed), started together, so the generator is not the proxy's bottleneck.

Per target and K: CPU per relayed chunk (the proxy's CPU time over the run divided by the chunks
the clients received: its process, which for ``--workers`` is the parent and its workers, whose
work it is, and with every child, such as a writer process), the p50/p99 gap between a stream's
chunks at the client, errors (no 200, no ``[DONE]``, a broken connection), and the proxy's RSS at
the end (process tree). A round ends when the proxy is idle again (its writer has recorded the
round's calls), so the CPU of recording them is the round's. ``--out FILE`` appends a Markdown section (RESULTS.md). ``--only`` starts
only the targets named.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from run import _tree, free_port, wait_http  # noqa: E402

BODY = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hello there, benchmark"}]}'


# -- the client (a separate process) ---------------------------------------------------------------


async def _one(port: int, path: str, gaps: list[float], out: dict[str, int]) -> None:
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        w.write(
            b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (path.encode(), len(BODY), BODY)
        )
        last = None
        head = b""
        seen = 0
        tail = b""
        while True:
            data = await r.read(65536)
            if not data:
                break
            now = time.perf_counter()
            if not head:
                head = data[:12]
            n = data.count(b"data:")
            if n:
                seen += n
                if last is not None:
                    gaps.append(now - last)
                last = now
            tail = (tail + data)[-64:]
        w.close()
        if not head.startswith(b"HTTP/1.1 200") or b"[DONE]" not in tail:
            out["errors"] += 1
        out["chunks"] += seen
    except OSError:
        out["errors"] += 1


async def _client(port: int, path: str, k: int, start: float) -> dict:  # type: ignore[type-arg]
    gaps: list[float] = []
    out = {"errors": 0, "chunks": 0}
    await asyncio.sleep(max(0.0, start - time.time()))
    await asyncio.gather(*(_one(port, path, gaps, out) for _ in range(k)))
    return {**out, "gaps": gaps}


def client_main(port: int, path: str, k: int, start: float, out: str) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    res = asyncio.run(_client(port, path, k, start))
    # to a file, not stdout: under uvloop a result past a pipe's 64 KiB reached the driver cut short
    with open(out, "w") as f:
        json.dump(res, f)


# -- the driver ------------------------------------------------------------------------------------


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _own(pid: int, workers: bool) -> list[int]:
    """The proxy's own processes: the one, or the parent of ``--workers`` and its workers."""
    if not workers:
        return [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [pid, *(int(c) for c in f.read().split())]
    except OSError:
        return [pid]


def run_round(port: int, pid: int, k: int, clients: int, workers: bool = False) -> dict:  # type: ignore[type-arg]
    start = time.time() + 1.0
    share = [k // clients + (1 if i < k % clients else 0) for i in range(clients)]
    tree = _tree(pid)
    cpu0 = {p: _cpu(p) for p in tree}
    mine = _own(pid, workers)
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"client{i}.json") for i in range(len(share))]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--client",
                    str(port),
                    "/v1/chat/completions",
                    str(n),
                    str(start),
                    out,
                ]
            )
            for n, out in zip(share, outs, strict=True)
            if n
        ]
        for p in procs:
            p.wait()
        results = []
        for n, out in zip(share, outs, strict=True):
            if n:
                with open(out) as f:
                    results.append(json.load(f))
    _quiet(pid)
    tree = _tree(pid)
    own = sum(_cpu(p) - cpu0.get(p, 0.0) for p in mine)  # a worker restarted meanwhile: from 0
    total = sum(_cpu(p) - cpu0.get(p, 0.0) for p in tree)
    gaps = sorted(g for r in results for g in r["gaps"])
    chunks = sum(r["chunks"] for r in results)
    q = statistics.quantiles(gaps, n=100) if len(gaps) > 1 else [0.0] * 99
    return {
        "chunks": chunks,
        "errors": sum(r["errors"] for r in results),
        "cpu_own_us": own / max(chunks, 1) * 1e6,
        "cpu_tree_us": total / max(chunks, 1) * 1e6,
        "p50_ms": q[49] * 1e3,
        "p99_ms": q[98] * 1e3,
        "rss_mb": sum(_rss_mb(p) for p in tree),
    }


def _quiet(pid: int, timeout: float = 30.0) -> None:
    """Until the proxy's processes are idle: its writer has recorded the round's calls (they end
    together, and a writer process drains them after the clients are done: that CPU is the round's)."""
    deadline = time.monotonic() + timeout
    last = sum(_cpu(p) for p in _tree(pid))
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = sum(_cpu(p) for p in _tree(pid))
        if now - last < 0.02:  # under ~7 % of a core
            return
        last = now


def _serve(
    upstream: str, work: Path, name: str, extra: list[str], tree: str | None = None
) -> tuple[subprocess.Popen, int]:  # type: ignore[type-arg]
    port = free_port()
    cmd = [sys.executable, "-m", "orchard_rec.cli", "serve", "--upstream", upstream, "--port", str(port)]
    cmd += ["--db", f"sqlite:///{work}/{name}.db", "--spool", str(work / f"{name}.spool"), *extra]
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    proc = subprocess.Popen(cmd, cwd=tree or ROOT, stdout=subprocess.DEVNULL, env=env)
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return proc, port


def _start(name: str, upstream: str, work: Path, baseline: str | None) -> tuple[subprocess.Popen, int]:  # type: ignore[type-arg]
    """Target ``name`` started and answering: ``(process, port)``."""
    if name == "forwarder":
        port = free_port()
        fwd = subprocess.Popen(
            [sys.executable, str(HERE / "floor.py"), "--port", str(port), "--upstream", upstream]
        )
        wait_http(f"http://127.0.0.1:{port}/v1/models")
        return fwd, port
    if name == "serve-workers2":
        p, port = _serve(upstream, work, "workers", ["--workers", "2"])
        _all_workers(port, 2)
        return p, port
    if (
        name == "serve-thread"
    ):  # records in a thread of the proxy (the default on 2+ cores: the writer process)
        return _serve(upstream, work, "thread", ["--db-writer", "thread"])
    if name == "serve@baseline":
        assert baseline is not None
        return _serve(upstream, work, "baseline", [], str(Path(baseline).resolve()))
    return _serve(upstream, work, "serve", [])


def _all_workers(port: int, n: int, timeout: float = 60.0) -> None:
    """Until every one of ``n`` workers answers (``/metrics`` asks them all)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("orchard_workers_answered ") and float(line.split()[1]) >= n:
                        return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"serve --workers {n}: not every worker answered in {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="200,1000,2000")
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--delay", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clients", type=int, default=2, help="load-generator processes")
    ap.add_argument(
        "--only", default="", help="comma-separated targets (forwarder,serve,serve-workers2,serve-thread)"
    )
    ap.add_argument("--out", help="append the results as a Markdown section to this file")
    ap.add_argument("--title", default="")
    ap.add_argument("--baseline", help="another source tree: its `serve` too (target serve@baseline)")
    args = ap.parse_args()
    notes: list[str] = []
    procs: list[subprocess.Popen] = []  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            up_port = free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "fakeupstream.py"), "--port", str(up_port)]
                    + ["--chunks", str(args.chunks), "--chunk-delay", str(args.delay)]
                )
            )
            upstream = f"http://127.0.0.1:{up_port}/v1"
            wait_http(upstream + "/models")
            names = ["forwarder", "serve", "serve-workers2", "serve-thread"] + (
                ["serve@baseline"] if args.baseline else []
            )
            wanted = [n for n in names if not args.only or n in args.only.split(",")]
            targets: dict[str, tuple[int, int]] = {}
            for name in wanted:
                p, port = _start(name, upstream, work, args.baseline)
                procs.append(p)
                targets[name] = (port, p.pid)
            notes.append(
                "serve-workers2: CPU of the parent and its 2 workers (each a whole proxy: its own"
                " event loop, recorder and spool); the kernel spreads the connections (SO_REUSEPORT)."
            )
            rows: list[tuple[int, str, dict]] = []  # type: ignore[type-arg]
            for n, (port, pid) in targets.items():  # warm-up: connections, imports, the first session
                run_round(port, pid, 20, 1, n == "serve-workers2")
            for k in [int(x) for x in args.streams.split(",")]:
                per: dict[str, list[dict]] = {n: [] for n in targets}  # type: ignore[type-arg]
                for _ in range(args.rounds):
                    for n, (port, pid) in targets.items():  # interleaved
                        per[n].append(run_round(port, pid, k, args.clients, n == "serve-workers2"))
                        time.sleep(0.5)
                for n, rs in per.items():
                    med = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
                    med["errors"] = sum(r["errors"] for r in rs)
                    rows.append((k, n, med))
                    print(k, n, json.dumps({a: round(b, 1) for a, b in med.items()}), flush=True)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    table = _table(rows, args, notes)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + table)


def _table(rows: list[tuple[int, str, dict]], args: argparse.Namespace, notes: list[str]) -> str:  # type: ignore[type-arg]
    base = {k: r for k, n, r in rows if n == "forwarder"}
    cmd = f"python bench/streams.py --streams {args.streams} --rounds {args.rounds} --clients {args.clients}"
    cmd += f" --baseline {args.baseline}" if args.baseline else ""
    load = os.getloadavg()[0]
    lines = [
        f"## Concurrent streams{' (' + args.title + ')' if args.title else ''} (`{cmd}`, issue 39)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores shared (load "
        f"{load:.1f} at the end), {args.chunks} chunks {args.delay * 1000:.0f} ms apart per stream, "
        f"{args.clients} client processes; medians of {args.rounds} interleaved round(s).",
        "",
        "| streams | target | CPU/chunk (process) | CPU/chunk (with children) | x forwarder (with children) "
        "| p50 gap | p99 gap | p99 x forwarder | errors | chunks | RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, n, r in rows:
        b = base.get(k)
        # the proxy's whole CPU: its writer process (the default's child) counted
        ratio = f"{r['cpu_tree_us'] / b['cpu_tree_us']:.2f}" if b and b["cpu_tree_us"] else "-"
        pr = f"{r['p99_ms'] / b['p99_ms']:.2f}" if b and b["p99_ms"] else "-"
        lines.append(
            f"| {k} | {n} | {r['cpu_own_us']:.0f} µs | {r['cpu_tree_us']:.0f} µs | {ratio} "
            f"| {r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | {pr} | {r['errors']:.0f} | {r['chunks']:.0f} "
            f"| {r['rss_mb']:.0f} MB |"
        )
    lines += [""] + [f"- {x}" for x in notes]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
    else:
        main()
