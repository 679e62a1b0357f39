"""Which harness sent a request, and the session id it names: from the plug-ins' own data.

Each plug-in declares user-agent prefixes, marking headers, session headers and body fields,
tool sets, side conversations and probe paths (``base.Harness``); this module only walks
them, in a fixed order (most specific first), and falls back to the SDK a client was built
on (``openai-python``, ``anthropic-node`` ...). Called per request by the proxy's recording
core: a few dictionary look-ups, no I/O; what a body says is read by its dialect's own early-exit
readers (``base.first_user_text`` ..., measured by ``bench/identify.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_rec.harnesses.base import Harness, declared_match

__all__ = ["identify", "identify_lower", "is_probe", "side_conversation"]

_SDKS = (
    ("openai/python", "openai-python"),
    ("asyncopenai/python", "openai-python"),
    ("anthropic/python", "anthropic-python"),
    ("openai/js", "openai-node"),
    ("anthropic/js", "anthropic-node"),
)


def _registry() -> tuple[Harness, ...]:
    from orchard_rec.harnesses import HARNESSES

    return HARNESSES


_plan: list[Any] = [None, ()]
"""The registry tuple last seen, and per plug-in whether it overrides ``recognises`` (else its
declared marks are matched here, the user agent lower-cased once per request)."""


def _walk() -> tuple[tuple[Harness, bool], ...]:
    hs = _registry()
    if _plan[0] is not hs:
        _plan[1] = tuple((h, type(h).recognises is not Harness.recognises) for h in hs)
        _plan[0] = hs
    return _plan[1]


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
    ua = h.get("user-agent", "").lower()
    for harness, custom in _walk():
        if harness.recognises(h, body) if custom else declared_match(harness, ua, h, body):
            name, sid = harness.name, harness.session_of(h, body)
            break
    else:
        for prefix, sdk in _SDKS:
            if ua.startswith(prefix):
                name = sdk
                break
        else:
            name = (ua.split("/", 1)[0][:64] or None) if ua else None
    if sid is None:
        tp = h.get("traceparent")
        if tp:
            parts = tp.split("-")
            if len(parts) >= 3 and len(parts[1]) == 32:
                sid = "trace:" + parts[1]
    return name, (sid[:256] if sid else None)


def side_conversation(harness: str | None, headers: Mapping[str, str], body: Any) -> str | None:
    """The kind of side conversation (``"title"`` ...) a request of ``harness`` belongs to, or
    None when it is the agent's own conversation."""
    if harness is None:
        return None
    for h in _registry():
        if h.name == harness:
            return h.side_conversation(_lower(headers), body)
    return None


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
