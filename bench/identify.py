"""Harness identification per call, without the network: thread CPU time (``time.thread_time``) of
``identify(headers, body)`` (the proxy's recording core runs it twice per call, the second time with
the parsed body) and of ``side_conversation``, per wire dialect.

    python bench/identify.py [--calls 20000] [--rounds 5]

Bodies are an agent's mid-session call (a ~7 kB system prompt, 5 tools, 20 turns of a tool call and
its result), in each built-in dialect's shape; headers are an SDK's (no harness names itself by its
headers, so every plug-in that reads the body does: OpenClaw its first user message, Hermes its tool
set) and, for comparison, Codex's (named by its headers: no body read). Each line prints the
fastest and the median round in microseconds per call; compare two trees by running this script
with each on ``PYTHONPATH``, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchard_rec.harnesses import identify, side_conversation

SYSTEM = "You are a coding agent. " * 300
TURNS = 20


def _chat() -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(TURNS):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "t1", "arguments": "{}"}}
        msgs += [
            {"role": "user", "content": f"do step {i} " * 20},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "ok " * 200},
        ]
    tools = [
        {"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
        for i in range(5)
    ]
    return {"model": "m", "messages": msgs, "tools": tools, "stream": True}


def _responses() -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(TURNS):
        items += [
            {"role": "user", "content": [{"type": "input_text", "text": f"do step {i} " * 20}]},
            {"type": "function_call", "call_id": f"c{i}", "name": "t1", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "ok " * 200},
        ]
    tools = [{"type": "function", "name": f"t{i}", "parameters": {"type": "object"}} for i in range(5)]
    return {"model": "m", "instructions": SYSTEM, "input": items, "tools": tools, "stream": True}


def _messages() -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    for i in range(TURNS):
        msgs += [
            {"role": "user", "content": [{"type": "text", "text": f"do step {i} " * 20}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"c{i}", "name": "t1", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"c{i}", "content": "ok " * 200}],
            },
        ]
    tools = [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(5)]
    return {"model": "m", "system": [{"type": "text", "text": SYSTEM}], "messages": msgs, "tools": tools}


def _gemini() -> dict[str, Any]:
    contents: list[dict[str, Any]] = []
    for i in range(TURNS):
        contents += [
            {"role": "user", "parts": [{"text": f"do step {i} " * 20}]},
            {"role": "model", "parts": [{"functionCall": {"name": "t1", "args": {}}}]},
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "t1", "response": {"output": "ok " * 200}}}],
            },
        ]
    decls = [{"name": f"t{i}", "parameters": {"type": "OBJECT"}} for i in range(5)]
    return {
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "contents": contents,
        "tools": [{"functionDeclarations": decls}],
    }


SDK = {
    "User-Agent": "OpenAI/Python 2.24.0",
    "Content-Type": "application/json",
    "Accept": "application/json",
    "X-Stainless-Lang": "python",
    "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
}
CODEX = {"User-Agent": "codex_exec/0.171.0 (Linux)", "originator": "codex_exec", "session-id": "t1"}


def _time(fn: Callable[[], Any], calls: int, rounds: int) -> tuple[float, float]:
    runs = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        runs.append((time.thread_time() - t0) / calls * 1e6)
    return min(runs), statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    bodies = {"chat": _chat(), "responses": _responses(), "messages": _messages(), "gemini": _gemini()}
    cases: list[tuple[str, Callable[[], Any]]] = [("headers only (sdk)", lambda: identify(SDK))]
    for name, body in bodies.items():
        cases.append((f"sdk + {name}", lambda body=body: identify(SDK, body)))
        cases.append((f"sdk + {name}, no tools", lambda body=body: identify(SDK, {**body, "tools": []})))
    cases.append(("codex + responses", lambda: identify(CODEX, bodies["responses"])))
    for name, body in bodies.items():
        cases.append((f"side_conversation {name}", lambda body=body: side_conversation("opencode", {}, body)))
    print(f"{'case':32s} {'min us':>8s} {'median us':>10s}")
    for label, fn in cases:
        lo, med = _time(fn, a.calls, a.rounds)
        print(f"{label:32s} {lo:8.2f} {med:10.2f}")


if __name__ == "__main__":
    main()
