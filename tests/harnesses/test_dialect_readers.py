"""What a request body says, as the harness plug-ins read it: asked of the dialect registry (issue 36).

The harness helpers (``instructions_of``, ``first_user_text``, ``tool_names``: the names plug-ins
import from ``harnesses.base``) ask the call's dialect, or each registered dialect whose shape the
body has; so a Gemini body, and the body of a dialect registered at runtime through the
entry-point group, are recognised with no edit in ``harnesses/``. The built-in dialects read
their own shape (harness identification runs on every call) and answer as their neutral view
(``WireDialect.turns``) does.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from orchard_rec import dialects, harnesses
from orchard_rec.dialects import registry
from orchard_rec.dialects.base import Route, WireDialect
from orchard_rec.harnesses import HERMES, OPENCODE, identify, side_conversation
from orchard_rec.harnesses.base import Harness, first_user_text, instructions_of, tool_names
from orchard_rec.records import Dialect

RUNTIME = (
    "hi\n\nRuntime: agent=main | session=agent:main:explicit:0a1b2c3d-0000 | sessionId=0a1b2c3d-0000 | host=x"
)
TITLE = "You are a title generator. You output ONLY a thread title."
HERMES_NAMES = ("browser_click", "delegate_task", "session_search", "skill_view", "terminal", "todo")

# Gemini CLI's shape (shared/HARNESSES.md): ``systemInstruction``, ``contents`` with user/model
# roles and parts, ``tools[].functionDeclarations``.
GEMINI = {
    "systemInstruction": {"role": "user", "parts": [{"text": TITLE[:24]}, {"text": TITLE[24:]}]},
    "contents": [
        {"role": "user", "parts": [{"text": "<session_context>"}]},
        {"role": "model", "parts": [{"text": "ok"}]},
        {"role": "user", "parts": [{"text": RUNTIME}]},
    ],
    "tools": [{"functionDeclarations": [{"name": n, "parameters": {}} for n in HERMES_NAMES]}],
    "generationConfig": {"temperature": 0},
}


def test_a_gemini_body_is_read_through_the_harness_helpers() -> None:
    for dialect in (None, "gemini"):
        assert instructions_of(GEMINI, dialect) == TITLE
        assert first_user_text(GEMINI, dialect) == "<session_context>"
        assert tool_names(GEMINI, dialect) == list(HERMES_NAMES)
    assert instructions_of({"contents": GEMINI["contents"]}) is None
    # a content without a role is the user's (as Google's API reads it)
    assert (
        first_user_text({"contents": [{"parts": [{"text": "a"}, {"inlineData": {}}, {"text": "b"}]}]}) == "ab"
    )


def test_harnesses_recognise_gemini_bodies() -> None:
    sdk = {"User-Agent": "google-genai-sdk/1.30.0 gl-node/v24"}
    assert HERMES.recognises({}, GEMINI)  # its tool set, offered as function declarations
    assert side_conversation("opencode", {}, GEMINI) == "title"  # its side prompt, as a system instruction
    assert OPENCODE.side_conversation({}, {**GEMINI, "systemInstruction": {"parts": [{"text": "x"}]}}) is None
    only_runtime = {"contents": [{"role": "user", "parts": [{"text": RUNTIME}]}]}
    assert identify(sdk, only_runtime) == ("openclaw", "0a1b2c3d-0000")  # its first user message


def test_the_builtin_dialects_answer_as_their_neutral_view() -> None:
    """Each built-in reader (its own shape, early exit) agrees with ``WireDialect``'s default, read
    from the dialect's turns; a wrong shape reads as None, never an error."""
    bodies = {
        "chat": {
            "messages": [
                {
                    "role": "developer",
                    "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
                },
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "q"}, {"type": "image_url", "image_url": "u"}],
                },
            ],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        "responses": {
            "instructions": "be brief",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}],
            "tools": [{"type": "function", "name": "f"}],
        },
        "messages": {
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}],
            "tools": [{"name": "f", "input_schema": {}}],
        },
        "gemini": {
            "systemInstruction": {"parts": [{"text": "be brief"}]},
            "contents": [{"role": "user", "parts": [{"text": "q"}]}],
            "tools": [{"functionDeclarations": [{"name": "f"}]}],
        },
    }
    for name, body in bodies.items():
        d = dialects.get(name)
        assert d is not None
        assert d.instructions(body) == WireDialect.instructions(d, body) == "be brief", name
        assert d.first_user_text(body) == WireDialect.first_user_text(d, body) == "q", name
        assert d.tool_names(body) == WireDialect.tool_names(d, body) == ["f"], name
        for bad in ({}, {d.conversation_keys[0]: 7, "tools": 3}):
            assert (instructions_of(bad, name), first_user_text(bad, name), tool_names(bad, name)) == (
                None,
                None,
                [],
            )
    assert first_user_text({"input": "just this"}) == "just this"  # a Responses string input
    # Claude Code's system text inside ``messages`` (no ``system``): read by the shape's second dialect
    assert (
        instructions_of({"messages": [{"role": "system", "content": "cc"}, {"role": "user", "content": "q"}]})
        == "cc"
    )
    assert instructions_of({"messages": [{"role": "user", "content": "q"}], "system": "top"}) == "top"
    assert (instructions_of("not a body"), first_user_text(None), tool_names([])) == (None, None, None)


