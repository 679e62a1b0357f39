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
import math
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


def _writer_ready(port: int, timeout: float = 60) -> str:
    """Until the proxy's database writer process takes batches (``/healthz`` ``db_writer`` is not
    ``starting``): what is measured is then the steady state, not its start-up. Its state."""
    end = time.time() + timeout
    while time.time() < end:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            state = str(json.loads(r.read()).get("db_writer", "thread"))
        if state != "starting":
            return state
        time.sleep(0.05)
    raise RuntimeError("the proxy's writer process did not start")


def _children(pid: int) -> list[int]:
    """The process's child processes (the proxy's database writer process, under wal)."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return out


def _cpu(pid: int) -> float:
    """CPU time of a process and its children (all their threads, nanosecond schedstat), seconds."""
    total = 0
    for p in (pid, *_children(pid)):
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
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
        self.writer = _writer_ready(self.port)

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


_PEAK = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _export(db: str, sid: str, tmp: Path) -> tuple[float, float]:
    """(seconds, peak RSS MB) of ``orchard-rec export --format jsonl`` of one session, in a child process.

    The export is started by a small wrapper process, whose ``RUSAGE_CHILDREN`` peak is the export's:
    a child forked straight from this (large) script would report this script's RSS instead (Linux
    keeps the pre-exec address space's high-water mark in ``ru_maxrss``), which is what made the
    first runs read 401 MB for every export."""
    out = tmp / f"{sid}.jsonl"
    t0 = time.perf_counter()
    got = subprocess.run(
        [
            sys.executable,
            "-c",
            _PEAK,
            *CLI,
            "export",
            "--format",
            "jsonl",
            "--session",
            sid,
            "--out",
            str(out),
            "--db",
            db,
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    rc, kb = got.stdout.split()
    if rc != "0":
        raise RuntimeError(f"export of {sid} failed ({rc})")
    return time.perf_counter() - t0, int(kb) / 1024


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


# -- the proxy's own cost: a fast vLLM-like upstream -------------------------------------------

TOKENS_PER_BYTE = 1 / 1.83
"""The fake's prompt length for a request: about what the demo tokenizer gives for these bodies."""


def fake_upstream(port: int) -> None:
    """A vLLM-shaped chat server that answers at once (``--fake-upstream PORT``): the prompt's ids are
    the first ``len(body) / 1.83`` of a fixed pseudo-random sequence (so a session's growing prompts
    share their prefix, as a real server's do), the completion 200 tokens with logprobs and ids.
    No orchard-rec code: it writes vLLM's wire format itself."""
    import asyncio

    import orjson
    from aiohttp import web

    rng = random.Random(1)
    cap = 600_000
    seq = [rng.randrange(1000, 150_000) for _ in range(cap)]
    text = ",".join(map(str, seq)).encode()
    ends = [0]  # ends[k]: bytes of the first k ids joined by commas
    pos = -1
    for x in seq:
        pos += len(str(x)) + 1
        ends.append(pos)
    comp = list(range(300, 500))
    lps = {"content": [{"token": "ab", "logprob": -0.5, "bytes": [97, 98], "top_logprobs": []} for _ in comp]}
    words = " ".join("ab" for _ in comp)

    def prompt(body: bytes) -> tuple[bytes, int]:
        n = max(1, min(cap, int(len(body) * TOKENS_PER_BYTE)))
        return b"[" + text[: ends[n]] + b"]", n

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        ids, n = prompt(body)
        usage = {"prompt_tokens": n, "completion_tokens": len(comp), "total_tokens": n + len(comp)}
        base = {"id": "chatcmpl-fake", "created": 1, "model": "m"}
        if b'"stream":true' not in body and b'"stream": true' not in body:
            obj = {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": words, "tool_calls": []},
                        "logprobs": lps,
                        "finish_reason": "stop",
                        "stop_reason": None,
                        "token_ids": comp,
                    }
                ],
                "usage": usage,
                "prompt_logprobs": None,
            }
            head = orjson.dumps(obj)[:-1]
            return web.Response(
                body=head + b',"prompt_token_ids":' + ids + b',"kv_transfer_params":null}',
                content_type="application/json",
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}
        first = orjson.dumps(
            {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        )[:-1]
        out = [b"data: " + first + b',"prompt_token_ids":' + ids + b"}\n\n"]
        for k in range(0, len(comp), 20):
            c = {
                "index": 0,
                "delta": {"content": "ab " * 20},
                "logprobs": {"content": lps["content"][k : k + 20]},
            }
            c["token_ids"] = comp[k : k + 20]
            if k + 20 >= len(comp):
                c["finish_reason"] = "stop"
            out.append(b"data: " + orjson.dumps({**chunk, "choices": [c]}) + b"\n\n")
        out.append(b"data: " + orjson.dumps({**chunk, "choices": [], "usage": usage}) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        await resp.write(b"".join(out))
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    tito = json.loads(os.environ.get("LH_TITO_ANSWER", "null")) or {"ids": comp, "text": words}

    async def completions(request: web.Request) -> web.Response:
        """vLLM's ``/v1/completions`` with a token-id prompt and ``return_token_ids`` (tito's call):
        the prompt's ids echoed, the answer the driver asked for (``LH_TITO_ANSWER``)."""
        body = await request.read()
        at = body.index(b'"prompt":') + len(b'"prompt":')
        ids = body[at : body.index(b"]", at) + 1]
        n = ids.count(b",") + 1
        out, k = tito["ids"], len(tito["ids"])
        choice = {
            "index": 0,
            "text": tito["text"],
            "token_ids": out,
            "logprobs": {
                "token_logprobs": [-0.5] * k,
                "tokens": ["x"] * k,
                "top_logprobs": None,
                "text_offset": [0] * k,
            },
            "finish_reason": "stop",
            "stop_reason": None,
        }
        head = orjson.dumps(
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [choice],
                "usage": {"prompt_tokens": n, "completion_tokens": k, "total_tokens": n + k},
            }
        )
        # vLLM puts the prompt's ids in the choice (return_token_ids): the echo is what it costs
        cut = head.index(b'"finish_reason"')
        return web.Response(
            body=head[:cut] + b'"prompt_token_ids":' + ids + b"," + head[cut:],
            content_type="application/json",
        )

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)

    async def run() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(run())


