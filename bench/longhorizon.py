"""Long sessions: storage, proxy CPU and added latency by turn, export memory (issue 16).

SWE-like sessions through ``orchard-rec serve --mode token`` (a subprocess) against the
demo upstream (``orchard-rec demo upstream``, another subprocess), driven by the real
openai SDK: a ~2k-token system prompt, 5 tools, answers of 100-300 tokens (tool calls),
tool results of 300-2000 tokens. The demo model calls a tool for each ``run `CMD```
it reads in a user message, so each turn's command (the text of its answer) arrives in a
user message of its own.

Per backend (SQLite, PostgreSQL from ``tests/pg.py``) and session length (50/100/200 turns,
a few sessions at once, stream and not):
- bytes per session (SQLite: file growth after a checkpoint; PostgreSQL: relation sizes)
  against the lower bound: final sample bytes (tokens x 9 B: id, logprob, mask) + the final
  conversation's JSON;
- proxy CPU per call by turn (``/proc`` of the proxy process, one session alone, each call
  recorded before the next) and added latency (the same body straight to the upstream,
  versus through the proxy);
- export time and peak RSS (``orchard-rec export --format jsonl`` of one session, a child
  process's ``ru_maxrss``).

    python bench/longhorizon.py [--turns 50,100,200] [--concurrency 3] [--backends sqlite,postgres]
        [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CLI = [
    sys.executable,
    "-c",
    "import sys; from orchard_rec.cli import app; sys.argv[0] = 'orchard-rec'; app()",
]
WORDS = (
    "the build fails in module parser because token stream offset overflow when reading nested "
    "config files under src lib utils tests fixtures patch diff hunk line column error warning "
    "traceback assert expected actual value return none self args kwargs import from class def"
).split()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name}: " + " ".join(WORDS[:30]),
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string", "description": "what to run"}},
                "required": ["cmd"],
            },
        },
    }
    for name in ("exec_command", "read_file", "write_file", "search", "submit")
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _wait(url: str, timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _cpu(pid: int) -> float:
    """CPU time of a process (all its threads, nanosecond schedstat), seconds."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
    return total / 1e9


