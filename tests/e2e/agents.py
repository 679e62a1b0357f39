"""Minimal tool-using agent loops over each dialect, with the real SDKs (for the e2e tests).

Each resends its full history like a real harness, and alternates stream/non-stream
per call when ``stream`` is None. Tool output is a deterministic function of the command.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai

TURNS = ("Please run `echo one` and then run `echo two`", "Finally run `echo three`")
CHAT_TOOL = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}
RESP_TOOL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
ANTH_TOOL = {
    "name": "Bash",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
INJECTED = ('"token_ids": [', '"prompt_token_ids": [', '"logprob":')


def tool_output(cmd: str) -> str:
    return f"ran {cmd}: ok"


def _clean(obj: Any) -> None:
    dumped = json.dumps(obj if isinstance(obj, (dict, list)) else obj.model_dump(), default=str)
    for k in INJECTED:
        assert k not in dumped, f"client received injected field {k}"


def chat_agent(base_url: str, stream: bool | None = None, headers: dict[str, str] | None = None) -> int:
    client = openai.OpenAI(base_url=base_url, api_key="sk-x", max_retries=0, default_headers=headers)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    n = 0
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        while True:
            s = (n % 2 == 1) if stream is None else stream
            n += 1
            if s:
                content, calls = "", {}
                for ch in client.chat.completions.create(
                    model="m", messages=messages, tools=[CHAT_TOOL], stream=True
                ):  # type: ignore[arg-type]
                    _clean(ch)
                    if not ch.choices:
                        continue
                    d = ch.choices[0].delta
                    content += d.content or ""
                    for t in d.tool_calls or ():
                        c = calls.setdefault(
                            t.index,
                            {
                                "id": t.id,
                                "type": "function",
                                "function": {"name": t.function.name, "arguments": ""},
                            },
                        )  # type: ignore[union-attr]
                        c["function"]["arguments"] += t.function.arguments or ""  # type: ignore[union-attr]
                msg: dict[str, Any] = {"role": "assistant", "content": content or None}
                if calls:
                    msg["tool_calls"] = [calls[i] for i in sorted(calls)]
            else:
                r = client.chat.completions.create(model="m", messages=messages, tools=[CHAT_TOOL])  # type: ignore[arg-type]
                _clean(r)
                m = r.choices[0].message
                msg = {"role": "assistant", "content": m.content}
                if m.tool_calls:
                    msg["tool_calls"] = [
                        {
                            "id": t.id,
                            "type": "function",
                            "function": {"name": t.function.name, "arguments": t.function.arguments},
                        }
                        for t in m.tool_calls
                    ]  # type: ignore[union-attr]
            messages.append(msg)
            if not msg.get("tool_calls"):
                break
            for tc in msg["tool_calls"]:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": tc["id"],
                        "content": tool_output(json.loads(tc["function"]["arguments"])["cmd"]),
                    }
                )
    return n


def responses_agent(base_url: str, stream: bool | None = None, headers: dict[str, str] | None = None) -> int:
    client = openai.OpenAI(base_url=base_url, api_key="sk-x", max_retries=0, default_headers=headers)
    items: list[Any] = [{"type": "message", "role": "developer", "content": "You are an agent."}]
    n = 0
    for turn in TURNS:
        items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": turn}]})
        while True:
            s = (n % 2 == 1) if stream is None else stream
            n += 1
            if s:
                with client.responses.stream(model="m", input=items, tools=[RESP_TOOL]) as st:  # type: ignore[arg-type]
                    for ev in st:
                        _clean(ev)
                    r = st.get_final_response()
            else:
                r = client.responses.create(model="m", input=items, tools=[RESP_TOOL])  # type: ignore[arg-type]
            _clean(r)
            calls = [o for o in r.output if o.type == "function_call"]
            items += [o.model_dump(exclude_none=True) for o in r.output]
            if not calls:
                break
            for c in calls:
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": c.call_id,
                        "output": tool_output(json.loads(c.arguments)["cmd"]),
                    }
                )  # type: ignore[union-attr]
    return n


def messages_agent(base_url: str, stream: bool | None = None, headers: dict[str, str] | None = None) -> int:
    client = anthropic.Anthropic(
        base_url=base_url, api_key="sk-ant-x", max_retries=0, default_headers=headers
    )
    messages: list[dict[str, Any]] = []
    n = 0
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        while True:
            s = (n % 2 == 1) if stream is None else stream
            n += 1
            kw: dict[str, Any] = {
                "model": "m",
                "max_tokens": 512,
                "system": "You are an agent.",
                "messages": messages,
                "tools": [ANTH_TOOL],
            }
            if s:
                with client.messages.stream(**kw) as st:
                    for ev in st:
                        _clean(ev)
                    m = st.get_final_message()
            else:
                m = client.messages.create(**kw)
            _clean(m)
            messages.append(
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}
            )
            uses = [b for b in m.content if b.type == "tool_use"]
            if not uses:
                break
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": u.id,
                            "content": tool_output(u.input["command"]),
                        }
                        for u in uses
                    ],
                }
            )  # type: ignore[union-attr, index]
    return n


AGENTS = {"chat": chat_agent, "responses": responses_agent, "messages": messages_agent}
