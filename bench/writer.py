"""The recording work per call, without the network: CPU (``time.process_time``) per call of
building a record from a capture, and of storing records in batches of several sizes, plus the
SQLite driver alone on the same rows.

    python bench/writer.py [--calls 12000]

A vLLM-like token-mode chat answer (16 completion ids with logprobs, 10 prompt ids), as the
proxy's writer thread sees it. The interpreter is tuned as ``serve`` tunes it.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.server import tune_interpreter
from orchard_rec.proxy.token import plan_for
from orchard_rec.records import Dialect
from orchard_rec.storage import Store
from orchard_rec.storage.delta import SessionState
from orchard_rec.storage.rows import _row

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there, benchmark"}]}
ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello! " * 8},
                "finish_reason": "stop",
                "logprobs": {
                    "content": [
                        {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []} for _ in range(16)
                    ]
                },
                "token_ids": list(range(16)),
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 16, "total_tokens": 26},
        "prompt_token_ids": list(range(10)),
    }
)


def capture() -> Capture:
    plan = plan_for("token", Dialect.CHAT, BODY)
    assert plan is not None
    c = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", None)
    c.headers = {"content-type": "application/json", "user-agent": "python-httpx/0.28"}
    c.request, c.upstream_request, c.upstream_dialect = BODY, plan.body, Dialect.CHAT
    c.status_code, c.body, c.bytes_in, c.bytes_out = 200, ANSWER, 90, 700
    c.first_byte_at = c.done_at = time.time()
    return c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=12_000)
    n = ap.parse_args().calls
    caps = [capture() for _ in range(n)]
    tune_interpreter()
    t = time.process_time()
    recs = [c.to_record() for c in caps]
    print(f"build record (Capture.to_record)      {1e6 * (time.process_time() - t) / n:7.1f} us/call")
    work = Path(tempfile.mkdtemp(prefix="orchard-writer-"))
    for size in (8, 32, 128):
        store = Store(f"sqlite:///{work / f'b{size}.db'}")
        store.upgrade()
        t = time.process_time()
        for i in range(0, n, size):
            store.write_batch(recs[i : i + size], known_new=True)
        print(
            f"store (Store.write_batch), batch {size:>3}   {1e6 * (time.process_time() - t) / n:7.1f} us/call"
        )
        store.close()
    store = Store(f"sqlite:///{work / 'raw.db'}")
    store.upgrade()
    t = time.process_time()
    stored = [store.encoder.encode(r, SessionState())[0] for r in recs]
    print(f"delta encoding (Encoder.encode)        {1e6 * (time.process_time() - t) / n:7.1f} us/call")
    with store.engine.begin() as db:  # compiles the statement once
        store._insert_calls(db, [_row(recs[0], None, stored[0])])
    sql, get, fix = store._insert_sql, store._insert_get, store._insert_fix
    store.close()
    t = time.process_time()
    params = []
    for row in (_row(r, None, s) for r, s in zip(recs[1:], stored[1:])):
        vals = list(get(row))
        for i, f in fix:
            if (v := vals[i]) is not None:
                vals[i] = f(v)
        params.append(tuple(vals))
    print(f"row values (orjson text, timestamps)  {1e6 * (time.process_time() - t) / n:7.1f} us/call")
    con = sqlite3.connect(str(work / "raw.db"))
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    t = time.process_time()
    for i in range(0, len(params), 32):
        con.executemany(sql, params[i : i + 32])  # type: ignore[arg-type]
        con.commit()
    print(f"SQLite driver alone, batch 32         {1e6 * (time.process_time() - t) / n:7.1f} us/call")
    con.close()
    for f in work.iterdir():
        f.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