class Session:
    """One SWE-like conversation: grows by a user command, the tool call answering it, its result."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        # ~4.4 tokens per word with the demo tokenizer: ~2k tokens of system prompt
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": _words(random.Random(0), 450)}]

    def add_command(self) -> None:
        n = self.rng.randint(15, 50)  # the answer repeats it: 100-300 tokens with the call's markup
        self.messages.append({"role": "user", "content": f"run `{_words(self.rng, n)}`"})

    def add_result(self, call: Any) -> None:
        # tool results: 300-2000 tokens, most of them short (a mean of ~500)
        n = int(min(450, 70 + self.rng.expovariate(1 / 50)))
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": _words(self.rng, n)})


def _turn(client: openai.OpenAI, s: Session, stream: bool) -> Any:
    s.add_command()
    if stream:
        chunks = client.chat.completions.create(model="m", messages=s.messages, tools=TOOLS, stream=True)  # type: ignore[call-overload]
        calls: dict[int, dict[str, Any]] = {}
        for ch in chunks:
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                c["id"] = tc.id or c["id"]
                if tc.function:
                    c["name"] += tc.function.name or ""
                    c["arguments"] += tc.function.arguments or ""
        c = calls[0]
        msg = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
            ],
        }
        call_id = c["id"]
    else:
        r = client.chat.completions.create(model="m", messages=s.messages, tools=TOOLS)  # type: ignore[call-overload]
        m = r.choices[0].message
        msg = {
            "role": "assistant",
            "content": m.content,
            "tool_calls": [t.model_dump() for t in m.tool_calls or []],
        }
        call_id = m.tool_calls[0].id if m.tool_calls else "x"
    s.messages.append(msg)
    s.add_result(type("C", (), {"id": call_id})())
    return msg


class Stack:
    """Demo upstream + proxy subprocesses on one database."""

    def __init__(self, db: str, tmp: Path) -> None:
        self.db = db
        self.up_port, self.port = _free_port(), _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.up = subprocess.Popen(
            [*CLI, "demo", "upstream", "--port", str(self.up_port)], env=env, stderr=subprocess.DEVNULL
        )
        _wait(f"http://127.0.0.1:{self.up_port}/v1/models")
        self.proxy = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--mode",
                "token",
                "--upstream",
                f"http://127.0.0.1:{self.up_port}/v1",
                "--db",
                db,
                "--port",
                str(self.port),
                "--spool",
                str(tmp / f"spool-{self.port}"),
                "--read-timeout",
                "600",
            ],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        _wait(f"http://127.0.0.1:{self.port}/healthz")

    def client(self, sid: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/s/{sid}/v1", api_key="x", timeout=600, max_retries=0
        )

    def stop(self) -> None:
        for p in (self.proxy, self.up):
            if p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def _db_bytes(db: str) -> int:
    from sqlalchemy import create_engine, text

    eng = create_engine(db)
    try:
        with eng.connect() as c:
            if db.startswith("sqlite"):
                c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                return int(Path(db.removeprefix("sqlite:///")).stat().st_size)
            return int(
                c.execute(
                    text(
                        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                        "WHERE c.relname IN ('calls', 'blobs', 'sessions') AND c.relkind = 'r'"
                    )
                ).scalar_one()
            )
    finally:
        eng.dispose()


def _recorded(db: str, sids: list[str], n: int, timeout: float = 120) -> None:
    """Wait until the writer has stored every call of these sessions."""
    from orchard_rec.storage import Store

    store = Store(db)
    try:
        end = time.time() + timeout
        while time.time() < end:
            counts = [(store.session(s) or type("S", (), {"call_count": 0})).call_count for s in sids]
            if all(c >= n for c in counts):
                return
            time.sleep(0.2)
        raise RuntimeError(f"calls not recorded in {timeout}s: {counts}")
    finally:
        store.close()


def _final(db: str, sid: str) -> tuple[int, int]:
    """Final context tokens (last prompt + completion) of a session, and its call count."""
    from orchard_rec.storage import Store

    store = Store(db)
    try:
        calls = [c for c in store.calls(sid) if c.prompt_ids is not None]
        last = calls[-1]
        return len(last.prompt_ids or ()) + len(last.completion_ids or ()), len(calls)
    finally:
        store.close()


def _export(db: str, sid: str, tmp: Path) -> tuple[float, float]:
    """(seconds, peak RSS MB) of ``orchard-rec export --format jsonl`` of one session, in a child process."""
    out = tmp / f"{sid}.jsonl"
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [*CLI, "export", "--format", "jsonl", "--session", sid, "--out", str(out), "--db", db],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"export of {sid} failed ({p.returncode})")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def storage_run(stack: Stack, turns: int, conc: int, tag: str) -> dict[str, Any]:
    before = _db_bytes(stack.db)
    sessions = [Session(1000 * turns + k) for k in range(conc)]
    sids = [f"{tag}-{turns}-{k}" for k in range(conc)]
    errors: list[BaseException] = []

    def drive(k: int) -> None:
        try:
            client = stack.client(sids[k])
            for _ in range(turns):
                _turn(client, sessions[k], stream=k % 2 == 1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=drive, args=(k,)) for k in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    wall = time.perf_counter() - t0
    _recorded(stack.db, sids, turns)
    per_session = (_db_bytes(stack.db) - before) / conc
    tokens, ncalls = _final(stack.db, sids[0])
    convo = len(json.dumps({"messages": sessions[0].messages, "tools": TOOLS}, ensure_ascii=False).encode())
    bound = tokens * 9 + convo
    return {
        "turns": turns,
        "sessions": conc,
        "calls": ncalls,
        "final_tokens": tokens,
        "bytes_per_session": per_session,
        "lower_bound": bound,
        "ratio": per_session / bound,
        "wall_s": wall,
        "sids": sids,
    }


def cpu_run(stack: Stack, turns: int, tag: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One session alone, non-stream: proxy CPU per call (each call recorded before the next),
    bytes of the session; then added latency on its first and its last context."""
    sid = f"{tag}-cpu-{turns}"
    client = stack.client(sid)
    s = Session(7)
    before = _db_bytes(stack.db)
    rows = []
    first: list[dict[str, Any]] = []
    for k in range(1, turns + 1):
        time.sleep(0.05)  # the previous call is recorded
        c0 = _cpu(stack.proxy.pid)
        t0 = time.perf_counter()
        _turn(client, s, stream=False)
        lat = time.perf_counter() - t0
        time.sleep(0.05)
        rows.append({"turn": k, "cpu_ms": (_cpu(stack.proxy.pid) - c0) * 1000, "latency_ms": lat * 1000})
        if k == 1:
            first = list(s.messages[:-2])
    _recorded(stack.db, [sid], turns)
    tokens, ncalls = _final(stack.db, sid)
    convo = len(json.dumps({"messages": s.messages, "tools": TOOLS}, ensure_ascii=False).encode())
    run = {
        "turns": turns,
        "sessions": 1,
        "calls": ncalls,
        "final_tokens": tokens,
        "bytes_per_session": _db_bytes(stack.db) - before,
        "lower_bound": tokens * 9 + convo,
        "sids": [sid],
    }
    run["ratio"] = run["bytes_per_session"] / run["lower_bound"]
    # added latency: the same request (as the proxy sends it) straight to the upstream and through
    # the proxy, alternately, three times each, the best of each (raw HTTP: no client-side parsing)
    for label, msgs in (("first", first), ("last", s.messages[:-2])):
        body: dict[str, Any] = {"model": "m", "messages": msgs, "tools": TOOLS}
        plain = json.dumps(body).encode()
        injected = json.dumps({**body, "return_token_ids": True, "logprobs": True}).encode()
        d = p = float("inf")
        for _ in range(3):
            t1 = time.perf_counter()
            _post(f"http://127.0.0.1:{stack.up_port}/v1/chat/completions", injected)
            d = min(d, time.perf_counter() - t1)
            t2 = time.perf_counter()
            got = _post(f"http://127.0.0.1:{stack.port}/s/{sid}-probe/v1/chat/completions", plain)
            p = min(p, time.perf_counter() - t2)
        run[f"added_ms_{label}"] = (p - d) * 1000
        run[f"probe_tokens_{label}"] = json.loads(got)["usage"]["prompt_tokens"]
    return rows, run


