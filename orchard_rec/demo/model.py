"""The demo model: a scripted, deterministic "LLM" that uses tools like an agent.

Policy, read off the chat messages:
- every ``run `COMMAND``` in a user message is a command the user wants run, in order;
- while tools are offered and fewer tool results exist than commands, call the shell-like
  tool (``exec_command``, ``Bash``, ``exec``, ``shell`` ... else the first) on the next one;
- otherwise answer in text, quoting the last tool result.
Generation is token-exact: ``Generation.ids`` are what the "model" produced, and the
text fields are decoded from them, as a real server does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from orchard_rec.demo.template import render, render_tool_call
from orchard_rec.demo.tokenizer import build_tokenizer

__all__ = ["Generation", "ScriptedModel"]

_RUN = re.compile(r"run `([^`]+)`")
_SHELL_NAMES = (
    "exec_command",
    "Bash",
    "bash",
    "exec",
    "shell",
    "run_shell_command",
    "run_command",
    "execute",
    "terminal",
    "Shell",
)


def _text(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return ""


@dataclass
class Section:
    kind: str  # "reasoning" | "content" | "tool_call" | "eos"
    ids: list[int]
    text: str = ""
    call: dict[str, Any] | None = None


@dataclass
class Generation:
    prompt_text: str
    prompt_ids: list[int]
    sections: list[Section] = field(default_factory=list)
    finish_reason: str = "stop"

    @property
    def ids(self) -> list[int]:
        return [i for s in self.sections for i in s.ids]

    @property
    def content(self) -> str | None:
        t = "".join(s.text for s in self.sections if s.kind == "content")
        return t or None

    @property
    def reasoning(self) -> str | None:
        t = "".join(s.text for s in self.sections if s.kind == "reasoning")
        return t or None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [s.call for s in self.sections if s.kind == "tool_call" and s.call is not None]


class ScriptedModel:
    def __init__(
        self,
        *,
        drift: bool = False,
        think: bool = False,
        preamble: bool = False,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.tok = tokenizer or build_tokenizer()
        self.drift = drift
        """Emit a non-canonical split of the generated text, so re-tokenizing it gives other ids."""
        self.think = think
        """Open each answer with a ``<think>`` block (returned as reasoning)."""
        self.preamble = preamble
        """Say a line of text (ending in a newline) before each tool call, as chatty models do."""
        self.eos = self._special("<|im_end|>")
        self._call_n = 0

    def _special(self, token: str) -> int:
        tid = self.tok.token_to_id(token)
        if tid is None:
            raise KeyError(f"the demo tokenizer has no {token!r}")
        return tid

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def _noncanonical(self, ids: list[int]) -> list[int]:
        """Split every third multi-character token into single-character tokens."""
        if not self.drift:
            return ids
        out: list[int] = []
        for k, i in enumerate(ids):
            piece = self.tok.id_to_token(i)
            if k % 3 == 1 and piece is not None and len(piece) > 1 and not piece.startswith("<"):
                sub = [self.tok.token_to_id(ch) for ch in piece]
                if all(s is not None for s in sub):
                    out.extend(sub)  # type: ignore[arg-type]
                    continue
            out.append(i)
        return out

    def decide(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        commands: list[str] = []
        for m in messages:
            if m.get("role") == "user":
                commands.extend(_RUN.findall(_text(m.get("content"))))
        results = [m for m in messages if m.get("role") == "tool"]
        if tools and len(results) < len(commands):
            tool = _pick_tool(tools)
            fn = tool.get("function") or tool
            text = "I'll run it now.\n" if self.preamble else ""
            return text, [(fn.get("name", "tool"), _arguments_for(fn, commands[len(results)]))]
        if results:
            out = _text(results[-1].get("content")).strip().splitlines()
            tail = out[-1] if out else ""
            return f"Done. The command printed: {tail[:80]}", []
        users = [m for m in messages if m.get("role") == "user"]
        last = _text(users[-1].get("content")) if users else ""
        return f"Hello! You said: {last[:60]}", []

    def generate(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
        prompt_ids: list[int] | None = None,
    ) -> Generation:
        """Answer the conversation; ``prompt_ids`` when the client sent ids (token-in), else rendered here."""
        prompt_text = render(messages, tools) if prompt_ids is None else self.decode(prompt_ids)
        gen = Generation(prompt_text, self.encode(prompt_text) if prompt_ids is None else list(prompt_ids))
        text, calls = self.decide(messages, tools)
        secs = gen.sections
        if self.think:
            reasoning = "The user wants a tool run." if calls else "I can answer now."
            secs.append(Section("reasoning", [self._special("<think>")]))
            secs.append(
                Section(
                    "reasoning",
                    self._noncanonical(self.encode("\n" + reasoning + "\n")),
                    "\n" + reasoning + "\n",
                )
            )
            secs.append(Section("reasoning", [self._special("</think>")] + self.encode("\n\n")))
        if text:
            secs.append(Section("content", self._noncanonical(self.encode(text)), text))
        for k, (name, args) in enumerate(calls):
            self._call_n += 1
            body = ("\n" if (k or text) else "") + render_tool_call(name, args)
            call = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
            secs.append(Section("tool_call", self._noncanonical(self.encode(body)), body, call))
        secs.append(Section("eos", [self.eos]))
        gen.finish_reason = "tool_calls" if calls else "stop"
        if max_tokens is not None and len(gen.ids) > max_tokens:
            _truncate(gen, max_tokens, self)
        return gen

    def logprob(self, position: int, token_id: int) -> float:
        return -round(((token_id * 7919 + position * 104729) % 1000) / 1000.0 + 0.001, 6)


def _truncate(gen: Generation, n: int, model: ScriptedModel) -> None:
    kept: list[Section] = []
    left = n
    for s in gen.sections:
        if left <= 0:
            break
        if s.kind == "eos":
            break
        ids = s.ids[:left]
        left -= len(ids)
        kind = "reasoning" if s.kind == "reasoning" else "content"
        text = model.decode(ids) if s.kind != "reasoning" or s.text else ""
        kept.append(Section(kind, ids, text))
    gen.sections = kept
    gen.finish_reason = "length"


def _pick_tool(tools: list[dict[str, Any]]) -> dict[str, Any]:
    by_name = {((t.get("function") or t).get("name")): t for t in tools}
    for n in _SHELL_NAMES:
        if n in by_name:
            return by_name[n]
    return tools[0]


def _arguments_for(fn: dict[str, Any], command: str) -> dict[str, Any]:
    params = fn.get("parameters") or fn.get("input_schema") or {}
    props = params.get("properties") or {}
    for key in ("cmd", "command", "commands", "script", "input"):
        if key in props:
            typ = (props[key] or {}).get("type")
            return {key: [command] if typ == "array" else command}
    required = params.get("required") or list(props)
    if required:
        return {required[0]: command}
    return {"command": command}
