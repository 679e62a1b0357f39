"""What a tool call means, per harness vocabulary: a shell command, a read, an edit.

Each harness names its tools differently (``../shared/HARNESSES.md``): Codex
``exec_command{cmd}`` and the ``apply_patch`` custom tool, Claude Code
``Bash{command}`` / ``Read`` / ``Edit`` / ``Write{file_path}``, OpenClaw ``exec`` /
``read`` / ``edit`` / ``write{path}`` / ``apply_patch``, pi and opencode ``bash`` /
``read`` / ``edit`` / ``write`` (``path`` or ``filePath``), hermes-agent ``terminal`` /
``read_file`` / ``patch`` / ``write_file``, Kimi CLI ``Shell`` / ``ReadFile`` /
``StrReplaceFile`` / ``WriteFile``, SWE-agent-style ``str_replace_editor``. A shell
command's reads and edits are read from the command itself (``cat``/``sed -n``/
``head`` read; ``sed -i``, ``> file``, ``tee`` edit).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

__all__ = ["classify", "patch_files", "shell_effects"]

SHELL_TOOLS = frozenset(
    {
        "exec_command",
        "shell",
        "local_shell",
        "bash",
        "Bash",
        "exec",
        "terminal",
        "Shell",
        "execute_bash",
        "run_shell_command",
        "execute_command",
        "run_command",
    }
)
READ_TOOLS = frozenset({"Read", "read", "read_file", "ReadFile", "view", "open_file", "view_file"})
EDIT_TOOLS = frozenset({"Edit", "MultiEdit", "edit", "StrReplaceFile", "patch", "str_replace", "edit_file"})
WRITE_TOOLS = frozenset({"Write", "write", "write_file", "WriteFile", "create_file"})
PATCH_TOOLS = frozenset({"apply_patch"})
PATH_KEYS = ("file_path", "filePath", "path", "filename", "file", "target_file")

_PATCH_FILE = re.compile(r"^\*\*\* (?:Update|Add|Delete) File: (.+?)\s*$", re.M)
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+?)\s*$", re.M)
_DIFF_GIT = re.compile(r"^diff --git a/(.+?) b/(.+?)\s*$", re.M)
_DIFF_PLUS = re.compile(r"^\+\+\+ (?:b/)?(.+?)\s*$", re.M)
_READERS = frozenset({"cat", "head", "tail", "less", "more", "nl", "view", "bat"})
_SEPARATORS = frozenset({"&&", "||", ";", "|", "&"})


def patch_files(text: str) -> list[str]:
    """Files a patch touches: Codex's ``*** Update File:`` envelope or a unified diff."""
    found = _PATCH_FILE.findall(text) + _PATCH_MOVE.findall(text)
    if not found:
        found = [b for _a, b in _DIFF_GIT.findall(text)]
    if not found:
        found = [p for p in _DIFF_PLUS.findall(text) if p != "/dev/null"]
    out: list[str] = []
    for p in found:
        if p not in out:
            out.append(p)
    return out


def _words(command: str) -> list[str]:
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split = True
        return list(lex)
    except ValueError:
        return command.split()


def shell_effects(command: str) -> tuple[list[str], list[str]]:
    """``(files read, files edited)`` by a shell command, as far as its words say."""
    reads: list[str] = []
    edits: list[str] = []
    words = _words(command)
    start = True
    i = 0
    while i < len(words):
        w = words[i]
        if w in _SEPARATORS:
            start = True
            i += 1
            continue
        if w in (">", ">>") and i + 1 < len(words):
            target = words[i + 1]
            if not target.startswith("&") and target != "/dev/null":
                edits.append(target)
            i += 2
            continue
        if start:
            start = False
            args = []
            j = i + 1
            while j < len(words) and words[j] not in _SEPARATORS and words[j] not in (">", ">>", "<"):
                args.append(words[j])
                j += 1
            files = [a for a in args if not a.startswith("-")]
            if w in _READERS:
                reads.extend(files)
            elif w == "sed":
                in_place = any(a == "-i" or a.startswith("-i") or a == "--in-place" for a in args)
                targets = files[1:] if files else []
                (edits if in_place else reads).extend(targets)
            elif w == "tee":
                edits.extend(files)
            elif w == "grep":
                reads.extend(files[1:])
        i += 1
    return reads, edits


def _path(args: dict[str, Any]) -> str | None:
    for k in PATH_KEYS:
        v = args.get(k)
        if isinstance(v, str) and v:
            return v
    return None


def _command(args: Any) -> str | None:
    if isinstance(args, str):
        return args
    if not isinstance(args, dict):
        return None
    for k in ("command", "cmd", "script", "code"):
        v = args.get(k)
        if isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            # Codex's older shell tool: ["bash", "-lc", "..."]
            if len(v) >= 3 and v[1] in ("-lc", "-c"):
                return v[2]
            return shlex.join(v)
    return None


def classify(name: str, args: Any) -> tuple[str, str | None, list[str], list[str]]:
    """``(kind, command, files read, files edited)`` for one tool call.

    ``kind`` is ``shell``, ``read``, ``edit``, ``write`` or ``other``.
    """
    if name in SHELL_TOOLS:
        command = _command(args)
        reads, edits = shell_effects(command) if command else ([], [])
        return "shell", command, reads, edits
    if name in PATCH_TOOLS:
        text = args if isinstance(args, str) else (_command(args) or str((args or {}).get("input", "")))
        if isinstance(args, dict) and isinstance(args.get("input"), str):
            text = args["input"]
        if isinstance(args, dict) and isinstance(args.get("patch"), str):
            text = args["patch"]
        return "edit", None, [], patch_files(text)
    if name == "str_replace_editor" and isinstance(args, dict):
        path = _path(args)
        sub = args.get("command")
        if sub == "view":
            return "read", None, [path] if path else [], []
        if sub == "create":
            return "write", None, [], [path] if path else []
        return "edit", None, [], [path] if path else []
    if not isinstance(args, dict):
        return "other", None, [], []
    path = _path(args)
    if name in READ_TOOLS:
        return "read", None, [path] if path else [], []
    if name in EDIT_TOOLS:
        if name == "patch" and not path and isinstance(args.get("patch"), str):
            return "edit", None, [], patch_files(args["patch"])
        return "edit", None, [], [path] if path else []
    if name in WRITE_TOOLS:
        return "write", None, [], [path] if path else []
    return "other", None, [], []
