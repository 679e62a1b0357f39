"""A scripted tool-using agent, driven through the proxy with the real ``openai`` SDK.

It behaves like a minimal coding harness: a system prompt, one shell tool
(``exec_command``) that really runs in a private work folder, full history resent on
every call, and several user turns. Used by ``orchard-rec demo`` and the tests.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import openai

__all__ = ["SHELL_TOOL", "run_agent"]

SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "description": "Run a shell command in the work folder and return its output.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}

DEFAULT_TURNS = (
    "Create a marker file: run `echo orchard > marker.txt` then run `ls`",
    "Now show me its content: run `cat marker.txt`",
)


def _shell(cmd: str, cwd: Path) -> str:
    p = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=30)
    return (p.stdout + p.stderr).strip() or f"(exit {p.returncode})"


def run_agent(
    base_url: str,
    workdir: Path,
    *,
    turns: tuple[str, ...] = DEFAULT_TURNS,
    stream: bool | None = None,
    model: str = "orchard-demo",
    max_steps: int = 8,
    api_key: str = "sk-demo",
) -> list[dict[str, Any]]:
    """Run the agent; returns the final message history. ``stream=None`` alternates."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}]
    n = 0
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        for _ in range(max_steps):
            use_stream = (n % 2 == 1) if stream is None else stream
            n += 1
            msg = _call(client, model, messages, use_stream)
            messages.append(msg)
            if not msg.get("tool_calls"):
                break
            for tc in msg["tool_calls"]:
                args = json.loads(tc["function"]["arguments"] or "{}")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tc["id"],
                        "content": _shell(args.get("cmd", ""), workdir),
                    }
                )
    return messages


def _call(
    client: openai.OpenAI,
    model: str,
    messages: list[dict[str, Any]],
    stream: bool,
    tool: dict[str, Any] = SHELL_TOOL,
) -> dict[str, Any]:
    """One chat call, streamed or not; the assistant message as the client keeps it in its history."""
    completions: Any = client.chat.completions  # plain dicts in, SDK objects out
    if not stream:
        r = completions.create(model=model, messages=messages, tools=[tool])
        m = r.choices[0].message
        out: dict[str, Any] = {"role": "assistant", "content": m.content}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "id": t.id,
                    "type": "function",
                    "function": {"name": t.function.name, "arguments": t.function.arguments},
                }
                for t in m.tool_calls
            ]
        return out
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    for ch in completions.create(model=model, messages=messages, tools=[tool], stream=True):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or ():
            c = calls.setdefault(
                t.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if t.id:
                c["id"] = t.id
            if t.function and t.function.name:
                c["function"]["name"] += t.function.name
            if t.function and t.function.arguments:
                c["function"]["arguments"] += t.function.arguments
    out = {"role": "assistant", "content": content or None}
    if calls:
        out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out
