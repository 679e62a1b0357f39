"""The dialect registry: every caller's dialect knowledge comes from here (``orchard_rec.dialects``)."""

from __future__ import annotations

import pickle
from importlib.metadata import EntryPoint

import pytest

from orchard_rec import dialects
from orchard_rec.dialects import registry
from orchard_rec.dialects.base import Route, WireDialect
from orchard_rec.records import Dialect


def test_the_builtin_dialects_are_registered_in_order() -> None:
    names = [d.name.value for d in dialects.known()]
    assert names[:4] == ["chat", "completions", "responses", "messages"]
    assert all(isinstance(d, WireDialect) for d in dialects.known())
    assert dialects.get("chat") is dialects.get(Dialect.CHAT) and dialects.get("models") is None


def test_routes_and_the_conversation_keys_come_from_the_dialects() -> None:
    d, m = dialects.route("POST", "/v1/chat/completions") or (None, None)
    assert d is dialects.get("chat") and m is not None and m.start() == 0
    d, m = dialects.route("POST", "/openai/v1/responses?x=1") or (None, None)
    assert d is dialects.get("responses") and m is not None and m.start() == len("/openai")
    assert dialects.route("GET", "/v1/chat/completions") is None
    assert dialects.conversation_keys()[:2] == ("messages", "input")


def test_dialect_names_are_open_and_interned() -> None:
    assert Dialect("chat") is Dialect.CHAT and Dialect("somenew") is Dialect("somenew")
    assert pickle.loads(pickle.dumps(Dialect("somenew"))) is Dialect("somenew")
    assert Dialect("somenew").is_generation and not Dialect.MODELS.is_generation
    with pytest.raises(ValueError):
        Dialect("Not A Name")


def test_an_error_is_shaped_by_whoever_claims_the_caller() -> None:
    assert (
        dialects.caller("/v1/chat/completions", {"anthropic-version": "1"}, Dialect.CHAT).name
        is Dialect.MESSAGES
    )
    assert dialects.caller("/nowhere", {}).name is Dialect.CHAT


def test_an_entry_point_adds_a_dialect_and_a_broken_one_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    class _Echo(WireDialect):
        name = Dialect("echo")
        routes = (Route("POST", r"/v1/echo"),)
        conversation_keys = ("turns",)

    import sys
    import types

    mod = types.ModuleType("h36_echo_dialect")
    mod.DIALECT = _Echo()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "h36_echo_dialect", mod)
    eps = [
        EntryPoint("echo", "h36_echo_dialect:DIALECT", registry.ENTRY_POINT_GROUP),
        EntryPoint("broken", "no_such_module_h36:DIALECT", registry.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: eps if group == registry.ENTRY_POINT_GROUP else []
    )
    registry.registered.cache_clear()
    try:
        assert "echo" in registry.registered() and "broken" not in registry.registered()
        found = dialects.route("POST", "/v1/echo")
        assert found is not None and found[0].name == "echo"
    finally:
        monkeypatch.undo()
        registry.registered.cache_clear()
    assert "echo" not in registry.registered()
