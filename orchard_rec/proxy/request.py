"""Reading a client's call: shared by both front doors (the proxy and ``intercept``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from orchard_rec.errors import BadRequest, UnsupportedMediaType
from orchard_rec.harnesses import HARNESSES
from orchard_rec.harnesses.identify import identify_lower, side_conversation_lower
from orchard_rec.proxy import reqparse
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.identity import derive_session, public_headers
from orchard_rec.records import Dialect

__all__ = ["caller", "parse_body", "take_body"]


def caller(cap: Capture, headers: Mapping[str, str]) -> None:
    """Who is calling: the headers fit to store, and the harness they name."""
    cap.headers = public_headers(headers)
    cap.harness, cap.harness_session = identify_lower(cap.headers)  # stored names are lower-case


_NAMES = frozenset(h.name for h in HARNESSES)
_TOOLS = any(h.tool_marks for h in HARNESSES)


def _body_may_name(harness: str | None, headers: Mapping[str, str]) -> bool:
    """Whether ``identify(headers, body)`` may differ from ``identify(headers)`` (``harness``):
    when a harness recognised by its tools comes before the one the headers named (or none
    was), or the one named keeps its session id in the body."""
    if harness not in _NAMES:  # none, or an SDK's name: only a harness's tools can tell
        return _TOOLS
    for h in HARNESSES:
        if h.name == harness and h.recognises(headers):
            return bool(h.session_fields)
        if h.tool_marks:
            return True
    return False


def take_body(cap: Capture, raw: bytes, content_type: str | None) -> Any:
    """What they sent: the parsed body on the capture, and the session it implies when none was named.

    The body is read through the request cache (``reqparse``): keyed by the session the route,
    header or harness named, else by the body's opening; ``cap.request_base`` says which earlier
    call's body it repeated, and how much of it."""
    cap.bytes_in = len(raw)
    name = cap.session_id
    if name is None and cap.harness_session is not None and not cap.harness_session.startswith("trace:"):
        name = f"{cap.harness}:{cap.harness_session}"  # (a trace id may change every call)
    body, cap.request_base = _parse(raw, content_type, cap.dialect, name, cap.call_id)
    cap.request = body
    cap.request_raw = raw
    if body is not None:
        # harnesses named by their body (Kimi's prompt_cache_key, a tool set), side conversations;
        # a session id the headers already gave stands
        if (cap.harness_session is None or cap.harness_session.startswith("trace:")) and _body_may_name(
            cap.harness, cap.headers
        ):
            cap.harness, cap.harness_session = identify_lower(cap.headers, body)
        aux = side_conversation_lower(cap.harness, cap.headers, body)
        if aux is not None:
            cap.metadata["auxiliary"] = aux
    if cap.session_id is None and body is not None:
        cap.session_id = derive_session(cap.harness, cap.harness_session, cap.dialect, body)
    return body


def parse_body(raw: bytes, content_type: str | None, dialect: Dialect) -> Any:
    """The JSON object of a generation call (``None`` for other calls); a dialect error when malformed."""
    return _parse(raw, content_type, dialect, None, "")[0]


def _parse(
    raw: bytes, content_type: str | None, dialect: Dialect, session: str | None, call_id: str
) -> tuple[Any, tuple[str, int, int] | None]:
    """``parse_body``, and the cached base the body repeated (``Capture.request_base``)."""
    if not dialect.is_generation:
        return None, None
    if content_type is not None and "json" not in content_type.lower():
        raise UnsupportedMediaType(f"content-type must be application/json, got {content_type[:100]!r}")
    try:
        body, base = reqparse.cache.parse(raw, session, call_id)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    return body, base
