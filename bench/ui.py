"""Viewer benchmark: time to first render in headless Chromium (Debian's, driven by Playwright).

    python bench/ui.py [--sessions 100000] [--tokens 150000] [--rounds 5] [--no-results]

Builds (once, cached under bench/.cache/) a SQLite database of ``--sessions`` one-call sessions
through ``Store.write_batch`` (each a short agent turn whose tool result holds a word unique to
it, indexed for search as the proxy's writer does; every tenth with an outcome, and one task of
64 attempts), plus one session whose single sample holds ``--tokens`` tokens
(two calls: a short first turn, then a prompt that extends it to the full length). Serves
``orchard-rec ui`` over it on loopback and measures, in a fresh page each round (median):
- sessions page (first page, a filtered page, a deep page, sorted by reward): server time
  (response end), first contentful paint, DOMContentLoaded;
- the long session: first contentful paint, the first token chunk on screen
  (``performance.mark('orchard-first-tokens')``), every token element in the DOM
  (``orchard-tokens-ready``), and the longest main-thread task while it rendered (a frozen page
  would show one long task);
- search (a word of one session's tool result) and the group view of the 64-attempt task with a
  BAR selection and a filter: first contentful paint, and its ratio to the sessions list's.
Writes its own section of bench/RESULTS.md (between ``<!-- ui:start -->`` and ``<!-- ui:end -->``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

CHROMIUM = os.environ.get("ORCHARD_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


GROUP = 64
GROUP_TASK = "bench-task"


def build_db(path: Path, sessions: int, tokens: int) -> None:
    from orchard_rec.records import CallOutcome, CallRecord, Dialect, Outcome
    from orchard_rec.storage import Store

    url = f"sqlite:///{path}"
    store = Store(url)
    store.upgrade()
    t0 = time.time() - sessions
    harnesses = ("codex", "claude-code", "openclaw", "zeroclaw")

    def rec(
        sid: str, t: float, prompt: list[int], completion: list[int], harness: str, i: int = 0
    ) -> CallRecord:
        # a short agent turn: the task, a tool call, its result (a word unique to the session), the answer
        messages = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Task {i % 1000}: make the failing test pass."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"cmd": "pytest -x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": f"FAILED test_{i % 97}.py marker{i} 1 failed"},
        ]
        return CallRecord(
            call_id=uuid.uuid4().hex,
            session_id=sid,
            dialect=Dialect.CHAT,
            method="POST",
            path="/v1/chat/completions",
            stream=False,
            status_code=200,
            outcome=CallOutcome.OK,
            received_at=t,
            first_byte_at=t + 0.05,
            done_at=t + 0.4,
            harness=harness,
            model="orchard-demo",
            request={"model": "orchard-demo", "messages": messages},
            response={
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Fixed."},
                        "finish_reason": "stop",
                    }
                ]
            },
            prompt_ids=tuple(prompt),
            completion_ids=tuple(completion),
            completion_logprobs=tuple(-0.05 * (i % 7) for i in range(len(completion))),
            finish_reason="stop",
        )

    batch: list[CallRecord] = []
    started = time.perf_counter()
    for i in range(sessions):
        batch.append(
            rec(f"s{i:07d}", t0 + i, [1, 311, 207, 40 + i % 50], [60, 61, 62, 2], harnesses[i % 4], i)
        )
        if len(batch) == 5000:
            store.write_batch(batch, known_new=True)
            batch = []
            print(f"  {i + 1} sessions ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    store.write_batch(batch, known_new=True)
    for i in range(0, sessions, 10):
        meta = {"task": f"t{i % 1000}"}
        store.set_outcome(f"s{i:07d}", Outcome(reward=(i % 100) / 100, status="completed", metadata=meta))
    # one task with GROUP attempts (sessions spread over the table), rewards 0/1, some truncated
    for k in range(GROUP):
        i = (k * (sessions // GROUP)) + 1
        status = "truncated" if k % 16 == 15 else "completed"
        meta = {"task": GROUP_TASK}
        store.set_outcome(f"s{i:07d}", Outcome(reward=float(k % 3 == 0), status=status, metadata=meta))
    # the long session: one sample of `tokens` tokens (demo tokenizer ids, so it decodes)
    first_prompt = [1, 311, 207] + [40 + k % 200 for k in range(200)]
    first = [300 + k % 200 for k in range(100)] + [2]
    grown = (
        first_prompt + first + [40 + k % 250 for k in range(tokens - len(first_prompt) - len(first) - 200)]
    )
    last = [300 + k % 200 for k in range(199)] + [2]
    t = time.time()
    store.write_batch([rec("long-150k", t, first_prompt, first, "codex")])
    store.write_batch([rec("long-150k", t + 1, grown, last, "codex")])
    store.close()


def measure(url: str, rounds: int, sessions: int, tokens: int) -> dict[str, dict[str, float]]:
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    rows = "tbody [data-session-id]"
    word = f"marker{sessions * 7 // 10}"
    pages = {
        "sessions: first page": ("/", rows),
        "sessions: filtered (harness + reward >= 0.5)": ("/?harness=codex&reward_min=0.5", rows),
        f"sessions: page {max(1, sessions // 100)} of {max(1, -(-sessions // 50))}": (
            f"/?page={max(1, sessions // 100)}",
            rows,
        ),
        "sessions: sorted by reward": ("/?sort=reward&order=desc", rows),
        f"search: a word of one session's tool result ({word})": (f"/?q={word}", rows),
        f"group: {GROUP} attempts, bar:8:0.25:0.75 + nonzero-std": (
            f"/groups/task/{GROUP_TASK}?select=bar:8:0.25:0.75&filter=nonzero-std",
            "[data-attempt-id]",
        ),
    }
    out: dict[str, dict[str, list[float]]] = {}
    profile = tempfile.mkdtemp(prefix="orchard-bench-chromium-")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1320, "height": 900},
        )
        ctx.add_init_script(
            "window.__long = []; try { new PerformanceObserver(l => l.getEntries().forEach(e => "
            "window.__long.push(e.duration))).observe({type: 'longtask', buffered: true}); } catch (e) {}"
        )
        for r in range(rounds + 1):  # round 0 warms the server and the browser cache
            for name, (path, selector) in pages.items():
                page = ctx.new_page()
                page.goto(url + path, wait_until="load")
                page.wait_for_selector(selector, state="attached")
                page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0")
                m = page.evaluate(
                    "() => { const n = performance.getEntriesByType('navigation')[0];"
                    " const fcp = performance.getEntriesByName('first-contentful-paint')[0];"
                    " return {server: n.responseEnd, fcp: fcp ? fcp.startTime : null, dcl: n.domContentLoadedEventEnd,"
                    " rows: document.querySelectorAll('[data-session-id], [data-attempt-id]').length}; }"
                )
                page.close()
                if r:
                    for k in ("server", "fcp", "dcl", "rows"):
                        out.setdefault(name, {}).setdefault(k, []).append(m[k])
            page = ctx.new_page()
            page.goto(url + "/s/long-150k", wait_until="load")
            page.wait_for_function("document.body.dataset.tokensReady === '1'", timeout=300_000)
            m = page.evaluate(
                "() => { const n = performance.getEntriesByType('navigation')[0];"
                " const fcp = performance.getEntriesByName('first-contentful-paint')[0];"
                " const mk = k => (performance.getEntriesByName(k)[0] || {}).startTime;"
                " return {server: n.responseEnd, fcp: fcp ? fcp.startTime : null,"
                " first_tokens: mk('orchard-first-tokens'), all_tokens: mk('orchard-tokens-ready'),"
                " longest_task: Math.max(0, ...window.__long),"
                " tokens: document.querySelectorAll('[data-sample-index] [data-token-id]').length}; }"
            )
            page.close()
            if r:
                for k in ("server", "fcp", "first_tokens", "all_tokens", "longest_task", "tokens"):
                    out.setdefault(f"session: one {tokens // 1000}k-token sample", {}).setdefault(
                        k, []
                    ).append(m[k])
        ctx.close()
    return {name: {k: statistics.median(v) for k, v in d.items()} for name, d in out.items()}


NOTE = "Sessions pages: one page and one `count(*)` per request, but `sessions` has no index on `created_at` / `updated_at` / `reward`, so each sorted page is a top-N sort over the whole table (and a deep OFFSET a full sort); the machine ran other agents' work on its 2 cores meanwhile. An index on `sessions(created_at)` (a storage migration) would make the default page O(page size)."


def write_results(res: dict[str, dict[str, float]], args: Any, build_s: float | None) -> str:
    lines = [
        "<!-- ui:start -->",
        f"## Viewer (`python bench/ui.py --sessions {args.sessions} --tokens {args.tokens} --rounds {args.rounds}`)",
        "",
        f"Headless Chromium (Debian's, Playwright), SQLite, {args.sessions:,} one-call sessions + one session whose "
        f"sample holds {args.tokens:,} tokens; medians of {args.rounds} rounds, ms from navigation start.",
        "",
        "| page | server done | first contentful paint | DOM ready / first tokens | all tokens in DOM | longest task |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in res.items():
        if "first_tokens" in m:
            lines.append(
                f"| {name} | {m['server']:.0f} | {m['fcp']:.0f} | {m['first_tokens']:.0f} | {m['all_tokens']:.0f} "
                f"({m['tokens']:,.0f} elements) | {m['longest_task']:.0f} |"
            )
        else:
            lines.append(f"| {name} | {m['server']:.0f} | {m['fcp']:.0f} | {m['dcl']:.0f} | | |")
    base = res.get("sessions: first page", {}).get("fcp")
    if base:
        lines += ["", "First contentful paint against the sessions list's first page (same run):", ""]
        for name, m in res.items():
            if name.startswith(("search", "group")):
                verdict = "under" if m["fcp"] < 1500 else "OVER"
                lines.append(
                    f"- {name}: {m['fcp']:.0f} ms, {m['fcp'] / base:.2f}x the list's {base:.0f} ms "
                    f"({verdict} 1.5 s; {m['rows']:.0f} rows)"
                )
    lines += ["", NOTE]
    if build_s is not None:
        lines += [
            "",
            f"Database built through `Store.write_batch` in {build_s:.0f} s (cached in bench/.cache/).",
        ]
    lines.append("<!-- ui:end -->")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=150_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-results", action="store_true", help="Print only; leave bench/RESULTS.md alone.")
    args = ap.parse_args()

    from orchard_rec.proxy import BackgroundServer
    from orchard_rec.tokenizer import load_tokenizer
    from orchard_rec.ui import build_ui_app, open_store

    cache = HERE / ".cache"
    cache.mkdir(exist_ok=True)
    db_path = cache / f"ui2-{args.sessions}-{args.tokens}.db"  # ui2: conversations, outcomes with tasks
    build_s = None
    if not db_path.exists():
        tmp = db_path.with_suffix(".tmp.db")
        for f in cache.glob(tmp.name + "*"):
            f.unlink()
        t = time.perf_counter()
        build_db(tmp, args.sessions, args.tokens)
        build_s = time.perf_counter() - t
        tmp.rename(db_path)
    store = open_store(f"sqlite:///{db_path}")
    tok = load_tokenizer("demo")
    with BackgroundServer(lambda: build_ui_app(store, tokenizer=tok)) as srv:
        res = measure(srv.url, args.rounds, args.sessions, args.tokens)
    store.close()
    print(json.dumps(res, indent=2))
    section = write_results(res, args, build_s)
    print(section)
    if not args.no_results:
        results = HERE / "RESULTS.md"
        text = results.read_text() if results.exists() else ""
        if "<!-- ui:start -->" in text:
            head, _, rest = text.partition("<!-- ui:start -->")
            _, _, tail = rest.partition("<!-- ui:end -->\n")
            text = head + section + tail
        else:
            text = text.rstrip("\n") + "\n\n" + section
        results.write_text(text)


if __name__ == "__main__":
    main()
