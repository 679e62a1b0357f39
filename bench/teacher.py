"""Teacher throughput: ``orchard-rec teacher``'s runner against the demo upstream as a vLLM
(``/v1/completions`` + ``prompt_logprobs``) and as an SGLang (``/generate`` input log-probs)
teacher, at concurrency 1 / 8 / 32, on synthetic samples of realistic length.

    python bench/teacher.py [--samples 200] [--tokens 2000] [--response 400] [--top-k 0]

Reports samples/s and response tokens/s per (kind, concurrency), all in one run (these
machines are noisy: compare within a run). The teacher here is the demo server on the same
2 cores, so this measures the runner's overhead and scaling, not a model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy.server import BackgroundServer
from orchard_rec.teacher import MemorySink, SampleRef, TeacherConfig, score_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=2000, help="tokens per sample (prompt + response)")
    ap.add_argument("--response", type=int, default=400, help="response tokens per sample")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--concurrency", default="1,8,32")
    args = ap.parse_args()
    refs = [
        SampleRef(f"s{i}", f"c{i}", [(i * 7 + k * 13) % 5000 + 10 for k in range(args.tokens)], args.response)
        for i in range(args.samples)
    ]
    rows = []
    with BackgroundServer(DemoUpstream().app()) as up:
        for kind in ("vllm", "sglang"):
            for c in (int(x) for x in args.concurrency.split(",")):
                cfg = TeacherConfig(url=up.url, kind=kind, concurrency=c, top_k=args.top_k, model="demo")
                t0 = time.perf_counter()
                summary = asyncio.run(score_all(refs, cfg, MemorySink()))
                dt = time.perf_counter() - t0
                assert summary.failed == 0, summary.errors
                rows.append((kind, c, summary.samples / dt, summary.tokens / dt))
    print(
        f"teacher throughput: {args.samples} samples x {args.tokens} tokens ({args.response} response), top-k {args.top_k}"
    )
    print("| teacher | concurrency | samples/s | response tokens/s |")
    print("|---|---|---|---|")
    for kind, c, sps, tps in rows:
        print(f"| {kind} | {c} | {sps:.1f} | {tps:.0f} |")


if __name__ == "__main__":
    main()