def _bodies(turns: int, seed: int = 7) -> list[bytes]:
    """Request bodies of one SWE-like session, turn 1..turns (the answers written here: a tool call
    repeating the command, as the demo model does)."""
    g = _Grower(seed)
    return [g.next() for _ in range(turns)]


class _Grower:
    """``_bodies`` one turn at a time (the whole list of 64 sessions' bodies would be gigabytes)."""

    def __init__(self, seed: int) -> None:
        self.s = Session(seed)
        self.head = b'{"model":"m","tools":' + json.dumps(TOOLS).encode() + b',"messages":['
        self.done: list[bytes] = [json.dumps(self.s.messages[0]).encode()]
        self.k = 0

    def next(self) -> bytes:
        s, k = self.s, self.k
        s.add_command()
        self.done.append(json.dumps(s.messages[-1]).encode())
        body = self.head + b",".join(self.done) + b"]}"
        cmd = s.messages[-1]["content"][5:-1]
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "exec_command", "arguments": json.dumps({"cmd": cmd})},
        }
        s.messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        self.done.append(json.dumps(s.messages[-1]).encode())
        s.add_result(type("C", (), {"id": f"call_{k}"})())
        self.done.append(json.dumps(s.messages[-1]).encode())
        self.k += 1
        return body


CACHE_VARS = (
    "ORCHARD_IDS_CACHE_MB",
    "ORCHARD_STATE_CACHE_MB",
    "ORCHARD_REQUEST_CACHE_MB",
    "ORCHARD_SPOOL_BASES_MB",
)
"""The per-session caches' bounds (``--interleave-cache-mb`` sets them all)."""


def interleave_run(
    tmp: Path, durability: str, sessions: int, turns: int, cache_mb: float | None = None
) -> dict[str, Any]:
    """``sessions`` sessions advancing in turn, a call each per round (what a proxy sees from many
    rollouts at once), each round recorded before the next: the proxy's CPU per call by turn, when
    the sessions outnumber what its per-session caches hold (ids, request, storage state).
    ``cache_mb``: every per-session cache bounded to this (``CACHE_VARS``): the sessions then
    outnumber what they hold, as thousands of sessions would at their defaults. The caches'
    hits and misses at the end come from ``/healthz``."""
    env = {v: str(cache_mb) for v in CACHE_VARS} if cache_mb is not None else {}
    name = f"interleave-{durability}" + ("" if cache_mb is None else f"-{cache_mb:g}mb")
    st = FastStack(tmp, durability, name=name, env_extra=env)
    growers = [_Grower(100 + i) for i in range(sessions)]
    rows = []
    h = Http(st.port)
    written = st.written()
    try:
        for k in range(1, turns + 1):
            bodies = [g.next() for g in growers]
            m0, o0 = _threads_cpu(st.proxy.pid)
            t0 = time.perf_counter()
            for i, body in enumerate(bodies):
                h.post(f"/s/il-{i}/v1/chat/completions", body)
            lat = (time.perf_counter() - t0) / sessions
            written += sessions
            st.settle(written)
            m1, o1 = _threads_cpu(st.proxy.pid)
            rows.append(
                {
                    "turn": k,
                    "tokens": int(len(bodies[0]) * TOKENS_PER_BYTE),
                    "cpu_ms": (m1 - m0 + o1 - o0) * 1e3 / sessions,
                    "loop_ms": (m1 - m0) * 1e3 / sessions,
                    "other_ms": (o1 - o0) * 1e3 / sessions,
                    "latency_ms": lat * 1e3,
                }
            )
        rss = _rss_mb(st.proxy.pid)
        caches = json.loads(h.get("/healthz")).get("caches") or {}
    finally:
        st.stop()
    return {
        "durability": durability,
        "sessions": sessions,
        "rows": rows,
        "rss_mb": rss,
        "load": _load(),
        "cache_mb": cache_mb,
        "caches": caches,
    }


def tito_run(tmp: Path, turns: int, durability: str = "wal") -> dict[str, Any]:
    """One SWE-like session through ``serve --mode tito`` (the proxy renders each prompt with the
    demo tokenizer's chat template, reuses the branch's exact ids and sends ids to the fake's vLLM
    token endpoint, which answers at once with a tool call); the answer and a tool result go back
    in the next request, as a harness sends them. Proxy CPU per call by turn, each call recorded
    before the next."""
    import sqlite3
    from types import SimpleNamespace

    from orchard_rec.tokenizer import load_tokenizer

    tok = load_tokenizer("demo")
    text = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls -la src"}}\n</tool_call>'
    ids = [*tok.encode(text, add_special_tokens=False).ids, tok.token_to_id("<|im_end|>")]
    answer = {"LH_TITO_ANSWER": json.dumps({"ids": ids, "text": text})}
    st = FastStack(tmp, durability, name="tito", mode="tito", env_extra=answer)
    s = Session(11)
    h = Http(st.port)
    rows = []
    written = st.written()
    try:
        for k in range(1, turns + 1):
            s.add_command()
            body = json.dumps({"model": "m", "tools": TOOLS, "messages": s.messages}).encode()
            m0, o0 = _threads_cpu(st.proxy.pid)
            t0 = time.perf_counter()
            got = json.loads(h.post("/s/tito-1/v1/chat/completions", body))
            lat = time.perf_counter() - t0
            written += 1
            st.settle(written)
            m1, o1 = _threads_cpu(st.proxy.pid)
            msg = got["choices"][0]["message"]
            s.messages.append(
                {"role": "assistant", "content": msg.get("content"), "tool_calls": msg["tool_calls"]}
            )
            s.add_result(SimpleNamespace(id=msg["tool_calls"][0]["id"]))
            rows.append(
                {
                    "turn": k,
                    "tokens": got["usage"]["prompt_tokens"],
                    "cpu_ms": (m1 - m0 + o1 - o0) * 1e3,
                    "loop_ms": (m1 - m0) * 1e3,
                    "other_ms": (o1 - o0) * 1e3,
                    "latency_ms": lat * 1e3,
                }
            )
        con = sqlite3.connect(st.db.removeprefix("sqlite:///"))
        try:
            meta = [json.loads(m)["tito"] for (m,) in con.execute("SELECT metadata FROM calls ORDER BY seq")]
        finally:
            con.close()
    finally:
        st.stop()
    return {
        "durability": durability,
        "rows": rows,
        "fresh": sum(1 for m in meta if m.get("fresh")),
        "calls": len(meta),
        "load": _load(),
    }


