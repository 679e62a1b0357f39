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


def _chat(b: _Builder, messages: list[Any]) -> None:
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role == "assistant":
            b.new_turn()
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                name = fn.get("name") or tc.get("custom", {}).get("name") or ""
                raw = fn.get("arguments") if "arguments" in fn else (tc.get("custom") or {}).get("input")
                b.call(name, tc.get("id"), raw)
        elif role == "tool":
            b.result(m.get("tool_call_id"), m.get("content"))


_MODEL_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call", "local_shell_call"})


def _responses(b: _Builder, items: list[Any]) -> None:
    """A turn is a run of consecutive model items (reasoning, assistant message, calls)."""
    in_turn = False
    for it in items:
        if not isinstance(it, dict):
            continue
        kind = it.get("type", "message" if "role" in it else None)
        model = kind in _MODEL_ITEMS or (kind == "message" and it.get("role") == "assistant")
        if model and not in_turn:
            b.new_turn()
        in_turn = model
        if kind == "local_shell_call":
            b.call("local_shell", it.get("call_id"), {"command": (it.get("action") or {}).get("command")})
        elif kind == "function_call":
            b.call(it.get("name") or "", it.get("call_id"), it.get("arguments"))
        elif kind == "custom_tool_call":
            b.call(it.get("name") or "", it.get("call_id"), it.get("input"))
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            b.result(it.get("call_id"), it.get("output"))


def _messages(b: _Builder, messages: list[Any]) -> None:
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        blocks = content if isinstance(content, list) else []
        if m.get("role") == "assistant":
            b.new_turn()
            for blk in blocks:
                if isinstance(blk, dict) and blk.get("type") in ("tool_use", "server_tool_use"):
                    b.call(blk.get("name") or "", blk.get("id"), blk.get("input"))
        elif m.get("role") == "user":
            for blk in blocks:
                if isinstance(blk, dict) and blk.get("type") == "tool_result":
                    b.result(blk.get("tool_use_id"), blk.get("content"), bool(blk.get("is_error")))


def steps_of_messages(messages: list[dict[str, Any]]) -> list[Step]:
    """Steps from a chat-format conversation (OpenAI ``tool_calls`` + ``tool`` messages)."""
    b = _Builder()
    _chat(b, messages)
    return b.steps


def parse_steps(dialect: str, request: Any, response: Any = None) -> list[Step]:
    """Steps of a conversation from a call in its own dialect: the request's history, then the
    answer's tool calls. Responses and Messages are read natively (a tool result's ``is_error``),
    any other dialect through its chat view (``dialects.chat_request_of``)."""
    b = _Builder()
    req = request if isinstance(request, dict) else {}
    resp = response if isinstance(response, dict) else {}
    if dialect == "responses":
        inp = req.get("input")
        _responses(b, inp if isinstance(inp, list) else [])
        _responses(b, resp.get("output") or [])
    elif dialect == "messages":
        _messages(b, req.get("messages") or [])
        if resp.get("content") is not None:
            _messages(b, [{"role": "assistant", "content": resp.get("content")}])
    else:  # any other dialect through its chat view (the registry's): chat itself, Gemini ...
        view = dialects.chat_request_of(dialect, req) if req else None
        if view is not None:
            _chat(b, view.get("messages") or [])
            answer = dialects.assistant_message(dialect, resp) if resp else None
            if answer is not None and (answer.get("content") or answer.get("tool_calls")):
                _chat(b, [answer])
    return b.steps
