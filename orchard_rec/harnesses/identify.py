"""Which harness sent a request, and the session id it names: from the plug-ins' own data.

Each plug-in declares user-agent prefixes, marking headers, session headers and body fields,
tool sets, side conversations and probe paths (``base.Harness``); this module only walks
them, in a fixed order (most specific first), and falls back to the SDK a client was built
on (``openai-python``, ``anthropic-node`` ...). Called per request by the proxy's recording
core: a few dictionary look-ups, no I/O; what a body says is read by its dialect's own early-exit
readers (``base.first_user_text`` ..., measured by ``bench/identify.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from orchard_rec.harnesses.base import Harness, declared_match

__all__ = ["identify", "identify_lower", "is_probe", "side_conversation", "side_conversation_lower"]

_SDKS = (
    ("openai/python", "openai-python"),
    ("asyncopenai/python", "openai-python"),
    ("anthropic/python", "anthropic-python"),
    ("openai/js", "openai-node"),
    ("anthropic/js", "anthropic-node"),
)


def _registry() -> tuple[Harness, ...]:
    """The package's ``HARNESSES``, read on every call (a test may replace it)."""
    return sys.modules["orchard_rec.harnesses"].HARNESSES


class _Plan:
    """The registry walked by ``identify_lower``, prepared once per registry tuple: per plug-in
    whether it overrides ``recognises`` (else its declared marks are matched here, the user agent
    lower-cased once per request), and what any declared mark needs: one of the user-agent
    prefixes of them all, or one of the headers their marks name. A request with neither is
    named by no plug-in's user agent or header marks: only the plug-ins that read the body (tool
    marks) or decide themselves (their own ``recognises``) are asked, in the same order; with no
    body object, only the latter."""

    __slots__ = ("agents", "by_body", "by_name", "custom", "every", "marks", "registry", "seen")

    def __init__(self, registry: tuple[Harness, ...]) -> None:
        self.registry = registry
        self.every = tuple((h, type(h).recognises is not Harness.recognises) for h in registry)
        self.by_body = tuple((h, custom) for h, custom in self.every if custom or h.tool_marks)
        self.custom = tuple((h, custom) for h, custom in self.every if custom)
        self.agents = tuple(a for h, custom in self.every if not custom for a in h.user_agents)
        self.by_name: dict[str, Harness] = {}
        for h in registry:
            self.by_name.setdefault(h.name, h)
        self.marks = tuple(
            dict.fromkeys(n for h, custom in self.every if not custom for n, _ in h.header_marks)
        )
        self.seen: dict[str, tuple[str, bool, str | None]] = {}
        """User agent as sent -> ``(lower-case, a declared prefix names it, the SDK's name)``."""

    def agent(self, sent: str) -> tuple[str, bool, str | None]:
        """What a ``User-Agent`` says (decided once per value; bounded: a hostile client cannot
        grow it without limit)."""
        known = self.seen.get(sent)
        if known is None:
            ua = sent.lower()
            known = (ua, ua.startswith(self.agents), _sdk_of(ua))
            if len(self.seen) < 4096:
                self.seen[sent] = known
        return known


_plan: list[_Plan | None] = [None]


def _walk() -> _Plan:
    hs = _registry()
    plan = _plan[0]
    if plan is None or plan.registry is not hs:
        plan = _plan[0] = _Plan(hs)
    return plan


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def identify(headers: Mapping[str, str], body: Any = None) -> tuple[str | None, str | None]:
    """``(harness, harness_session)``: the harness that sent this request (``codex``, ``pi``,
    ``kimi`` ... or the SDK it was built on) and the session id it names itself, if any."""
    return identify_lower(_lower(headers), body)


def identify_lower(h: Mapping[str, str], body: Any = None) -> tuple[str | None, str | None]:
    """``identify`` of headers whose names are lower-case already (``public_headers``)."""
    name: str | None = None
    sid: str | None = None
    plan = _walk()
    ua, declared, fallback = plan.agent(h.get("user-agent", ""))
    if declared:
        walk = plan.every
    else:
        walk = plan.by_body if isinstance(body, dict) else plan.custom
        for mark in plan.marks:
            if mark in h:
                walk = plan.every
                break
    for harness, custom in walk:
        if harness.recognises(h, body) if custom else declared_match(harness, ua, h, body):
            name, sid = harness.name, harness.session_of(h, body)
            break
    else:
        name = fallback
    if sid is None:
        tp = h.get("traceparent")
        if tp:
            parts = tp.split("-")
            if len(parts) >= 3 and len(parts[1]) == 32:
                sid = "trace:" + parts[1]
    return name, (sid[:256] if sid else None)


def _sdk_of(ua: str) -> str | None:
    """The name of a request no plug-in recognises: the SDK its (lower-case) user agent names,
    else the user agent's first word."""
    for prefix, sdk in _SDKS:
        if ua.startswith(prefix):
            return sdk
    return (ua.split("/", 1)[0][:64] or None) if ua else None


def side_conversation(harness: str | None, headers: Mapping[str, str], body: Any) -> str | None:
    """The kind of side conversation (``"title"`` ...) a request of ``harness`` belongs to, or
    None when it is the agent's own conversation."""
    if harness is None or harness not in _walk().by_name:
        return None
    return side_conversation_lower(harness, _lower(headers), body)


def side_conversation_lower(harness: str | None, headers: Mapping[str, str], body: Any) -> str | None:
    """``side_conversation`` of headers whose names are lower-case already (``public_headers``)."""
    if harness is None:
        return None
    h = _walk().by_name.get(harness)
    return None if h is None else h.side_conversation(headers, body)


def is_probe(method: str, path: str, headers: Mapping[str, str] | None = None) -> bool:
    """Whether ``path`` (after any ``/s/{id}`` prefix, no query) is a GET some harness sends to
    learn what the server is, not a model call: relayed, never recorded."""
    if method != "GET":
        return False
    p = "/" + path.strip("/")
    ua = ""
    if headers is not None:
        ua = (headers.get("user-agent") or headers.get("User-Agent") or "").lower()
    return any(
        p in h.probes and (not h.probe_agents or any(ua.startswith(a) for a in h.probe_agents))
        for h in _registry()
    )