class _Log(WireDialect):
    """A made-up wire a plug-in package adds: ``{"preamble", "log": [{"who", "text"}], "kit": [names]}``.
    It knows only its chat view, as a plug-in would."""

    name = Dialect("h36h-log")
    routes = (Route("POST", r"/v1/log"),)
    conversation_keys = ("log",)
    chat_view = True

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        msgs = [{"role": "system", "content": body["preamble"]}] if body.get("preamble") else []
        msgs += [
            {"role": {"human": "user"}.get(e["who"], "assistant"), "content": e["text"]} for e in body["log"]
        ]
        tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in body.get("kit", ())]
        return {"messages": msgs, "tools": tools}


class _ThirdParty(Harness):
    """A harness plug-in outside orchard-rec that reads bodies with the helpers' old signatures."""

    def recognises(self, headers: Mapping[str, str], body: Any = None) -> bool:
        text = first_user_text(body)
        return text is not None and text.startswith("[3p]")

    def session_of(self, headers: Mapping[str, str], body: Any = None) -> str | None:
        return (instructions_of(body) or "")[:8] or None


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``h36h-log`` registered through the entry-point group, and a third-party harness listed first."""
    mod = types.ModuleType("h36h_log_dialect")
    mod.DIALECT = _Log()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "h36h_log_dialect", mod)
    eps = [EntryPoint("h36h-log", "h36h_log_dialect:DIALECT", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: eps if group == registry.ENTRY_POINT_GROUP else []
    )
    third = _ThirdParty("third", (), "h36h-log", ())
    monkeypatch.setattr(harnesses, "HARNESSES", (third, *harnesses.HARNESSES))
    registry.registered.cache_clear()
    try:
        yield
    finally:
        monkeypatch.undo()
        registry.registered.cache_clear()
    assert "h36h-log" not in registry.registered()


LOG = {
    "preamble": TITLE,
    "log": [{"who": "human", "text": RUNTIME}, {"who": "bot", "text": "ok"}],
    "kit": list(HERMES_NAMES),
}


def test_a_plugin_dialect_is_read_with_no_edit_in_harnesses(plugins: None) -> None:
    for dialect in (None, "h36h-log"):  # by its shape, or by the call's dialect
        assert instructions_of(LOG, dialect) == TITLE
        assert first_user_text(LOG, dialect) == RUNTIME
        assert tool_names(LOG, dialect) == list(HERMES_NAMES)
    assert identify({"User-Agent": "OpenAI/Python 2.24.0"}, {"log": LOG["log"]}) == (
        "openclaw",
        "0a1b2c3d-0000",
    )
    assert identify({}, {"log": [], "kit": LOG["kit"]})[0] == "hermes"  # its tool set
    assert side_conversation("opencode", {}, LOG) == "title"
    assert first_user_text({"log": 5}) is None  # its reader raised: nothing recognised, no error


def test_a_third_party_harness_reads_every_dialect(plugins: None) -> None:
    log = {"preamble": "plug-in!", "log": [{"who": "human", "text": "[3p] go"}]}
    gemini = {
        "systemInstruction": {"parts": [{"text": "gemini!"}]},
        "contents": [{"parts": [{"text": "[3p] go"}]}],
    }
    chat = {"messages": [{"role": "system", "content": "chat!"}, {"role": "user", "content": "[3p] go"}]}
    assert [identify({}, b) for b in (log, gemini, chat)] == [
        ("third", "plug-in!"),
        ("third", "gemini!"),
        ("third", "chat!"),
    ]
