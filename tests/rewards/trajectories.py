"""One SWE-style trajectory written in three harness dialects, and the gold fields it is graded on.

The agent greps, reads src/calc.py, runs the failing test, edits src/calc.py and src/util.py,
runs the test twice more (passing). Each harness spells the same actions its own way
(../shared/HARNESSES.md): Claude Code (Messages: Bash, Edit; ``is_error`` and
"Exit code N"), Codex (Responses: exec_command, the apply_patch custom tool,
"Process exited with code N"), and a chat agent with the mini-swe-agent result
convention (``<returncode>N</returncode><output>…</output>``).
"""

from __future__ import annotations

import json
from typing import Any

PYTEST = "python -m pytest tests/test_calc.py -v"
# (kind, payload, output, exit code)
ACTIONS: list[tuple[str, Any, str, int]] = [
    ("shell", 'grep -rn "def add" src', "src/calc.py:1:def add(a, b):", 0),
    ("shell", "cat src/calc.py", "def add(a, b):\n    return a - b\n", 0),
    ("shell", PYTEST, "tests/test_calc.py::test_add FAILED\n1 failed", 1),
    ("edit", ("src/calc.py", "return a - b", "return a + b"), "ok", 0),
    ("edit", ("src/util.py", "X = 1", "X = 2"), "ok", 0),
    ("shell", PYTEST, "tests/test_calc.py::test_add PASSED\n1 passed", 0),
    ("shell", PYTEST, "tests/test_calc.py::test_add PASSED\n1 passed", 0),
]
GOLD: dict[str, Any] = {
    "patch": (
        "diff --git a/src/calc.py b/src/calc.py\n--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1 +1 @@\n"
        "diff --git a/src/other.py b/src/other.py\n--- a/src/other.py\n+++ b/src/other.py\n@@ -1 +1 @@\n"
    ),
    "test_patch": "diff --git a/tests/test_calc.py b/tests/test_calc.py\n",
    "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
    "PASS_TO_PASS": ["tests/test_calc.py::test_sub"],
    "resolved": False,
}
# By hand: f2p 1 (test_add last seen passing), p2p 1 (test_sub never seen failing),
# localization 1/2, anchored flip 1 (test_add, in FAIL_TO_PASS), read before edit 1,
# extra files 1/2 (util.py), no progress 2/5 (two repeats of 5 commands), error rate 1/7.
EXPECTED = {
    "resolved": 0.0,
    "f2p": 1.0,
    "localization": 0.5,
    "anchored_flip": 1.0,
    "read_before_edit": 1.0,
    "p2p": 1.0,
    "extra_files": 0.5,
    "no_progress": 0.4,
    "error_rate": 1 / 7,
    "integrity_gate": 1.0,
}
EXPECTED_TOTAL = 10 * (0.5 + 0.2 + 0.3 + 0.1 + 0.2 - 0.025 - 0.02 - 0.03 / 7)


def claude_code(actions: list[tuple[str, Any, str, int]] = ACTIONS) -> tuple[dict[str, Any], dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Fix add()."}]}]
    for i, (kind, payload, out, code) in enumerate(actions):
        tid = f"toolu_{i:02d}"
        if kind == "shell":
            use = {"type": "tool_use", "id": tid, "name": "Bash", "input": {"command": payload}}
        else:
            path, old, new = payload
            use = {
                "type": "tool_use",
                "id": tid,
                "name": "Edit",
                "input": {"file_path": "/repo/" + path, "old_string": old, "new_string": new},
            }
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": "Next."}, use]})
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tid, "content": out}
        if code:
            result = {**result, "content": f"Exit code {code}\n{out}", "is_error": True}
        msgs.append({"role": "user", "content": [result]})
    request = {"model": "m", "max_tokens": 100, "messages": msgs}
    response = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "Done."}]}
    return request, response


def codex(actions: list[tuple[str, Any, str, int]] = ACTIONS) -> tuple[dict[str, Any], dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "base"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix add()."}]},
    ]
    for i, (kind, payload, out, code) in enumerate(actions):
        cid = f"call_{i}"
        items.append({"type": "reasoning", "summary": []})
        if kind == "shell":
            items.append(
                {
                    "type": "function_call",
                    "name": "exec_command",
                    "call_id": cid,
                    "arguments": json.dumps({"cmd": payload}),
                }
            )
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": cid,
                    "output": f"Chunk ID: x\nWall time: 0.1\nProcess exited with code {code}\nOutput:\n{out}",
                }
            )
        else:
            path, old, new = payload
            patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"
            items.append({"type": "custom_tool_call", "name": "apply_patch", "call_id": cid, "input": patch})
            items.append({"type": "custom_tool_call_output", "call_id": cid, "output": "Success."})
    request = {"model": "m", "input": items, "stream": True}
    response = {
        "object": "response",
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
        ],
    }
    return request, response


def mini_swe_chat(
    actions: list[tuple[str, Any, str, int]] = ACTIONS,
) -> tuple[dict[str, Any], dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Fix add()."},
    ]
    for i, (kind, payload, out, code) in enumerate(actions):
        cid = f"call{i}"
        if kind == "shell":
            fn = {"name": "bash", "arguments": json.dumps({"command": payload})}
        else:
            path, old, new = payload
            fn = {"name": "edit", "arguments": json.dumps({"path": path, "oldText": old, "newText": new})}
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": cid, "type": "function", "function": fn}],
            }
        )
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": cid,
                "content": f"<returncode>{code}</returncode><output>{out}</output>",
            }
        )
    request = {"model": "m", "messages": msgs}
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."}}]}
    return request, response