def _post(url: str, data: bytes) -> bytes:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return bytes(r.read())


def _bucket(rows: list[dict[str, Any]], lo: int, hi: int, key: str) -> float | None:
    vals = [r[key] for r in rows if lo <= r["turn"] <= hi and key in r]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", default="50,100,200")
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument(
        "--single-longest",
        action="store_true",
        help="the longest length: one session alone, with proxy CPU per call (else concurrent, no CPU)",
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--render", nargs="*", default=None, help="only write the report from these --json files")
    a = ap.parse_args()
    if a.render is not None:
        merged: dict[str, Any] = {}
        for f in a.render:
            merged.update(json.loads(Path(f).read_text()))
        _write(report(merged, a), Path(a.out))
        return
    turns = [int(t) for t in a.turns.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="orchard-longhorizon-"))
    results: dict[str, Any] = {}
    for backend in a.backends.split(","):
        cluster = None
        if backend == "sqlite":
            db = f"sqlite:///{tmp / 'lh.db'}"
        else:
            from pg import PgCluster

            cluster = PgCluster().start()
            db = cluster.new_database()
        stack = Stack(db, tmp)
        try:
            runs = []
            cpu: list[dict[str, Any]] = []
            for t in turns:
                if a.single_longest and t == max(turns):
                    cpu, r = cpu_run(stack, t, backend)  # one session alone, CPU per call measured
                else:
                    r = storage_run(stack, t, a.concurrency, backend)
                print(json.dumps({k: v for k, v in r.items() if k != "sids"}), flush=True)
                runs.append(r)
            results[backend] = {"runs": runs, "cpu": cpu}
            stack.stop()  # exports read a finished database, no writer running
            for r in runs:
                r["export_s"], r["export_rss_mb"] = _export(db, r["sids"][0], tmp)
                print(
                    json.dumps(
                        {"turns": r["turns"], "export_s": r["export_s"], "export_rss_mb": r["export_rss_mb"]}
                    )
                )
        finally:
            stack.stop()
            if cluster is not None:
                cluster.stop()
                cluster.cleanup()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    section = report(results, a)
    print(section)
    _write(section, Path(a.out))


