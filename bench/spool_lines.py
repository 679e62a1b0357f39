"""Spool bytes per call under ``wal`` in a growing session (issue 16: capture lines, O(new)).

One SWE-like session of ``--turns`` calls (``bench/longhorizon.py``'s bodies: 2k-token system
prompt, 5 tools, tool results of 300-2000 tokens) through an in-process proxy (``--mode token
--durability wal``) against ``longhorizon.py --fake-upstream`` (vLLM's wire format, the prompt's
ids in every answer), stream and not alternately. Every spool line is tapped as it is appended;
for comparison, the whole record's line (``record_to_json``, format 2's encoding) of the same call.
Also the spool thread's encode time per call (``capline.Encoder.encode``) by turn.

    python bench/spool_lines.py [--turns 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

import longhorizon as lh  # noqa: E402

from orchard_rec.proxy.app import RECORDER, build_app  # noqa: E402
from orchard_rec.proxy.config import ProxyConfig  # noqa: E402
from orchard_rec.proxy.server import BackgroundServer  # noqa: E402
from orchard_rec.storage.spool import record_to_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    bodies = lh._bodies(a.turns)
    port = lh._free_port()
    up = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "longhorizon.py"), "--fake-upstream", str(port)]
    )
    rows: list[dict[str, Any]] = []
    try:
        lh._wait(f"http://127.0.0.1:{port}/v1/models")
        with TemporaryDirectory() as tmp:
            cfg = ProxyConfig(
                upstream=f"http://127.0.0.1:{port}/v1",
                db=f"sqlite:///{tmp}/s.db",
                mode="token",
                durability="wal",
                spool=f"{tmp}/s.spool",
            )
            with BackgroundServer(lambda: build_app(cfg)) as proxy:
                rec = proxy.app[RECORDER]
                spool = rec.spool
                append = spool.append_lines
                enc = rec.lines.encode
                seen: list[tuple[int, float]] = []
                caps: list[Any] = []

                def timed(cap: Any) -> bytes:
                    t0 = time.perf_counter()
                    line = enc(cap)
                    seen.append((len(line), time.perf_counter() - t0))
                    caps.append(cap)
                    return line

                rec.lines.encode = timed  # type: ignore[method-assign]
                spool.append_lines = append  # type: ignore[method-assign]
                for k, body in enumerate(bodies):
                    if k % 2:
                        body = body[:-1] + b',"stream":true}'
                    req = urllib.request.Request(
                        f"{proxy.url}/s/lines/v1/chat/completions",
                        data=body,
                        headers={"Content-Type": "application/json"},
                    )
                    with urllib.request.urlopen(req, timeout=60) as r:
                        r.read()
                    assert rec.flush()
                    size, dt = seen[-1]
                    cap = caps[-1]
                    whole = (
                        len(record_to_json(cap.to_record())) if (k + 1) in (1, 50, 100, 150, 200) else None
                    )
                    rows.append(
                        {
                            "turn": k + 1,
                            "request": len(body),
                            "line": size,
                            "encode_ms": dt * 1e3,
                            "record_line": whole,
                        }
                    )
    finally:
        up.terminate()
        up.wait(10)
    print("| turn | request bytes | capture line bytes | encode ms | whole record line bytes |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r["record_line"] is not None:
            print(
                f"| {r['turn']} | {r['request']:,} | {r['line']:,} | {r['encode_ms']:.2f} | {r['record_line']:,} |"
            )
    last = rows[-10:]
    print(
        f"turns {last[0]['turn']}-{last[-1]['turn']}: capture line {sum(r['line'] for r in last) / len(last):,.0f} B "
        f"(stream and not), encode {sum(r['encode_ms'] for r in last) / len(last):.2f} ms on average"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
