"""Parse a session's last call (request history + final answer) into steps, per dialect."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from orchard_rec import dialects
from orchard_rec.steps.tools import classify

__all__ = ["Step", "exit_code_of", "parse_steps", "steps_of_messages"]


@dataclass
class Step:
    """One tool call and the result that answered it."""

    index: int
    turn: int
    """Which assistant turn (0-based, in conversation order) made the call."""
    tool: str
    call_id: str | None
    arguments: Any
    kind: str
    """shell | read | edit | write | other"""
    command: str | None = None
    reads: list[str] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)
    output: str | None = None
    """The tool result's text; None while unanswered (the run ended on this call)."""
    exit_code: int | None = None
    error: bool = False
    """The harness marked the result an error (Claude Code ``is_error``, hermes ``error``)."""

    @property
    def failed(self) -> bool:
        return self.error or (self.exit_code is not None and self.exit_code != 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["failed"] = self.failed
        return d


_CODEX_EXIT = re.compile(r"Process exited with code (-?\d+)")
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_OUTPUT = re.compile(r"<output>\s*(.*?)\s*</output>", re.S)
_GENERIC_EXIT = re.compile(r"(?i)\bexit(?:ed with)?[ _]code[:= ]+(-?\d+)")
_KIMI_OK = "<system>Command executed successfully.</system>"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict):
                t = p.get("text")
                if t is None and p.get("type") in ("input_text", "output_text"):
                    t = p.get("text")
                if isinstance(t, str):
                    parts.append(t)
        return "\n".join(parts)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return orjson.dumps(content).decode()


def exit_code_of(text: str) -> tuple[int | None, bool, str]:
    """``(exit code, error flag, output)`` from a tool result's text, by the harnesses' conventions."""
    stripped = text.strip()
    if stripped.startswith("{") and '"exit_code"' in stripped:
        try:
            obj = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and "exit_code" in obj:
            code = obj.get("exit_code")
            out = obj.get("output")
            return (
                code if isinstance(code, int) else None,
                bool(obj.get("error")),
                out if isinstance(out, str) else text,
            )
    m = _RETURNCODE.search(text)
    if m:
        out = _OUTPUT.search(text)
        return int(m.group(1)), False, out.group(1) if out else text
    m = _CODEX_EXIT.search(text)
    if m:
        return int(m.group(1)), False, text
    if _KIMI_OK in text:
        return 0, False, text
    m = _GENERIC_EXIT.search(text)
    if m:
        return int(m.group(1)), False, text
    return None, False, text


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return raw


class _Builder:
    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.by_id: dict[str, Step] = {}
        self.turn = -1

    def new_turn(self) -> None:
        self.turn += 1

    def call(self, name: str, call_id: str | None, raw_args: Any) -> None:
        args = _args(raw_args)
        kind, command, reads, edits = classify(name, args)
        step = Step(len(self.steps), max(self.turn, 0), name, call_id, args, kind, command, reads, edits)
        self.steps.append(step)
        if call_id:
            self.by_id[call_id] = step

    def result(self, call_id: str | None, content: Any, is_error: bool = False) -> None:
        step = self.by_id.get(call_id or "")
        if step is None:  # a result without its call (history cut): find the oldest unanswered
            step = next((s for s in self.steps if s.output is None), None)
            if step is None:
                return
        text = _text(content)
        code, err, out = exit_code_of(text)
        step.output, step.exit_code, step.error = out, code, err or is_error


def _turns(b: _Builder, turns: list[dialects.Turn]) -> None:
    """Steps from neutral turns (``dialects.view``): each assistant turn is a new turn, its
    ``tool_call`` blocks the calls; ``tool_result`` blocks (any role) answer them."""
    for t in turns:
        if t.get("role") == "assistant":
            b.new_turn()
        for blk in t.get("blocks") or ():
            kind = blk.get("kind")
            if kind == "tool_call":
                b.call(blk.get("name") or "", blk.get("id"), blk.get("arguments"))
            elif kind == "tool_result":
                b.result(blk.get("id"), blk.get("content"), bool(blk.get("error")))


def steps_of_messages(messages: list[dict[str, Any]]) -> list[Step]:
    """Steps from a chat-format conversation (OpenAI ``tool_calls`` + ``tool`` messages)."""
    b = _Builder()
    _turns(b, dialects.chat_turns({"messages": messages}) or [])
    return b.steps


def parse_steps(dialect: str, request: Any, response: Any = None) -> list[Step]:
    """Steps of a conversation from a call in its own dialect: the request's history, then the
    answer's tool calls, both as the dialect registry reads them (``dialects.turns_of`` /
    ``answer_turn_of``): a dialect added by an entry point is parsed with no edit here."""
    b = _Builder()
    _turns(b, dialects.turns_of(dialect, request) or [])
    answer = dialects.answer_turn_of(dialect, response)
    if answer is not None:
        _turns(b, [answer])
    return b.steps