def _by_turn(rows: list[dict[str, Any]], head: str, other: str, what: str, verdicts: list[str]) -> list[str]:
    """A per-turn CPU table (early, a quarter, half, the last ten turns) under ``head``, and the
    late/early verdict for ``what``."""
    n = len(rows)
    out = [
        "",
        head,
        "",
        f"| turns | context (tokens) | proxy CPU ms / call | event loop (main thread) | {other} | latency ms |",
        "|---|---|---|---|---|---|",
    ]
    for lo, hi in ((1, 5), (n // 4 - 4, n // 4), (n // 2 - 4, n // 2), (n - 9, n)):
        sel = [x for x in rows if lo <= x["turn"] <= hi]
        if not sel:
            continue
        vals = [_bucket(rows, lo, hi, k) or 0.0 for k in ("cpu_ms", "loop_ms", "other_ms", "latency_ms")]
        out.append(
            f"| {lo}-{hi} | ~{sel[-1]['tokens']:,} | {vals[0]:.2f} | {vals[1]:.2f} | {vals[2]:.2f} | {vals[3]:.1f} |"
        )
    early, late = _bucket(rows, 1, 5, "cpu_ms"), _bucket(rows, n - 9, n, "cpu_ms")
    if early and late:
        verdicts.append(
            f"- Proxy CPU per call late <= 2x early, {what}: {late:.2f} / {early:.2f} ms ="
            f" {late / early:.1f}x -> **{'met' if late <= 2 * early else 'not met'}**"
        )
    return out


def _tito_report(r: dict[str, Any], verdicts: list[str]) -> list[str]:
    d = r["durability"]
    head = (
        f"Tito (`serve --mode tito --tokenizer demo {_flags(d)}`, fake vLLM token endpoint answering at once,"
        f" SQLite): one session of {len(r['rows'])} turns, the answer and a tool result sent back each turn, each"
        f" call recorded before the next; {r['calls'] - r['fresh']} of {r['calls']} calls continued the"
        f" session's branch ({r['load']}):"
    )
    return _by_turn(r["rows"], head, "other threads", f"tito ({d})", verdicts)


def _interleave_report(r: dict[str, Any], verdicts: list[str]) -> list[str]:
    d = r["durability"]
    head = (
        f"{r['sessions']} sessions interleaved (fast upstream, `{_flags(d)}`, SQLite): a call of each"
        f" session per round, each round recorded before the next, so from one call to the next of a session"
        f" {r['sessions'] - 1} other sessions' calls went through the proxy's per-session caches"
        f" ({r['load']}; proxy RSS at the end {r['rss_mb']:.0f} MB):"
    )
    what = f"{r['sessions']} sessions interleaved ({d})"
    if r.get("cache_mb") is not None:
        head = head[:-1] + (
            f", every per-session cache bounded to {r['cache_mb']:g} MB (`{'`, `'.join(CACHE_VARS)}`):"
            " the sessions outnumber what the caches hold, as thousands of long sessions would at the defaults:"
        )
        what += f", caches {r['cache_mb']:g} MB"
    out = _by_turn(r["rows"], head, "other threads (writer)", what, verdicts)
    if r.get("caches"):
        parts = [
            f"{name} {c['hits']} hits / {c['misses']} misses ({c['entries']} held, {c['bytes'] / 1e6:.1f}"
            f" of {c['max_bytes'] / 1e6:.0f} MB)"
            for name, c in r["caches"].items()
            if c.get("hits") or c.get("misses")
        ]
        out += ["", "Caches at the end (`/healthz`): " + "; ".join(parts) + "."]
    return out


class HttpError(RuntimeError):
    def __init__(self, status: int, msg: str) -> None:
        super().__init__(msg)
        self.status = status


class Http:
    """One keep-alive connection (http.client: little client CPU on the shared cores)."""

    def __init__(self, port: int) -> None:
        import http.client

        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def post(self, path: str, body: bytes) -> bytes:
        self.c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = self.c.getresponse()
        data = r.read()
        if r.status != 200:
            raise HttpError(r.status, f"{path}: {r.status} {data[:300]!r}")
        return data

    def get(self, path: str) -> bytes:
        self.c.request("GET", path)
        return self.c.getresponse().read()


def _threads_cpu(pid: int) -> tuple[float, float]:
    """(main thread, other threads and child processes) CPU seconds of a process: the event loop
    runs in the main thread; under wal the records are built and written in a child process."""
    main = rest = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            v = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue
        if task.name == str(pid):
            main += v
        else:
            rest += v
    return main / 1e9, rest / 1e9 + sum(_cpu(c) for c in _children(pid))


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its children."""
    total = 0.0
    for p in (pid, *_children(pid)):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


def _load() -> str:
    return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _flags(d: str) -> str:
    """A ``--fast`` mode as ``serve``'s flags: ``wal``, ``async``, ``wal+process`` (the writer process)."""
    durability, _, writer = d.partition("+")
    return f"--durability {durability}" + (f" --db-writer {writer}" if writer else "")


class FastStack:
    """The fake upstream and a proxy (``--durability``, and ``--db-writer`` after a ``+``) on a
    fresh SQLite database."""

    def __init__(
        self,
        tmp: Path,
        durability: str,
        name: str | None = None,
        mode: str = "token",
        env_extra: dict[str, str] | None = None,
    ) -> None:
        name = name or durability  # of the database and spool files
        durability, _, writer = durability.partition("+")
        self.up_port, self.port = _free_port(), _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
        if writer:
            env["ORCHARD_DB_WRITER"] = writer
        self.up = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--fake-upstream", str(self.up_port)], env=env
        )
        _wait(f"http://127.0.0.1:{self.up_port}/v1/models")
        self.db = f"sqlite:///{tmp / f'fast-{name}.db'}"
        self.proxy = subprocess.Popen(
            [
                *CLI,
                "serve",
                "--mode",
                mode,
                *(["--tokenizer", "demo"] if mode == "tito" else []),
                "--durability",
                durability,
                "--upstream",
                f"http://127.0.0.1:{self.up_port}/v1",
                "--db",
                self.db,
                "--port",
                str(self.port),
                "--spool",
                str(tmp / f"spool-fast-{name}"),
            ],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        _wait(f"http://127.0.0.1:{self.port}/healthz")
        self.writer = _writer_ready(self.port)
        self.idle_port = _free_port()
        self.idle = subprocess.Popen([sys.executable, "-c", _IDLE_SERVER, str(self.idle_port)])
        _wait(f"http://127.0.0.1:{self.idle_port}/healthz")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=30) as r:
            return dict(json.loads(r.read()))

    def settle(self, written: int, timeout: float = 120) -> None:
        """Until the database holds ``written`` calls (read from the file: no proxy CPU spent)."""
        import sqlite3

        end = time.time() + timeout
        con = sqlite3.connect(self.db.removeprefix("sqlite:///"), timeout=30)
        try:
            while time.time() < end:
                if con.execute("SELECT count(*) FROM calls").fetchone()[0] >= written:
                    return
                time.sleep(0.005)
        finally:
            con.close()
        raise RuntimeError("the proxy did not record in time")

    def written(self) -> int:
        import sqlite3

        con = sqlite3.connect(self.db.removeprefix("sqlite:///"), timeout=30)
        try:
            return int(con.execute("SELECT count(*) FROM calls").fetchone()[0])
        finally:
            con.close()

    def stop(self) -> None:
        for p in (self.proxy, self.up, self.idle):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()


def fast_run(
    tmp: Path, durability: str, turns: int, conc: int, seconds: float, rates: tuple[float, ...] = (8.0,)
) -> dict[str, Any]:
    """Proxy CPU by turn, added latency, writer throughput and /healthz under 150k-token calls."""
    bodies = _bodies(turns + 60)
    st = FastStack(tmp, durability)
    res: dict[str, Any] = {"durability": durability, "writer": st.writer, "load_start": _load()}
    try:
        # 1. one session alone: proxy CPU per call by turn (each call recorded before the next)
        h = Http(st.port)
        rows = []
        written = st.written()
        for k in range(1, turns + 1):
            m0, o0 = _threads_cpu(st.proxy.pid)
            t0 = time.perf_counter()
            h.post("/s/cpu/v1/chat/completions", bodies[k - 1])
            lat = time.perf_counter() - t0
            written += 1
            st.settle(written)
            m1, o1 = _threads_cpu(st.proxy.pid)
            rows.append(
                {
                    "turn": k,
                    "cpu_ms": (m1 - m0 + o1 - o0) * 1e3,
                    "loop_ms": (m1 - m0) * 1e3,
                    "other_ms": (o1 - o0) * 1e3,
                    "latency_ms": lat * 1e3,
                }
            )
        res["cpu"] = rows
        res["tokens_first"] = int(len(bodies[0]) * TOKENS_PER_BYTE)
        res["tokens_last"] = int(len(bodies[turns - 1]) * TOKENS_PER_BYTE)
        # 2. added latency: the injected body straight to the fake, the plain one through the proxy
        # (the session's next call: the same prompt again), alternately, best of 7
        direct = Http(st.up_port)
        for label, body in (("first", bodies[0]), ("last", bodies[turns - 1])):
            injected = body[:-1] + b',"return_token_ids":true,"logprobs":true}'
            d = p = float("inf")
            for _ in range(7):
                t1 = time.perf_counter()
                direct.post("/v1/chat/completions", injected)
                d = min(d, time.perf_counter() - t1)
                t2 = time.perf_counter()
                h.post("/s/cpu/v1/chat/completions", body)
                p = min(p, time.perf_counter() - t2)
                time.sleep(0.05)
            res[f"added_ms_{label}"] = (p - d) * 1e3
            res[f"direct_ms_{label}"] = d * 1e3
        res["load_cpu"] = _load()
        # 3. back-to-back 150k-token calls from `conc` clients, each driving warm sessions in turn (a
        # turn per call, from ~138k tokens on); /healthz polled meanwhile (and before, idle). Every
        # session's first call (a session first seen at ~138k tokens is recorded whole, once) is made
        # and recorded before the window, and each client has sessions enough to outlast the window
        time.sleep(1.0)
        idle = _poll_health(st.port, 3.0)
        base = max(1, turns - 20)
        # sessions per client (enough for ~300 calls/s through the window), calls per session (~138k ->
        # ~170k tokens)
        per_client, span = max(12, int(4 * seconds)), 40
        names = [[f"load-{i}-{j}" for j in range(per_client)] for i in range(conc)]
        w = st.written()
        for i in range(conc):
            for j, sid in enumerate(names[i]):
                h.post(f"/s/{sid}/v1/chat/completions", bodies[base + (i * per_client + j) % 8])
        st.settle(w + conc * per_client)
        stop = threading.Event()
        done = [0] * conc
        rejected = [0] * conc
        finished = [0.0] * conc

        def drive(i: int) -> None:
            c = Http(st.port)
            for j, sid in enumerate(names[i]):
                k = base + (i * per_client + j) % 8 + 1
                end = min(len(bodies), k + span)
                while not stop.is_set() and k < end:
                    try:
                        c.post(f"/s/{sid}/v1/chat/completions", bodies[k])
                    except HttpError as exc:
                        if exc.status != 429:
                            raise
                        rejected[i] += 1  # back-pressure: the queue is at its bound
                        time.sleep(0.05)
                        continue
                    done[i] += 1
                    k += 1
            finished[i] = time.perf_counter()

        series: list[dict[str, float]] = []
        w0 = st.written()
        t_start = time.perf_counter()

        def watch() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                j = st.health()
                series.append(
                    {
                        "t": t - t_start,
                        "depth": j["queue_depth"],
                        "bytes": j["queued_bytes"],
                        "written": j["written"],
                        "rss": _rss_mb(st.proxy.pid),
                        "accepted": sum(done),
                        "paced": j.get("paced", 0),
                    }
                )
                stop.wait(0.5)

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(conc)]
        wt = threading.Thread(target=watch)
        wt.start()
        for t in threads:
            t.start()
        c0 = _threads_cpu(st.proxy.pid)
        time.sleep(min(1.0, seconds / 4))  # the calls are flowing
        # /healthz of the proxy, and meanwhile of a do-nothing aiohttp server (a process of its own):
        # what the saturated box alone does to a request's latency
        floor: list[float] = []
        fl = threading.Thread(
            target=lambda: floor.extend(_poll_health(st.idle_port, seconds - min(1.0, seconds / 4)))
        )
        fl.start()
        health_lat = _poll_health(st.port, seconds - min(1.0, seconds / 4))
        fl.join()
        accepted = sum(done)  # the window ends here, while every client still has calls to make
        w_end_window = st.written() - w0
        window = time.perf_counter() - t_start
        c1 = _threads_cpu(st.proxy.pid)
        ran_out = sum(1 for f in finished if f)
        stop.set()
        for t in threads:
            t.join()
        wt.join()
        total = sum(done)
        t_drain = time.perf_counter()
        st.settle(w0 + total, timeout=600)
        drain = time.perf_counter() - t_drain
        h_end = st.health()
        in_window = [x for x in series if x["t"] <= window]
        per_call = max((x["bytes"] / x["depth"] for x in in_window if x["depth"]), default=0)
        res.update(
            {
                "load_tp": _load(),
                "tp_calls": accepted,
                "tp_sessions": conc,
                "tp_session_count": conc * per_client,
                "tp_ran_out": ran_out,
                "tp_rejected": sum(rejected),
                "tp_window_s": window,
                "accepted_per_s": accepted / window,
                "recorded_per_s": w_end_window / window,
                "drain_s": drain,
                "tp_tokens": int(len(bodies[base]) * TOKENS_PER_BYTE),
                "tp_cpu_ms_per_call": ((c1[0] - c0[0]) + (c1[1] - c0[1])) * 1e3 / max(1, accepted),
                "max_depth": max((x["depth"] for x in series if x["t"] <= window), default=0),
                "max_queued_mb": max((x["bytes"] for x in series if x["t"] <= window), default=0) / 1e6,
                "max_rss_mb": max((x["rss"] for x in series), default=0),
                "pace_mb": h_end.get("pace_queue_bytes", 0) / 1e6,
                "bound_mb": h_end.get("max_queue_bytes", 0) / 1e6,
                "per_call_mb": per_call / 1e6,
                "tp_paced": h_end.get("paced", 0) - (series[0]["paced"] if series else 0),
                "series": series,
                "healthz_idle": _pcts(idle),
                "healthz_load": _pcts(health_lat),
                "healthz_floor": _pcts(floor),
            }
        )
        if rates:
            res.update(_paced(st, bodies, base, conc, seconds, rates[0]))
            res["paced_more"] = [_paced(st, bodies, base, conc, seconds, x) for x in rates[1:]]
    finally:
        st.stop()
    return res


