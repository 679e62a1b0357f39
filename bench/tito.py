"""What token-in/token-out costs per call: multi-turn sessions through ``--mode token`` and
``--mode tito`` against the demo vLLM-compatible upstream (the same model either way).

    python bench/tito.py [--sessions 30] [--turns 6]

Tito renders the conversation with the chat template on every call but tokenizes only
the new turns (the session's earlier ids are reused); the table shows per-call latency
by turn, so a cost that grew with the history would show.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy import BackgroundServer, ProxyConfig, build_app

TOOL = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}


def run(mode: str, sessions: int, turns: int, work: Path) -> dict[int, list[float]]:
    up = BackgroundServer(DemoUpstream().app()).start()
    cfg = ProxyConfig(
        upstream=up.url + "/v1",
        db=f"sqlite:///{work / (mode + '.db')}",
        spool=str(work / (mode + ".spool")),
        mode=mode,
        tokenizer="demo",
    )  # type: ignore[arg-type]
    proxy = BackgroundServer(lambda: build_app(cfg)).start()
    by_turn: dict[int, list[float]] = {}
    try:
        for s in range(sessions):
            client = openai.OpenAI(base_url=f"{proxy.url}/s/{mode}-{s}/v1", api_key="x", max_retries=0)
            msgs = [
                {"role": "system", "content": "You are a coding agent. " * 20},
                {"role": "user", "content": " ".join(f"run `echo {k}`" for k in range(turns))},
            ]
            for t in range(turns):
                t0 = time.perf_counter()
                m = client.chat.completions.create(model="m", messages=msgs, tools=[TOOL]).choices[0].message  # type: ignore[arg-type]
                by_turn.setdefault(t, []).append(time.perf_counter() - t0)
                msgs.append(
                    {
                        "role": "assistant",
                        "content": m.content,
                        "tool_calls": [tc.model_dump() for tc in m.tool_calls] if m.tool_calls else None,
                    }
                )
                for tc in m.tool_calls or ():
                    msgs.append({"role": "tool", "tool_call_id": tc.id, "content": "output line\n" * 5})
    finally:
        proxy.stop()
        up.stop()
    return by_turn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=30)
    ap.add_argument("--turns", type=int, default=6)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orchard-tito-bench-"))
    run("token", 3, a.turns, work)  # warm up imports and caches
    token = run("token", a.sessions, a.turns, work)
    tito = run("tito", a.sessions, a.turns, work)
    print("| turn | token mode p50 ms | tito p50 ms | tito - token ms |")
    print("|---|---|---|---|")
    for t in sorted(token):
        a50, b50 = statistics.median(token[t]) * 1e3, statistics.median(tito[t]) * 1e3
        print(f"| {t + 1} | {a50:.2f} | {b50:.2f} | {b50 - a50:+.2f} |")
    all_a = statistics.median(x for v in token.values() for x in v) * 1e3
    all_b = statistics.median(x for v in tito.values() for x in v) * 1e3
    print(
        f"\nall calls: token {all_a:.2f} ms, tito {all_b:.2f} ms, added by tito {all_b - all_a:+.2f} ms per call (median)"
    )


if __name__ == "__main__":
    main()
