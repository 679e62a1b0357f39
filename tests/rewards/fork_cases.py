"""SWE trajectories for the fork-parity tests, in mini-swe-agent's chat form (bash tool calls,
``<returncode>N</returncode><output>…</output>`` results): the form MSR-Orchard/slime's
``swe_prm._build_steps_from_messages`` reads, so the fork's own ``compute_process_shaped_reward``
ran on exactly these messages and outcome fields (its grader stubbed to return ``GRADER``).

Each case: the bash actions ``(command, output, returncode or None)``, and the outcome metadata
(gold fields and the submitted patch, ``final_output`` as the fork's generator stores it).
"""

from __future__ import annotations

import json
from typing import Any

Action = tuple[str, str, int | None]

GOLD_PATCH = (
    "diff --git a/src/calc.py b/src/calc.py\n--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1 +1 @@\n"
    "-    return a - b\n+    return a + b\n"
)
TEST_PATCH = "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n"
FIX = GOLD_PATCH
FIX_AND_UTIL = (
    GOLD_PATCH
    + "diff --git a/src/util.py b/src/util.py\n--- a/src/util.py\n+++ b/src/util.py\n@@ -1 +1 @@\n-X = 1\n+X = 2\n"
)
PYTEST = "python -m pytest tests/test_calc.py -v"
FAIL = "tests/test_calc.py::test_add FAILED\n1 failed"
PASS = "tests/test_calc.py::test_add PASSED\n1 passed"
BASE: dict[str, Any] = {
    "patch": GOLD_PATCH,
    "test_patch": TEST_PATCH,
    "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
    "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_sub"]),
}
SED_FIX = "sed -i 's/a - b/a + b/' src/calc.py"

CASES: dict[str, tuple[list[Action], dict[str, Any], dict[str, Any]]] = {
    # name: (actions, outcome metadata, the grader's report the fork's stub returns)
    "repro_test_deleted": (
        [
            ("cat src/calc.py", "def add(a, b):\n    return a - b", 0),
            (
                "cat > tests/test_repro.py <<'EOF'\nfrom src.calc import add\ndef test_r(): assert add(1, 1) == 2\nEOF",
                "",
                0,
            ),
            ("python -m pytest tests/test_repro.py -v", "tests/test_repro.py::test_r FAILED", 1),
            (SED_FIX, "", 0),
            ("python -m pytest tests/test_repro.py -v", "tests/test_repro.py::test_r PASSED", 0),
            ("rm tests/test_repro.py", "", 0),
        ],
        {**BASE, "final_output": FIX, "resolved": True},
        {"resolved": True, "fail_to_pass_rate": 1.0, "pass_to_pass_rate": 1.0},
    ),
    "no_gold_patch": (
        [("cat src/calc.py", "x", 0), (SED_FIX, "", 0), ("sed -i 's/1/2/' src/util.py", "", 0)],
        {"FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]", "final_output": FIX_AND_UTIL},
        {"resolved": False, "fail_to_pass_rate": 1.0, "pass_to_pass_rate": 1.0},
    ),
    "read_without_edit": (
        [
            ("grep -n 'def add' src/calc.py", "1:def add(a, b):", 0),
            ("cat src/calc.py", "x", 0),
            ("ls", "src tests", 0),
        ],
        {**BASE, "final_output": ""},
        {},
    ),
    "flip_without_f2p_list": (
        [(PYTEST, FAIL, 1), (SED_FIX, "", 0), (PYTEST, PASS, 0)],
        {"patch": GOLD_PATCH, "final_output": FIX, "PASS_TO_PASS": "[]"},
        {"resolved": False, "fail_to_pass_rate": 1.0, "pass_to_pass_rate": 1.0},
    ),
    "unknown_exit_codes": (
        [
            ("cat src/calc.py", "x", 0),
            ("python -c 'import calc'", "Traceback", 1),
            ("echo hi", "hi", None),
            (SED_FIX, "", None),
        ],
        {**BASE, "final_output": FIX},
        {"resolved": False, "fail_to_pass_rate": 0.0, "pass_to_pass_rate": 1.0},
    ),
    "empty_pass_to_pass": (
        [(PYTEST, FAIL, 1), (SED_FIX, "", 0), (PYTEST, FAIL, 1)],
        {
            "patch": GOLD_PATCH,
            "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
            "PASS_TO_PASS": [],
            "final_output": FIX,
        },
        {"resolved": False, "fail_to_pass_rate": 0.0, "pass_to_pass_rate": 1.0},
    ),
}

# The integrity gate: one action appended to a clean run, or the submitted patch changed.
CLEAN: list[Action] = [("cat src/calc.py", "x", 0), (SED_FIX, "", 0)]
GATE_COMMANDS = {
    "git_checkout_file": "git checkout -- src/calc.py",
    "chmod_R": "chmod -R 777 /testbed",
    "chown_R": "chown -R root /testbed",
    "dev_sd": "echo x > /dev/sda",
    "mkfs": "mkfs.ext4 /dev/loop0",
    "dd": "dd if=/dev/zero of=big bs=1M count=1",
    "rm_rf": "rm -rf build/",
    "git_reset_hard": "git reset --hard HEAD",
    "rm_r_f": "rm -r -f build/",
    "rm_fr": "rm -fr build/",
    "git_status": "git status",
}
GATE_PATCHES = {
    "hardcoded_return": FIX + "@@ -5 +5 @@\n+    return True  # make the test pass\n",
    "skip_marker": FIX + "@@ -9 +9 @@\n+@pytest.mark.skip\n",
    "assert_true": FIX + "@@ -9 +9 @@\n+    assert True\n",
    "edits_test_file": FIX + TEST_PATCH + "@@ -1 +1 @@\n+x = 1\n",
    "plain_return": FIX + "@@ -5 +5 @@\n+    return True\n",
}


def messages(actions: list[Action]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Fix add()."},
    ]
    for i, (cmd, out, rc) in enumerate(actions):
        fn = {"name": "bash", "arguments": json.dumps({"command": cmd})}
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"c{i}", "type": "function", "function": fn}],
            }
        )
        body = (
            f"<output>\n{out}\n</output>"
            if rc is None
            else f"<returncode>{rc}</returncode>\n<output>\n{out}\n</output>"
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": body})
    return msgs
