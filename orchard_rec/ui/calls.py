"""One call, as a debugging tool sees it: its stream events, "copy as curl", "send again".

- ``stream_events``: the server-sent events the client received, in order, each with when it
  arrived (ms after the request; the proxy records it, ``metadata["event_ms"]``) and the gap
  since the one before; the call's first and last byte times bound them. Calls recorded before
  the proxy kept arrival times, and translated streams (whose events the proxy made), show only
  the bounds. (The Headers tab beside it shows the client's request headers and the upstream's
  response headers, both as recorded: the proxy removed their secrets, ``metadata["response_headers"]``.)
- ``curl_of``: the client's request as a shell command (to the proxy's route for its session),
  with every secret masked: the recorded
  headers never hold credentials (the proxy drops them before recording), and any header or body
  field whose name says key, token, secret, password or cookie is replaced by ``***`` all the
  same; the command authenticates with ``$OPENAI_API_KEY`` (``$ANTHROPIC_API_KEY`` for Messages).
- ``resend``: sends the call again (opt-in: ``orchard-rec ui --resend-to URL``, ``serve --ui
  --ui-resend``), the body the proxy sent upstream, unstreamed, to the upstream; returns the new
  answer with its status, headers and latency. Nothing is recorded.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from orchard_rec import dialects
from orchard_rec.records import CallRecord

__all__ = ["Resend", "curl_of", "mask", "resend", "stream_events"]

SECRET = re.compile(r"authorization|api[-_]?key|token|secret|password|cookie|credential", re.I)
_SKIP = frozenset({"content-length", "host", "connection", "transfer-encoding", "accept-encoding"})
_TOKEN_FIELDS = frozenset({"max_tokens", "max_completion_tokens", "max_output_tokens", "prompt_tokens"})


def _secret_name(name: str) -> bool:
    n = name.lower()
    return bool(SECRET.search(n)) and n not in _TOKEN_FIELDS and not n.endswith("_token_ids")


def mask(obj: Any) -> Any:
    """``obj`` with the values of secret-named fields replaced by ``***`` (recursively)."""
    if isinstance(obj, dict):
        return {k: "***" if _secret_name(str(k)) and isinstance(v, str) else mask(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask(v) for v in obj]
    return obj


def stream_events(c: CallRecord) -> dict[str, Any] | None:
    """The events of a streamed call, and the window they arrived in (ms after the request)."""
    if not c.stream or c.events is None:
        return None
    fb = c.first_byte_at
    at = (c.metadata or {}).get("event_ms")
    if not (isinstance(at, list) and len(at) == len(c.events)):
        at = None
    events = []
    for i, e in enumerate(c.events):
        ev: dict[str, Any] = {
            "i": i,
            "event": e[0] if isinstance(e, list) else None,
            "data": e[1] if isinstance(e, list) else e,
        }
        if at is not None:
            ev["ms"] = at[i]
            ev["gap_ms"] = at[i] - at[i - 1] if i else None
        events.append(ev)
    gaps = [e["gap_ms"] for e in events[1:]] if at is not None else []
    return {
        "count": len(c.events),
        "first_byte_ms": None if fb is None else round((fb - c.received_at) * 1000, 1),
        "done_ms": round((c.done_at - c.received_at) * 1000, 1),
        "timed": at is not None,
        "max_gap_ms": max(gaps, default=None),
        "timing": "arrival of each event, ms after the request"
        if at is not None
        else "per-event arrival times were not recorded for this call; the stream ran between these two",
        "events": events,
    }


def curl_of(c: CallRecord, url_base: str) -> str:
    """``curl`` of the client's request against ``url_base`` (the proxy's origin, or a
    ``$ORCHARD_URL`` placeholder), secrets masked."""
    path = c.path
    if c.session_id and path.startswith("/v1/"):  # the proxy's session route keeps the session
        path = f"/s/{quote(c.session_id, safe='')}{path}"
    if url_base.startswith("$"):  # a variable the shell expands
        target = f'"{url_base}"{shlex.quote(path)}'
    else:
        target = shlex.quote(url_base + path)
    lines = [f"curl -sS -X {c.method} {target}"]
    for name, value in sorted((c.headers or {}).items()):
        if name.lower() in _SKIP:
            continue
        shown = "***" if _secret_name(name) else value
        lines.append(f"  -H {shlex.quote(f'{name}: {shown}')}")
    wire = dialects.get(c.dialect)  # the dialect's own credential header, if it has one
    own = wire.auth_headers("$API_KEY", c.headers or {}) if wire is not None else {}
    for name, value in own.items() or [("Authorization", "Bearer $API_KEY")]:
        lines.append(f'  -H "{name}: {value}"')
    if c.request is not None:
        body = orjson.dumps(mask(c.request)).decode()
        lines.append(f"  --data-binary {shlex.quote(body)}")
    return " \\\n".join(lines)


@dataclass(frozen=True)
class Resend:
    """Where "send again" goes: the upstream's base URL (with ``/v1``) and its key, if any."""

    upstream: str
    key: str | None = None

    def __repr__(self) -> str:  # the key never shows in logs or tracebacks
        return f"Resend(upstream={self.upstream!r}, key={'***' if self.key else None})"


def _replay_body(c: CallRecord) -> Any:
    body = c.upstream_request if c.upstream_request is not None else c.request
    if not isinstance(body, dict):
        return None
    body = dict(body)
    if body.get("stream"):
        body["stream"] = False
        body.pop("stream_options", None)
    return body


async def resend(c: CallRecord, target: Resend, timeout: float = 300.0) -> dict[str, Any]:
    """Send ``c`` again to ``target``; the new answer (never recorded) and how it came."""
    import aiohttp

    body = _replay_body(c)
    if body is None:
        return {"error": "this call has no JSON request body to send again"}
    url = dialects.upstream_address(target.upstream.rstrip("/"), dialects.without_secrets(c.path))
    headers = {"content-type": "application/json"}
    if target.key:
        headers["authorization"] = f"Bearer {target.key}"
        wire = dialects.get(c.dialect)
        if wire is not None:  # the dialect's own credential header (Anthropic's x-api-key ...)
            headers.update(wire.auth_headers(target.key, c.headers or {}))
    for name in ("anthropic-version", "anthropic-beta"):
        if name in (c.headers or {}):
            headers[name] = c.headers[name]
    t0 = time.monotonic()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            async with http.post(url, data=orjson.dumps(body), headers=headers) as r:
                raw = await r.read()
                resp_headers = {str(k): v for k, v in r.headers.items() if not _secret_name(k)}
                status = r.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return {"url": url, "error": f"{type(exc).__name__}: {exc}"}
    try:
        answer: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = raw.decode("utf-8", errors="replace")
    return {
        "url": url,
        "status": status,
        "latency_ms": round((time.monotonic() - t0) * 1000, 1),
        "headers": resp_headers,
        "request": mask(body),
        "response": answer,
        "recorded": c.response,
    }