def _write(section: str, out: Path) -> None:
    text = out.read_text() if out.exists() else ""
    head = "## Long sessions (bench/longhorizon.py, issue 16)"
    if head in text:
        start = text.index(head)
        nxt = text.find("\n## ", start + len(head))
        text = text[:start] + section + (text[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    out.write_text(text)


def report(results: dict[str, Any], a: argparse.Namespace) -> str:
    lines = [
        "## Long sessions (bench/longhorizon.py, issue 16)",
        "",
        f"`python bench/longhorizon.py --turns {a.turns} --concurrency {a.concurrency}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; 2 shared cores). SWE-like sessions through "
        "`serve --mode token` (subprocess) against the demo upstream (subprocess), real openai SDK, "
        "half the sessions streamed. Lower bound = final sample (tokens x 9 B) + final conversation JSON.",
        "",
        "| backend | turns | final context (tokens) | bytes / session | lower bound | ratio | export s | export peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts: list[str] = []
    extra: list[str] = []
    for backend, res in results.items():
        runs = {r["turns"]: r for r in res["runs"]}
        for t, r in sorted(runs.items()):
            lines.append(
                f"| {backend} | {t} | {r['final_tokens']:,} | {r['bytes_per_session'] / 1e6:.2f} MB | "
                f"{r['lower_bound'] / 1e6:.2f} MB | {r['ratio']:.2f}x | {r['export_s']:.2f} | {r['export_rss_mb']:.0f} MB |"
            )
        if 200 in runs and backend == "sqlite":
            ok = runs[200]["ratio"] <= 2.0
            verdicts.append(
                f"- Storage per 200-turn session <= 2x lower bound (SQLite): {runs[200]['ratio']:.2f}x -> **{'met' if ok else 'not met'}**"
            )
        if 100 in runs and 200 in runs:
            g = runs[200]["bytes_per_session"] / runs[100]["bytes_per_session"]
            verdicts.append(
                f"- Growth 100 -> 200 turns <= 2.2x ({backend}): {g:.2f}x -> **{'met' if g <= 2.2 else 'not met'}**"
            )
        if 50 in runs and 200 in runs:
            g = runs[200]["export_rss_mb"] / runs[50]["export_rss_mb"]
            verdicts.append(
                f"- Export peak RSS 200 vs 50 turns <= 1.3x ({backend}): {runs[200]['export_rss_mb']:.0f} / "
                f"{runs[50]['export_rss_mb']:.0f} MB = {g:.2f}x -> **{'met' if g <= 1.3 else 'not met'}**"
            )
        cpu = res["cpu"]
        if cpu:
            n = len(cpu)
            extra += [
                "",
                f"Proxy CPU per call by turn ({backend}, the {n}-turn session alone, non-stream, medians):",
                "",
                "| turns | proxy CPU ms / call | latency ms / call (incl. upstream) |",
                "|---|---|---|",
            ]
            for lo, hi in ((1, 5), (n // 4 - 4, n // 4), (n // 2 - 4, n // 2), (n - 9, n)):
                c = _bucket(cpu, lo, hi, "cpu_ms") or 0.0
                lat = _bucket(cpu, lo, hi, "latency_ms") or 0.0
                extra.append(f"| {lo}-{hi} | {c:.1f} | {lat:.0f} |")
            early, late = _bucket(cpu, 1, 5, "cpu_ms"), _bucket(cpu, n - 9, n, "cpu_ms")
            if early and late:
                verdicts.append(
                    f"- Proxy CPU per call late <= 2x early ({backend}): {late:.1f} / {early:.1f} ms = "
                    f"{late / early:.1f}x -> **{'met' if late <= 2 * early else 'not met'}**"
                )
            last = runs[max(runs)]
            if "added_ms_last" in last:
                extra += [
                    "",
                    f"Added latency (proxy minus direct, best of 3): {last['added_ms_first']:.1f} ms at "
                    f"{last['probe_tokens_first']:,} tokens, {last['added_ms_last']:.1f} ms at "
                    f"{last['probe_tokens_last']:,} tokens.",
                ]
                added = last["added_ms_last"]
                verdicts.append(
                    f"- Added latency at {last['probe_tokens_last']:,} tokens <= 3 ms: {added:.1f} ms -> "
                    f"**{'met' if added <= 3 else 'not met'}**"
                )
    lines += [*extra, "", "Targets of issue 16 measured here:", "", *verdicts, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
