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

from orchard_rec.harnesses.base import Harness

__all__ = ["identify", "is_probe", "side_conversation"]

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


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def identify(headers: Mapping[str, str], body: Any = None) -> tuple[str | None, str | None]:
    """``(harness, harness_session)``: the harness that sent this request (``codex``, ``pi``,
    ``kimi`` ... or the SDK it was built on) and the session id it names itself, if any."""
    h = _lower(headers)
    name: str | None = None
    sid: str | None = None
    for harness in _registry():
        if harness.recognises(h, body):
            name, sid = harness.name, harness.session_of(h, body)
            break
    else:
        ua = h.get("user-agent", "").lower()
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