def _paced(
    st: FastStack, bodies: list[bytes], base: int, conc: int, seconds: float, rate: float
) -> dict[str, Any]:
    """150k-token calls at ``rate`` calls/s in all (``conc`` clients, each driving warm sessions that grow a
    turn per call, in turn):
    what a harness fleet sends when the box is not saturated. Above, the driver, the fake upstream
    and the proxy compete for 2 cores flat out, so /healthz also measures the OS's run queue; here
    it measures the proxy. Each session's first call (a session first seen at ~138k tokens is
    recorded whole, once) is made and recorded before the window."""
    # each client drives its warm sessions in turn, a session for up to 60 calls: enough sessions
    # for the window at the asked rate (each first call made and recorded before it)
    span = 60
    per_client = max(1, math.ceil(rate * (seconds + 2) / conc / span))
    names = [[f"paced-{rate:g}-{i}-{j}" for j in range(per_client)] for i in range(conc)]
    w = st.written()
    for i in range(conc):
        for j, sid in enumerate(names[i]):
            Http(st.port).post(f"/s/{sid}/v1/chat/completions", bodies[base + (i + j) % 8])
    st.settle(w + conc * per_client)
    time.sleep(0.5)
    stop = threading.Event()
    sent = [0] * conc
    late = [0.0] * conc
    rejected = [0] * conc
    t0 = time.perf_counter() + 0.2
    gap = conc / rate

    def drive(i: int) -> None:
        c = Http(st.port)
        j = 0
        for n, sid in enumerate(names[i]):
            k = base + (i + n) % 8 + 1
            end = min(len(bodies), k + span)
            while not stop.is_set() and k < end:
                due = t0 + (j + i / conc) * gap
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                else:
                    late[i] = max(late[i], now - due)
                try:
                    c.post(f"/s/{sid}/v1/chat/completions", bodies[k])
                except HttpError as exc:
                    if exc.status != 429:
                        raise
                    rejected[i] += 1
                else:
                    sent[i] += 1
                    k += 1
                j += 1

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(conc)]
    for t in threads:
        t.start()
    time.sleep(0.2 + min(1.0, seconds / 4))
    lat = _poll_health(st.port, seconds)
    depth = st.health()["queue_depth"]
    stop.set()
    for t in threads:
        t.join()
    window = time.perf_counter() - t0
    return {
        "paced_rate": rate,
        "paced_per_s": sum(sent) / window,
        "paced_rejected": sum(rejected),
        "paced_late_ms": max(late) * 1e3,
        "paced_depth_end": depth,
        "paced_load": _load(),
        "healthz_paced": _pcts(lat),
    }


