from __future__ import annotations

import pytest

from orchard_rec.steps import parse_steps
from orchard_rec.steps.parse import exit_code_of
from orchard_rec.steps.tools import classify, patch_files, shell_effects

from .trajectories import ACTIONS, claude_code, codex, mini_swe_chat

DIALECTS = {"messages": claude_code, "responses": codex, "chat": mini_swe_chat}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_steps_equal_what_the_agent_did(dialect: str) -> None:
    request, response = DIALECTS[dialect]()
    steps = parse_steps(dialect, request, response)
    assert len(steps) == len(ACTIONS)
    for step, (kind, payload, out, code) in zip(steps, ACTIONS):
        assert step.failed == bool(code)
        if kind == "shell" and (dialect != "messages" or code):
            assert step.exit_code == code  # Claude Code says an exit code only when a command fails
        if kind == "shell":
            assert step.kind == "shell" and step.command == payload
            assert step.failed == bool(code)
            assert out.splitlines()[0] in (step.output or "")
        else:
            assert step.kind == "edit"
            assert [e.rsplit("repo/", 1)[-1] for e in step.edits] == [payload[0]]
    assert [s.turn for s in steps] == list(range(len(ACTIONS)))
    assert steps[1].reads == ["src/calc.py"]


def test_exit_code_conventions() -> None:
    assert exit_code_of("<returncode>2</returncode><output>boom</output>") == (2, False, "boom")
    assert exit_code_of("Chunk ID: a\nProcess exited with code 0\nOutput:\nx")[0] == 0
    assert exit_code_of('{"output": "hi", "exit_code": 3, "error": null}') == (3, False, "hi")
    assert exit_code_of("<system>Command executed successfully.</system>")[0] == 0
    assert exit_code_of("Exit code 127\nnot found")[0] == 127
    assert exit_code_of("plain text") == (None, False, "plain text")


def test_tool_vocabularies() -> None:
    assert classify("Read", {"file_path": "/r/a.py"})[:1] == ("read",)
    assert classify("read_file", {"path": "a.py"})[2] == ["a.py"]
    assert classify("WriteFile", {"path": "b.py", "content": "x"})[3] == ["b.py"]
    assert classify("terminal", {"command": "ls"})[1] == "ls"
    assert classify("exec_command", {"cmd": ["bash", "-lc", "cat x.py"]})[2] == ["x.py"]
    assert classify("str_replace_editor", {"command": "view", "path": "a.py"})[0] == "read"
    assert patch_files("*** Begin Patch\n*** Add File: n.py\n+x\n*** Update File: o.py\n*** End Patch") == [
        "n.py",
        "o.py",
    ]
    assert shell_effects("sed -i 's/a/b/' f.py && cat g.py | head -3 > out.txt") == (
        ["g.py"],
        ["f.py", "out.txt"],
    )
    assert shell_effects("echo hi 2>&1 >/dev/null") == ([], [])


def test_unanswered_last_call_and_results_without_calls() -> None:
    request = {"messages": [{"role": "tool", "tool_call_id": "gone", "content": "orphan"}]}
    response = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
                    ],
                }
            }
        ]
    }
    steps = parse_steps("chat", request, response)
    assert len(steps) == 1 and steps[0].command == "ls" and steps[0].output is None
