"""The CPU a streamed call costs the proxy process, outside the network: the relay's filter per
chunk, building the record on the database thread (``Capture.to_record``) and storing it
(``Store.write_batch``), per call and per relayed chunk.

    python bench/streamrec.py [--calls 3000] [--chunks 32] [--best 3]

The stream is ``bench/streams.py``'s: a vLLM-like token-mode chat stream (``fakeupstream.py``'s
frames: a first chunk with the prompt's ids, ``--chunks`` one-token chunks with their id and
logprob, ``[DONE]``), one chunk per read, relayed through ``StreamRelay`` as ``serve`` does
(default mode: token, so the ids and logprobs are injected and stripped again). The interpreter
is tuned as ``serve`` tunes it; CPU is ``time.thread_time`` (one thread), best of ``--best``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from fakeupstream import _bodies  # noqa: E402

from orchard_rec.proxy.capture import Capture  # noqa: E402
from orchard_rec.proxy.core import StreamRelay  # noqa: E402
from orchard_rec.proxy.idcut import IdParser  # noqa: E402
from orchard_rec.proxy.server import tune_interpreter  # noqa: E402
from orchard_rec.proxy.token import plan_for  # noqa: E402
from orchard_rec.records import Dialect  # noqa: E402
from orchard_rec.storage import Store  # noqa: E402

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hello there, benchmark"}]}


def relayed(frames: list[bytes], i: int) -> tuple[Capture, int]:
    """A capture as the handler leaves it after relaying ``frames``, and the bytes the client got."""
    plan = plan_for("token", Dialect.CHAT, BODY)
    assert plan is not None
    c = Capture(Dialect.CHAT, "POST", "/v1/chat/completions", f"s{i}")
    c.headers = {"content-type": "application/json", "user-agent": "python-httpx/0.28"}
    c.request, c.upstream_request, c.upstream_dialect = BODY, plan.body, Dialect.CHAT
    c.request_raw = orjson.dumps(BODY)
    c.stream, c.status_code, c.bytes_in = True, 200, len(c.request_raw)
    relay = StreamRelay(c, plan)
    n = 0
    for f in frames:
        n += len(relay.feed(f))
    n += len(relay.finish())
    c.bytes_out = n
    c.first_byte_at = c.done_at = time.time()
    return c, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--best", type=int, default=3)
    a = ap.parse_args()
    frames = _bodies(a.chunks)[(True, True)]
    per_call = len(frames)
    tune_interpreter()
    relay_s, build_s, store_s = [], [], []
    work = Path(tempfile.mkdtemp(prefix="orchard-streamrec-"))
    for k in range(a.best):
        t = time.thread_time()
        caps = [relayed(frames, i)[0] for i in range(a.calls)]
        relay_s.append(time.thread_time() - t)
        ids = IdParser()
        t = time.thread_time()
        recs = [c.to_record(ids) for c in caps]
        build_s.append(time.thread_time() - t)
        store = Store(f"sqlite:///{work / f'r{k}.db'}")
        store.upgrade()
        t = time.thread_time()
        for i in range(0, a.calls, a.batch):
            store.write_batch(recs[i : i + a.batch], known_new=True)
        store_s.append(time.thread_time() - t)
        store.close()
        del caps, recs
    print(f"{a.calls} streamed calls, {per_call} chunks each (best of {a.best}):")
    for name, s in (
        ("relay (StreamRelay.feed)", relay_s),
        ("record (Capture.to_record)", build_s),
        (f"store (Store.write_batch, {a.batch})", store_s),
    ):
        us = 1e6 * min(s) / a.calls
        print(f"  {name:<34} {us:7.1f} us/call  {us / per_call:5.2f} us/chunk")
    for f in work.iterdir():
        f.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