_IDLE_SERVER = """
import sys
from aiohttp import web
async def healthz(request):
    return web.json_response({"status": "ok"})
app = web.Application()
app.router.add_get("/healthz", healthz)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""
"""A do-nothing aiohttp server: its ``/healthz`` latency under the same load is the box's floor."""

_POLLER = """
import http.client, json, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
out, end = [], time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    t = time.perf_counter()
    c.request("GET", "/healthz")
    c.getresponse().read()
    out.append((time.perf_counter() - t) * 1e3)
    time.sleep(0.02)
print(json.dumps(out))
"""


def _poll_health(port: int, seconds: float) -> list[float]:
    """``/healthz`` latencies (ms), one request every 20 ms, from a process of its own (so this
    script's threads do not delay it)."""
    got = subprocess.run(
        [sys.executable, "-c", _POLLER, str(port), str(seconds)], capture_output=True, check=True, text=True
    )
    return list(json.loads(got.stdout))


def _pcts(v: list[float]) -> dict[str, float]:
    if not v:
        return {}
    v = sorted(v)
    return {"n": len(v), "p50": v[len(v) // 2], "p99": v[min(len(v) - 1, int(len(v) * 0.99))], "max": v[-1]}


def inproc_run(tmp: Path, turns: int) -> dict[str, Any]:
    """Per-call CPU of each part of the proxy's work, in this process (``time.thread_time``: CPU
    only, so other load on the box moves it little), over one session's growing calls: the event
    loop's parts (read the body, the upstream body, the client's answer) and the writer's
    (``Capture.to_record``, ``Store.write_batch``). The answers are the fake upstream's bytes."""
    from orchard_rec.proxy.core import Call
    from orchard_rec.proxy.server import tune_interpreter
    from orchard_rec.records import Dialect
    from orchard_rec.storage import Store

    tune_interpreter()
    port = _free_port()
    up = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--fake-upstream", str(port)])
    try:
        _wait(f"http://127.0.0.1:{port}/v1/models")
        direct = Http(port)
        bodies = _bodies(turns)
        answers = [
            direct.post("/v1/chat/completions", b[:-1] + b',"return_token_ids":true,"logprobs":true}')
            for b in bodies
        ]
    finally:
        up.terminate()
        up.wait()
    store = Store(f"sqlite:///{tmp / 'inproc.db'}")
    store.upgrade()
    try:
        from orchard_rec.proxy.idcut import IdParser

        ids: Any = IdParser()
    except ImportError:  # a tree from before proxy/idcut.py (for before/after runs)
        ids = None
    headers = {"content-type": "application/json", "user-agent": "OpenAI/Python 1.0"}
    rows = []
    clock = time.thread_time
    try:
        for k, (body, ans) in enumerate(zip(bodies, answers, strict=True), 1):
            t0 = clock()
            call = Call(Dialect.CHAT, "POST", "/s/x/v1/chat/completions", headers)
            call.name_session("inproc")
            call.identify(headers)
            call.read(body, "application/json", "token")
            t1 = clock()
            call.upstream_target("chat/completions", "")
            t2 = clock()
            call.response(200, "application/json")
            call.body(ans, 200)
            t3 = clock()
            rec = call.cap.to_record(ids) if ids is not None else call.cap.to_record()
            t4 = clock()
            store.write_batch([rec], known_new=True)
            t5 = clock()
            rows.append(
                {
                    "turn": k,
                    "read_ms": (t1 - t0) * 1e3,
                    "upstream_body_ms": (t2 - t1) * 1e3,
                    "client_answer_ms": (t3 - t2) * 1e3,
                    "to_record_ms": (t4 - t3) * 1e3,
                    "write_batch_ms": (t5 - t4) * 1e3,
                    "tokens": len(rec.prompt_ids or ()),
                }
            )
    finally:
        store.close()
    hits = (ids.hits, ids.misses) if ids is not None else (0, 0)
    return {"rows": rows, "load": _load(), "id_cache_hits": hits[0], "id_cache_misses": hits[1]}


def _inproc_report(r: dict[str, Any], verdicts: list[str]) -> list[str]:
    rows = r["rows"]
    n = len(rows)
    parts = ("read_ms", "upstream_body_ms", "client_answer_ms", "to_record_ms", "write_batch_ms")
    out = [
        "",
        f"Per-call CPU by part, in process (`time.thread_time`, medians; one session, the fake upstream's"
        f" answers; {r['load']}; id cache {r['id_cache_hits']} hits / {r['id_cache_misses']} misses):",
        "",
        "| turns | prompt tokens | read body (loop) | upstream body (loop) | client answer (loop) |"
        " `to_record` (writer) | `write_batch` (writer) | all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    first = last = 0.0
    for lo, hi in ((1, 5), (n // 4 - 4, n // 4), (n // 2 - 4, n // 2), (n - 9, n)):
        vals = [_bucket(rows, lo, hi, k) or 0.0 for k in parts]
        toks = int(_bucket(rows, lo, hi, "tokens") or 0)
        total = sum(vals)
        first = first or total
        last = total
        out.append(f"| {lo}-{hi} | {toks:,} | " + " | ".join(f"{v:.3f}" for v in vals) + f" | {total:.2f} |")
    verdicts.append(
        f"- Recording CPU per call late <= 2x early (in process, loop + writer): {last:.2f} / {first:.2f} ms ="
        f" {last / first:.1f}x -> **{'met' if last <= 2 * first else 'not met'}**"
    )
    return out


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
    ap.add_argument(
        "--fast",
        default="async,wal",
        help="durability modes of the fast-upstream part (proxy CPU by turn, added latency, writer"
        " throughput, /healthz under load); '' skips it",
    )
    ap.add_argument("--fast-turns", type=int, default=200)
    ap.add_argument("--fast-concurrency", type=int, default=4)
    ap.add_argument("--fast-seconds", type=float, default=15.0)
    ap.add_argument(
        "--paced-rate",
        default="8,100,150",
        help="calls/s of the paced parts, comma-separated (/healthz when not saturated)",
    )
    ap.add_argument("--inproc-turns", type=int, default=200, help="in-process per-part CPU (0 skips it)")
    ap.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="sessions advancing in turn, a call each per round, for --fast-turns turns under each --fast"
        " durability: proxy CPU per call by turn past its per-session caches (0 skips it)",
    )
    ap.add_argument(
        "--interleave-cache-mb",
        type=float,
        default=None,
        help="with --interleave: also run it with every per-session cache bounded to this many MB"
        " (the sessions then outnumber what the caches hold)",
    )
    ap.add_argument(
        "--before", default=None, help="with --render: a --json of the same run on an earlier tree, compared"
    )
    ap.add_argument(
        "--tito",
        type=int,
        default=200,
        help="turns of one session through serve --mode tito: proxy CPU per call by turn (0 skips it)",
    )
    ap.add_argument("--fake-upstream", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.fake_upstream is not None:
        fake_upstream(a.fake_upstream)
        return
    if a.render is not None:
        merged: dict[str, Any] = {}
        for f in a.render:
            merged.update(json.loads(Path(f).read_text()))
        if a.before:
            merged["before"] = json.loads(Path(a.before).read_text())
        _write(report(merged, a), Path(a.out))
        return
    turns = [int(t) for t in a.turns.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="orchard-longhorizon-"))
    results: dict[str, Any] = {}
    for backend in [b for b in a.backends.split(",") if b]:
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
    if a.inproc_turns:
        results["inproc"] = inproc_run(tmp, a.inproc_turns)
        print(json.dumps({k: v for k, v in results["inproc"].items() if k != "rows"}), flush=True)
    fast = []
    for d in [d for d in a.fast.split(",") if d]:
        rates = tuple(float(x) for x in str(a.paced_rate).split(",") if x.strip())
        r = fast_run(tmp, d, a.fast_turns, a.fast_concurrency, a.fast_seconds, rates)
        print(json.dumps({k: v for k, v in r.items() if k not in ("cpu", "series")}), flush=True)
        fast.append(r)
    if fast:
        results["fast"] = fast
    if a.interleave:
        results["interleave"] = []
        for d in [d for d in a.fast.split(",") if d]:
            for mb in (None, a.interleave_cache_mb) if a.interleave_cache_mb is not None else (None,):
                r = interleave_run(tmp, d, a.interleave, a.fast_turns, mb)
                print(json.dumps({k: v for k, v in r.items() if k != "rows"}), flush=True)
                results["interleave"].append(r)
    if a.tito:
        results["tito"] = tito_run(tmp, a.tito)
        print(json.dumps({k: v for k, v in results["tito"].items() if k != "rows"}), flush=True)
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
        text = text[:start] + section.rstrip("\n") + "\n\n" + (text[nxt + 1 :] if nxt >= 0 else "")
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
        + ("half the sessions streamed" if a.concurrency > 1 else "one non-stream session per length")
        + ". Lower bound = final sample (tokens x 9 B) + final conversation JSON. Export: "
        "`orchard-rec export --format jsonl --session` of one session, after the proxy stopped, started by"
        " a small wrapper process whose `RUSAGE_CHILDREN` peak is the export's.",
        "",
        "| backend | turns | final context (tokens) | bytes / session | lower bound | ratio | export s | export peak RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts: list[str] = []
    extra: list[str] = []
    for backend, res in results.items():
        if backend in ("fast", "inproc", "before", "interleave", "tito"):
            continue
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
    if "before" in results:
        extra += _compare(results["before"], results)
    if "inproc" in results:
        extra += _inproc_report(results["inproc"], verdicts)
    for r in results.get("fast", []):
        extra += _fast_report(r, verdicts)
    for r in results.get("interleave", []):
        extra += _interleave_report(r, verdicts)
    if "tito" in results:
        extra += _tito_report(results["tito"], verdicts)
    lines += [*extra, "", "Targets of issue 16 measured here:", "", *verdicts, ""]
    return "\n".join(lines)


def _compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Key figures of the same fast-upstream run on the tree before and after (issue 16, round 4)."""

    def figs(res: dict[str, Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        rows = res.get("inproc", {}).get("rows", [])
        if rows:
            n = len(rows)
            for k in ("client_answer_ms", "to_record_ms", "write_batch_ms"):
                out[f"in process, {k[:-3]} at turns {n - 9}-{n} (ms)"] = f"{_bucket(rows, n - 9, n, k):.2f}"
        for r in res.get("fast", []):
            d, cpu = r["durability"], r["cpu"]
            n = len(cpu)
            early, late = _bucket(cpu, 1, 5, "cpu_ms") or 0.0, _bucket(cpu, n - 9, n, "cpu_ms") or 0.0
            out[f"{d}: proxy CPU per call, turns 1-5 / {n - 9}-{n} (ms)"] = (
                f"{early:.1f} / {late:.1f} = {late / early:.1f}x"
            )
            out[f"{d}: added latency at {r['tokens_last']:,} tokens (ms)"] = f"{r['added_ms_last']:.2f}"
            out[f"{d}: accepted / recorded calls/s at ~{r['tp_tokens']:,} tokens, back to back"] = (
                f"{r['accepted_per_s']:.1f} / {r['recorded_per_s']:.1f} (max queue {r['max_depth']} calls /"
                f" {r['max_queued_mb']:.0f} MB, {r.get('tp_rejected', 0)} answered 429, RSS {r['max_rss_mb']:.0f} MB)"
            )
            out[f"{d}: /healthz p99 during those calls (ms)"] = f"{r['healthz_load'].get('p99', 0):.1f}"
            for pr in [r, *r.get("paced_more", [])] if "healthz_paced" in r else []:
                out[f"{d}: /healthz p99 at {pr['paced_rate']:g} calls/s (ms)"] = (
                    f"{pr['healthz_paced'].get('p99', 0):.1f}"
                )
        return out

    b, a = figs(before), figs(after)
    lines = [
        "",
        "Before and after: the same fast-upstream run on the earlier tree (`--before`) and on this one, minutes"
        " apart on the same box:",
        "",
        "| figure | before | after |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {b[k]} | {a.get(k, '-')} |" for k in b]
    return lines


def _fast_report(r: dict[str, Any], verdicts: list[str]) -> list[str]:
    cpu, d = r["cpu"], r["durability"]
    n = len(cpu)
    out = [
        "",
        f"Fast upstream (`--fake-upstream`: answers at once, vLLM's wire format), `serve --mode token {_flags(d)}`,"
        f" SQLite, records written by the {r.get('writer', 'thread')} writer. One session alone, non-stream, each call"
        f" recorded before the next ({r['load_start']} at the start):",
        "",
        "| turns | context (tokens) | proxy CPU ms / call | event loop (main thread) | other threads and the writer process | latency ms |",
        "|---|---|---|---|---|---|",
    ]
    for lo, hi in ((1, 5), (n // 4 - 4, n // 4), (n // 2 - 4, n // 2), (n - 9, n)):
        vals = [_bucket(cpu, lo, hi, k) or 0.0 for k in ("cpu_ms", "loop_ms", "other_ms", "latency_ms")]
        toks = int(r["tokens_last"] * hi / n)
        out.append(
            f"| {lo}-{hi} | ~{toks:,} | {vals[0]:.2f} | {vals[1]:.2f} | {vals[2]:.2f} | {vals[3]:.1f} |"
        )
    early, late = _bucket(cpu, 1, 5, "cpu_ms"), _bucket(cpu, n - 9, n, "cpu_ms")
    out += [
        "",
        f"Added latency (through the proxy minus straight to the fake, best of 7; {r['load_cpu']}):"
        f" {r['added_ms_first']:.2f} ms at {r['tokens_first']:,} tokens (direct {r['direct_ms_first']:.2f} ms),"
        f" {r['added_ms_last']:.2f} ms at {r['tokens_last']:,} tokens (direct {r['direct_ms_last']:.2f} ms).",
        "",
        f"Back-to-back calls from ~{r['tp_tokens']:,} tokens on, {r['tp_sessions']} clients each driving warm"
        f" sessions in turn ({r.get('tp_session_count', r['tp_sessions'])} sessions, a turn per call; clients out of"
        f" calls before the window's end: {r.get('tp_ran_out', 0)}), {r['tp_window_s']:.1f} s ({r['load_tp']}): accepted"
        f" {r['accepted_per_s']:.1f} calls/s, recorded {r['recorded_per_s']:.1f} calls/s in the same window"
        f" (the rest {r['drain_s']:.2f} s after), {r.get('tp_rejected', 0)} calls answered 429{' (queue at its byte bound)' if r.get('tp_rejected') else ''},"
        f" {r.get('tp_paced', 0)} paced (waited for the writer before being read; mark {r.get('pace_mb', 0):.1f} MB,"
        f" bound {r.get('bound_mb', 0):.1f} MB), queue at most {r['max_depth']} calls / {r['max_queued_mb']:.1f} MB"
        f" (~{r.get('per_call_mb', 0):.2f} MB a call),"
        f" proxy RSS at most {r['max_rss_mb']:.0f} MB, proxy CPU {r['tp_cpu_ms_per_call']:.2f} ms per call.",
        f" `/healthz` latency idle p50 {r['healthz_idle'].get('p50', 0):.2f} / p99 {r['healthz_idle'].get('p99', 0):.2f} ms,"
        f" during the calls p50 {r['healthz_load'].get('p50', 0):.2f} / p99 {r['healthz_load'].get('p99', 0):.2f} /"
        f" max {r['healthz_load'].get('max', 0):.2f} ms ({r['healthz_load'].get('n', 0)} requests)"
        + (
            f"; at the same time a do-nothing aiohttp server on the same box (the floor) p50"
            f" {r['healthz_floor'].get('p50', 0):.2f} / p99 {r['healthz_floor'].get('p99', 0):.2f} /"
            f" max {r['healthz_floor'].get('max', 0):.2f} ms."
            if r.get("healthz_floor")
            else "."
        ),
    ]
    for pr in [r, *r.get("paced_more", [])] if "healthz_paced" in r else []:
        hp = pr["healthz_paced"]
        out += [
            "",
            f"Paced calls at ~{r['tp_tokens']:,} tokens, {r['tp_sessions']} clients driving warm sessions, {pr['paced_rate']:.0f} calls/s"
            f" asked, {pr['paced_per_s']:.1f} sent ({pr['paced_load']}; at most {pr['paced_late_ms']:.0f} ms behind"
            f" schedule, {pr['paced_rejected']} answered 429, queue {pr['paced_depth_end']} at the end): `/healthz`"
            f" p50 {hp.get('p50', 0):.2f} / p99 {hp.get('p99', 0):.2f} / max {hp.get('max', 0):.2f} ms"
            f" ({hp.get('n', 0)} requests).",
        ]
    if early and late:
        verdicts.append(
            f"- Proxy CPU per call late <= 2x early (fast upstream, {d}): {late:.2f} / {early:.2f} ms = "
            f"{late / early:.1f}x -> **{'met' if late <= 2 * early else 'not met'}**"
        )
    verdicts.append(
        f"- Added latency at {r['tokens_last']:,} tokens <= 3 ms (fast upstream, {d}): {r['added_ms_last']:.2f} ms -> "
        f"**{'met' if r['added_ms_last'] <= 3 else 'not met'}**"
    )
    if r.get("pace_mb"):  # the queue stays near the pacing mark: the calls admitted at once overshoot it
        limit = r["pace_mb"] + r["per_call_mb"] * (r["tp_sessions"] + 1)
        flat = r["max_queued_mb"] <= limit and not r.get("tp_rejected")
    else:
        flat = r["max_depth"] <= 4 * r["tp_sessions"] and not r.get("tp_rejected")
    ok = r["recorded_per_s"] >= 0.95 * r["accepted_per_s"] and r["drain_s"] < 1.0 and flat
    verdicts.append(
        f"- Recorded >= accepted calls/s at ~{r['tp_tokens']:,} tokens, queue flat ({d}): {r['recorded_per_s']:.1f} vs"
        f" {r['accepted_per_s']:.1f}/s, max queue {r['max_depth']} calls / {r['max_queued_mb']:.1f} MB"
        f" (pacing mark {r.get('pace_mb', 0):.1f} MB), {r.get('tp_rejected', 0)} answered 429,"
        f" RSS <= {r['max_rss_mb']:.0f} MB -> **{'met' if ok else 'not met'}**"
    )
    p99 = r["healthz_load"].get("p99", 0)
    verdicts.append(
        f"- `/healthz` p99 <= 5 ms while ~{r['tp_tokens']:,}-token calls flow back to back, cores saturated ({d}):"
        f" {p99:.2f} ms -> **{'met' if p99 <= 5 else 'not met'}**"
        + (
            f" (a do-nothing aiohttp server polled at the same time: {r['healthz_floor'].get('p99', 0):.2f} ms)"
            if r.get("healthz_floor")
            else ""
        )
    )
    for pr in [r, *r.get("paced_more", [])] if "healthz_paced" in r else []:
        hp = pr["healthz_paced"].get("p99", 0)
        ok = hp <= 5 and not pr["paced_rejected"]
        verdicts.append(
            f"- `/healthz` p99 <= 5 ms while ~{r['tp_tokens']:,}-token calls flow at {pr['paced_per_s']:.1f} calls/s"
            f" ({d}): {hp:.2f} ms -> **{'met' if ok else 'not met'}**"
        )
    return out


if __name__ == "__main__":
    main()
