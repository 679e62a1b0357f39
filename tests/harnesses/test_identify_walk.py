"""``identify`` asks only the plug-ins that read the body (or decide themselves) when no user-agent
prefix and no header mark of any plug-in is present (issue 40): the same harness as asking each
plug-in in order, whatever the request."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from orchard_rec import harnesses
from orchard_rec.harnesses import HARNESSES, Harness, identify
from orchard_rec.harnesses.identify import identify_lower, side_conversation, side_conversation_lower

RUNTIME = "hi\n\nRuntime: agent=main | session=agent:main:x | sessionId=0a1b2c3d-0000 | host=x"
HERMES = ("terminal", "delegate_task", "session_search", "skill_view")


def _first_recognising(headers: dict[str, str], body: Any) -> str | None:
    """The rule as the registry states it: the first plug-in, in order, whose ``recognises`` says yes."""
    low = {k.lower(): v for k, v in headers.items()}
    for h in harnesses.HARNESSES:
        if h.recognises(low, body):
            return h.name
    return None


def _requests() -> list[tuple[dict[str, str], Any]]:
    agents = ["OpenAI/Python 2.24.0", "python-httpx/0.28.1", "", "AsyncOpenAI/Python 1.0"]
    agents += [a.upper() + "/9" for h in HARNESSES for a in h.user_agents]
    marks: list[dict[str, str]] = [{}]
    marks += [{name.title(): (prefix or "x") + "-1"} for h in HARNESSES for name, prefix in h.header_marks]
    marks += [{"originator": "not-codex"}, {"traceparent": "00-" + "b" * 32 + "-c-01"}]
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in HERMES]
    bodies: list[Any] = [
        None,
        {"messages": []},
        {"messages": [{"role": "user", "content": RUNTIME}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": tools},
        {"messages": [], "prompt_cache_key": "k-1"},
        [1, 2],
    ]
    out = []
    for ua, mark, body in itertools.product(agents, marks, bodies):
        headers = {**({"User-Agent": ua} if ua else {}), **mark}
        out.append((headers, body))
    return out


def test_the_same_harness_as_asking_every_plug_in_in_order() -> None:
    seen = set()
    for headers, body in _requests():
        name, _ = identify(headers, body)
        want = _first_recognising(headers, body)
        if want is not None:
            assert name == want, (headers, body)
        else:
            assert name not in {h.name for h in HARNESSES}, (headers, body)
        seen.add(name)
    assert {h.name for h in HARNESSES} <= seen  # every plug-in was named by something


class _ByHeader(Harness):
    """A third-party plug-in with its own ``recognises``, reading a header it does not declare."""

    def recognises(self, headers: Mapping[str, str], body: Any = None) -> bool:
        return headers.get("x-acme-agent") == "1"


def test_a_plug_in_that_decides_itself_is_asked_whatever_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    acme = _ByHeader("acme", (), "chat", ())
    tooly = Harness("tooly", (), "chat", (), tool_marks=("a_tool",))
    monkeypatch.setattr(harnesses, "HARNESSES", (acme, *HARNESSES, tooly))
    sdk = {"User-Agent": "OpenAI/Python 2.24.0"}
    assert identify({**sdk, "X-Acme-Agent": "1"})[0] == "acme"
    assert identify(sdk)[0] == "openai-python"
    body = {"messages": [], "tools": [{"type": "function", "function": {"name": "a_tool"}}]}
    assert identify(sdk, body)[0] == "tooly"
    # a header mark of a plug-in after the tool-marked ones: asked in order, it still wins there
    assert identify({**sdk, "session_id": "s1"}, body) == ("pi", "s1")
    monkeypatch.undo()
    assert identify({**sdk, "X-Acme-Agent": "1"})[0] == "openai-python"  # the registry is read per call


def test_identify_lower_takes_any_mapping() -> None:
    from multidict import CIMultiDict

    h = CIMultiDict({"User-Agent": "OpenAI/JS 6.26.0", "Session_Id": "019a"})
    assert identify_lower(h) == ("pi", "019a")  # its own look-ups, case-insensitive


def test_side_conversation_by_name() -> None:
    title = {"messages": [{"role": "system", "content": "You are a title generator. Go."}]}
    assert side_conversation_lower("opencode", {}, title) == "title"
    assert side_conversation("opencode", {"X-Any": "1"}, title) == "title"
    assert side_conversation_lower("openai-python", {}, title) is None  # an SDK's name: no plug-in
    assert side_conversation_lower(None, {}, title) is None
    aux = {"x-claude-code-auxiliary-type": "memory_save"}
    assert side_conversation_lower("claude-code", aux, {}) == "memory_save"


def test_user_agents_past_the_bound_are_still_read() -> None:
    for i in range(5000):  # more distinct user agents than the plan remembers
        assert identify({"User-Agent": f"Tool{i}/1.0"}) == (f"tool{i}", None)
    assert identify({"User-Agent": "codex_exec/0.1"})[0] == "codex"
    assert identify({"User-Agent": "OpenAI/Python 9"})[0] == "openai-python"
    assert identify({})[0] is None
