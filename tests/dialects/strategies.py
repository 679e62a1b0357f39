"""Hypothesis strategies for chat assistant turns (the common ground every dialect translates through)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Round trips on a shared, busy machine: no per-example deadline."""

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
texts = st.text(min_size=1, max_size=40)
arguments = st.dictionaries(names, st.one_of(st.integers(-5, 5), texts, st.booleans()), max_size=3)


@st.composite
def assistant_turns(draw: Any) -> dict[str, Any]:
    """A chat assistant message: content and/or reasoning and/or tool calls (arguments as orjson writes them)."""
    msg: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.none(), texts))}
    if draw(st.booleans()):
        msg["reasoning_content"] = draw(texts)
    calls = draw(st.lists(st.tuples(names, arguments), max_size=3))
    if calls:
        msg["tool_calls"] = [
            {
                "id": f"call_{k}",
                "type": "function",
                "function": {"name": n, "arguments": orjson.dumps(a).decode()},
            }
            for k, (n, a) in enumerate(calls)
        ]
    return msg


def completion(msg: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": msg, "finish_reason": "tool_calls" if msg.get("tool_calls") else finish}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def chunks(msg: dict[str, Any], finish: str = "stop") -> list[dict[str, Any]]:
    """The message as a chat stream, split into small deltas."""
    out: list[dict[str, Any]] = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]

    def delta(d: dict[str, Any]) -> None:
        out.append({"choices": [{"index": 0, "delta": d}]})

    for piece in _pieces(msg.get("reasoning_content") or ""):
        delta({"reasoning_content": piece})
    for piece in _pieces(msg.get("content") or ""):
        delta({"content": piece})
    for k, tc in enumerate(msg.get("tool_calls") or ()):
        fn = tc["function"]
        delta(
            {
                "tool_calls": [
                    {
                        "index": k,
                        "id": tc["id"],
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": ""},
                    }
                ]
            }
        )
        for piece in _pieces(fn["arguments"]):
            delta({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
    out.append(
        {
            "choices": [
                {"index": 0, "delta": {}, "finish_reason": "tool_calls" if msg.get("tool_calls") else finish}
            ]
        }
    )
    out.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    return out


def _pieces(s: str) -> list[str]:
    return [s[i : i + 3] for i in range(0, len(s), 3)]


def normal(msg: dict[str, Any]) -> dict[str, Any]:
    """What survives any round trip: empty content is no content."""
    out = {"role": "assistant", "content": msg.get("content") or None}
    if msg.get("reasoning_content"):
        out["reasoning_content"] = msg["reasoning_content"]
    if msg.get("tool_calls"):
        out["tool_calls"] = msg["tool_calls"]
    return out
