"""The neutral view (``dialects.view``): what the viewer and the step parser read, from the registry.

A dialect registered at runtime through the entry-point group shows in the viewer
(``ui.chat``) and is parsed into steps (``steps.parse_steps``) with no edit in either: both ask
the registry (``dialects.turns_of`` / ``answer_turn_of``), never branch on a dialect's name.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from typing import Any

import orjson
import pytest

from orchard_rec import dialects
from orchard_rec.dialects import registry
from orchard_rec.dialects.base import Route, WireDialect
from orchard_rec.records import Dialect
from orchard_rec.steps import parse_steps
from orchard_rec.ui.chat import conversation, response_turn


def _call(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": run["id"],
        "type": "function",
        "function": {"name": run["tool"], "arguments": orjson.dumps(run["args"]).decode()},
    }


class _Toy(WireDialect):
    """A made-up wire: ``{"system", "log": [{"who": "human" | "bot" | "tool", "text", "run"}]}``,
    answered by ``{"reply": {"text", "run"}}``. It knows only its chat view, as a plug-in would."""

    name = Dialect("toy")
    routes = (Route("POST", r"/v1/toy"),)
    conversation_keys = ("log",)
    chat_view = True

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        msgs: list[dict[str, Any]] = (
            [{"role": "system", "content": body["system"]}] if body.get("system") else []
        )
        for e in body["log"]:
            if e["who"] == "human":
                msgs.append({"role": "user", "content": e["text"]})
            elif e["who"] == "bot":
                m: dict[str, Any] = {"role": "assistant", "content": e.get("text") or None}
                if e.get("run"):
                    m["tool_calls"] = [_call(e["run"])]
                msgs.append(m)
            else:
                msgs.append({"role": "tool", "tool_call_id": e["id"], "content": e["text"]})
        return {"model": body.get("model"), "messages": msgs}

    def assistant_message(self, response: Any) -> dict[str, Any] | None:
        reply = response.get("reply") if isinstance(response, dict) else None
        if not isinstance(reply, dict):
            return None
        msg: dict[str, Any] = {"role": "assistant", "content": reply.get("text")}
        if reply.get("run"):
            msg["tool_calls"] = [_call(reply["run"])]
        return msg


class _Shell(WireDialect):
    """A made-up wire read natively (no chat view): ``{"steps": [{"cmd", "out", "failed"}]}``; its
    own ``turns`` keep a failure flag chat could not carry."""

    name = Dialect("shellwire")
    routes = (Route("POST", r"/v1/shellwire"),)

    def turns(self, request: dict[str, Any]) -> list[dict[str, Any]] | None:
        out = []
        for i, s in enumerate(request["steps"]):
            call = {"kind": "tool_call", "name": "bash", "id": f"s{i}", "arguments": {"command": s["cmd"]}}
            out.append({"role": "assistant", "blocks": [call]})
            result = {"kind": "tool_result", "id": f"s{i}", "content": s["out"], "error": s["failed"]}
            out.append({"role": "tool", "blocks": [result]})
        return out


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``toy`` and ``shellwire`` registered through the entry-point group, as an installed package would."""
    mod = types.ModuleType("h36r_view_dialects")
    mod.TOY = _Toy()  # type: ignore[attr-defined]
    mod.SHELL = _Shell()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "h36r_view_dialects", mod)
    eps = [
        EntryPoint("toy", "h36r_view_dialects:TOY", registry.ENTRY_POINT_GROUP),
        EntryPoint("shellwire", "h36r_view_dialects:SHELL", registry.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: eps if group == registry.ENTRY_POINT_GROUP else []
    )
    registry.registered.cache_clear()
    try:
        yield
    finally:
        monkeypatch.undo()
        registry.registered.cache_clear()
    assert "toy" not in registry.registered()


TOY_REQUEST = {
    "model": "m",
    "system": "be terse",
    "log": [
        {"who": "human", "text": "list and show"},
        {"who": "bot", "text": "", "run": {"id": "r1", "tool": "bash", "args": {"command": "ls"}}},
        {"who": "tool", "id": "r1", "text": "a.txt\nProcess exited with code 0"},
    ],
}
TOY_RESPONSE = {
    "reply": {"text": "now cat", "run": {"id": "r2", "tool": "bash", "args": {"command": "cat a.txt"}}}
}


def test_a_plugin_dialect_shows_in_the_viewer(plugins: None) -> None:
    turns = conversation(TOY_REQUEST, "toy")
    assert [(t["role"], [b["kind"] for b in t["blocks"]]) for t in turns] == [
        ("system", ["text"]),
        ("user", ["text"]),
        ("assistant", ["tool_call"]),
        ("tool", ["tool_result"]),
    ]
    assert turns[2]["blocks"][0]["name"] == "bash" and '"command": "ls"' in turns[2]["blocks"][0]["text"]
    assert turns[3]["blocks"][0]["text"].startswith("a.txt")
    answer = response_turn(TOY_RESPONSE, "toy")
    assert answer is not None and [b["kind"] for b in answer["blocks"]] == ["text", "tool_call"]
    assert response_turn({"error": "no"}, "toy") is None


def test_a_plugin_dialect_is_parsed_into_steps(plugins: None) -> None:
    steps = parse_steps("toy", TOY_REQUEST, TOY_RESPONSE)
    assert [(s.command, s.turn, s.exit_code, s.output is None) for s in steps] == [
        ("ls", 0, 0, False),
        ("cat a.txt", 1, None, True),  # the answer's call, not answered yet
    ]


def test_a_native_reader_keeps_what_chat_cannot_say(plugins: None) -> None:
    req = {
        "steps": [{"cmd": "make", "out": "boom", "failed": True}, {"cmd": "ls", "out": "ok", "failed": False}]
    }
    steps = parse_steps("shellwire", req)
    assert [(s.command, s.failed, s.turn) for s in steps] == [("make", True, 0), ("ls", False, 1)]
    assert [t["role"] for t in conversation(req, "shellwire")] == ["assistant", "tool", "assistant", "tool"]
    assert response_turn({"x": 1}, "shellwire") is None  # no chat view, no answer reader: nothing to show


def test_an_unknown_or_unreadable_body_is_shown_as_json_not_dropped(plugins: None) -> None:
    assert conversation({"log": "not a list"}, "toy")[0]["blocks"][0]["text"].startswith("{")
    assert conversation({"a": 1}, "nosuchdialect") == [
        {"role": "?", "blocks": [{"kind": "text", "text": '{\n  "a": 1\n}'}]}
    ]
    assert parse_steps("nosuchdialect", {"a": 1}, {"b": 2}) == []


def test_the_builtin_dialects_read_their_own_shapes() -> None:
    """What chat cannot carry survives the native readers: Responses' shell and custom tool calls,
    Anthropic's ``is_error``, a chat ``custom`` tool call."""
    items = [
        {"type": "local_shell_call", "call_id": "c1", "action": {"command": ["ls", "-a"]}},
        {"type": "local_shell_call_output", "call_id": "c1", "output": "x"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
    ]
    turns = dialects.turns_of("responses", {"input": items}) or []
    assert [b["kind"] for t in turns for b in t["blocks"]] == ["tool_call", "tool_result"] * 2
    assert turns[0]["blocks"][0]["name"] == "local_shell"
    msgs = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": True}]},
        ]
    }
    result = (dialects.turns_of(Dialect.MESSAGES, msgs) or [])[1]["blocks"][0]
    assert result["kind"] == "tool_result" and result["error"] is True
    chat = {
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "k", "custom": {"name": "p", "input": "i"}}]}
        ]
    }
    call = (dialects.turns_of("chat", chat) or [])[0]["blocks"][0]
    assert (call["name"], call["arguments"]) == ("p", "i")
