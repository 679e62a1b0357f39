"""What indexing conversations for search costs the recorder: ``Store.write_batch`` CPU with the
search index (migration 0009) against the same database without it, SQLite.

    python bench/search_index.py [--sessions 300] [--turns 20] [--rounds 3]

Each session is an agent loop: a system prompt, the task, then per turn a tool call and a
60-line tool result (the request grows by them; the answer carries 50 log-probs), written
100 calls a batch as the proxy's writer does. Rounds alternate without and with the index;
prints process CPU seconds per call and the ratio of the medians (same run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from orchard_rec.records import CallOutcome, CallRecord, Dialect
from orchard_rec.storage import Store


def calls(n_sessions: int, turns: int) -> list[CallRecord]:
    out = []
    for s in range(n_sessions):
        msgs: list[dict] = [
            {"role": "system", "content": "You are a coding agent. " * 40},
            {"role": "user", "content": f"task {s}: fix the bug"},
        ]
        ids = list(range(300))
        for t in range(turns):
            ans = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{t}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": f'{{"cmd": "cat f{t}.py"}}'},
                    }
                ],
            }
            now = time.time()
            out.append(
                CallRecord(
                    call_id=uuid.uuid4().hex,
                    session_id=f"s{s}",
                    dialect=Dialect.CHAT,
                    method="POST",
                    path="/v1/chat/completions",
                    stream=False,
                    status_code=200,
                    outcome=CallOutcome.OK,
                    received_at=now,
                    first_byte_at=None,
                    done_at=now,
                    request={"model": "m", "messages": list(msgs)},
                    response={
                        "choices": [
                            {
                                "index": 0,
                                "message": ans,
                                "finish_reason": "tool_calls",
                                "logprobs": {"content": [{"token": "x", "logprob": -0.1}] * 50},
                            }
                        ]
                    },
                    prompt_ids=tuple(ids),
                    completion_ids=tuple(range(50)),
                    completion_logprobs=tuple([-0.1] * 50),
                )
            )
            result = f"def f{t}(x):\n    return x * {t}  # line\n" * 60
            msgs = [*msgs, ans, {"role": "tool", "tool_call_id": f"c{t}", "content": result}]
            ids = ids + list(range(50)) + list(range(400))
    return out


def run(recs: list[CallRecord], index: bool) -> float:
    folder = tempfile.mkdtemp(prefix="orchard-search-bench-")
    store = Store(f"sqlite:///{folder}/x.db")
    store.upgrade()
    if not index:
        with store.engine.begin() as c:
            c.execute(text("DROP TABLE search_fts"))
        store._search = None
    t0 = time.process_time()
    for i in range(0, len(recs), 100):
        store.write_batch(recs[i : i + 100])
    cpu = time.process_time() - t0
    store.close()
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    recs = calls(args.sessions, args.turns)
    without, with_ = [], []
    for _ in range(args.rounds):
        without.append(run(recs, False))
        with_.append(run(recs, True))
    a, b = statistics.median(without), statistics.median(with_)
    n = len(recs)
    print(
        f"{n} calls: write_batch CPU without the index {a / n * 1e3:.3f} ms/call, "
        f"with it {b / n * 1e3:.3f} ms/call: {b / a:.2f}x (medians of {args.rounds})"
    )


if __name__ == "__main__":
    main()
