"""The recording core, sans-io: one object per call that both front doors drive.

The aiohttp proxy (``proxy.app``) and the mitmproxy addon (``intercept.addon``) own their
sockets; everything else about a call is decided here, once: who is calling (session id,
harness), what they sent (the parsed body, the session it implies), the WebSocket refusal,
the token-mode plan (what goes upstream instead), what the client receives for the upstream's
answer (body or event stream, rewritten or not), when a stream has ended, and the error body
in the caller's dialect. The front doors feed it headers, bytes and statuses and write what it
returns; it never awaits and never touches a socket, so it is tested with bytes in, bytes out.

End of stream is read from parsed events of the bytes the client receives (``dialects.StreamEnd``),
never from a substring of them: a model that writes ``[DONE]`` or ``message_stop`` in its reply
does not end its own record.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from orchard_rec import dialects
from orchard_rec.dialects import upstream_address
from orchard_rec.errors import OrchardError, UpgradeRequired
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.identity import response_headers, validate_session_id
from orchard_rec.proxy.request import caller, take_body
from orchard_rec.proxy.token import Plan, StreamFilter, plan_for
from orchard_rec.records import CallOutcome, Dialect

__all__ = [
    "WEBSOCKET_REFUSAL",
    "Call",
    "StreamRelay",
    "dialect_of",
    "is_websocket",
    "refuse_websocket",
    "renders",
    "upstream_address",
]


def dialect_of(method: str, path: str) -> Dialect:
    """The dialect whose route ``method path`` (from the root, query string ignored) is, found in
    the registry (``dialects.route``); ``models`` for ``GET /v1/models``; anything else is ``other``.
    Decided once per route (a bounded table: a hostile client cannot grow it without limit)."""
    path = path.partition("?")[0].rstrip("/")
    key = (method, path)
    known = _ROUTED.get(key)
    if known is not None:
        return known
    d = _route(method, path)
    if len(_ROUTED) < 4096:
        _ROUTED[key] = d
    return d


_ROUTED: dict[tuple[str, str], Dialect] = {}


def _route(method: str, path: str) -> Dialect:
    found = dialects.route(method, path)
    if found is not None and found[1].start() == 0:
        return found[0].name
    if method == "GET" and path == "/v1/models":
        return Dialect.MODELS
    return Dialect.OTHER


def renders(dialect: Dialect) -> bool:
    """Whether token-in/token-out mode renders this dialect's calls itself (it has a chat view)."""
    d = dialects.get(dialect)
    return d is not None and d.chat_view


WEBSOCKET_REFUSAL = "WebSocket transport is not supported while recording; use HTTP POST with stream=true"


def is_websocket(headers: Mapping[str, str]) -> bool:
    return (headers.get("upgrade") or "").lower() == "websocket"


def refuse_websocket(path: str, headers: Mapping[str, str]) -> tuple[int, bytes] | None:
    """The 426 answer to a WebSocket upgrade (Codex tries one first, and falls back to POST + SSE
    at once when refused quickly: what it sends there could not be recorded as calls), else None."""
    if not is_websocket(headers):
        return None
    exc = UpgradeRequired(WEBSOCKET_REFUSAL)
    return exc.status, dialects.error_body(exc, dialects.caller(path, headers))


class Call:
    """One call being recorded: fed what arrives, answers what to send. Holds the ``Capture``."""

    __slots__ = ("_client", "_headers", "cap", "plan", "relay")

    def __init__(self, dialect: Dialect, method: str, path: str, headers: Mapping[str, str]) -> None:
        self.cap = Capture(dialect, method, path, None)
        self.plan: Plan | None = None
        self.relay: StreamRelay | None = None
        self._headers = headers
        self._client: dialects.WireDialect | None = None

    @property
    def client(self) -> dialects.WireDialect:
        """The dialect whose shape errors are answered in (decided when an error needs it)."""
        if self._client is None:
            self._client = dialects.caller(self.cap.path, self._headers, self.cap.dialect)
        return self._client

    # -- the request -------------------------------------------------------------------------------

    def name_session(self, session_id: str | None) -> None:
        """The session the route or the ``X-Orchard-Session`` header names (validated), if any."""
        if session_id is not None:
            self.cap.session_id = validate_session_id(session_id)

    def identify(self, headers: Mapping[str, str]) -> None:
        """Who is calling: stored headers and harness. A WebSocket upgrade is refused (426)."""
        caller(self.cap, headers)
        if is_websocket(headers):
            raise UpgradeRequired(WEBSOCKET_REFUSAL)

    def read(self, raw: bytes, content_type: str | None, mode: str, salt: str | None = None) -> Any:
        """What they sent: the parsed body (a dialect error when malformed), the session it implies,
        and in token ``mode`` the plan (``self.plan``) of what goes upstream instead (with
        ``cache_salt`` = ``salt`` when given)."""
        cap = self.cap
        body = take_body(cap, raw, content_type)
        self.plan = plan = plan_for(mode, cap.dialect, body, cap.session_id, cap.bytes_in, cap.path, salt)
        if plan is not None:
            cap.upstream_request = plan.body
            cap.upstream_dialect = plan.upstream
        return body

    def upstream_target(self, path: str, query: str) -> tuple[str, bytes | None]:
        """The path to call upstream (the client's ``path`` from the root, plus ``query``; ``upstream_address``
        places it under the upstream's base) and the body to send, ``None`` to send the client's own
        bytes untouched."""
        plan = self.plan
        if plan is None:
            return path + ("?" + query if query else ""), None
        path = plan.upstream_path + ("?" + query if query and not plan.translated else "")
        return path, plan.upstream_bytes(self.cap.request_raw)

    def reject(self, exc: OrchardError) -> tuple[int, bytes]:
        """Record a refusal (``rejected`` unless already failed otherwise) and the error to answer."""
        cap = self.cap
        if cap.outcome is CallOutcome.OK:
            cap.fail(CallOutcome.REJECTED, exc.message)
        cap.status_code = exc.status
        return exc.status, self.error_body(exc)

    def error_body(self, exc: OrchardError) -> bytes:
        return dialects.error_body(exc, self.client)

    # -- the answer --------------------------------------------------------------------------------

    def response(
        self, status: int, content_type: str | None, headers: Mapping[str, str] | None = None
    ) -> StreamRelay | None:
        """The upstream's status line arrived: a ``StreamRelay`` for an event stream, else None
        (then ``body`` takes the whole answer). ``headers``: the upstream's response headers,
        recorded without secrets (``metadata["response_headers"]``)."""
        cap = self.cap
        cap.first_byte_at = time.time()
        cap.status_code = status
        if headers is not None:
            cap.metadata["response_headers"] = response_headers(headers)
        if "text/event-stream" in (content_type or "").lower():
            cap.stream = True
            self.relay = StreamRelay(cap, self.plan)
            return self.relay
        return None

    @property
    def client_content_type(self) -> str | None:
        """The content type the client gets instead of the upstream's, when the answer is translated."""
        if self.plan is None or not self.plan.translated:
            return None
        return "text/event-stream; charset=utf-8" if self.cap.stream else "application/json"

    def body(self, data: bytes, status: int) -> bytes:
        """A whole (non-stream) answer: recorded as it came, returned as the client should get it."""
        cap = self.cap
        cap.body = data
        if self.plan is not None:
            data, cap.client_response = self.plan.client_body_bytes(data, status)
            cap.id_cut = self.plan.cut
        cap.bytes_out = len(data)
        return data

    def passing(self, chunk: bytes) -> None:
        """A chunk of a whole answer the front door streams to the client as it is (no plan)."""
        self.cap.bytes_out += len(chunk)


class StreamRelay:
    """One event stream, upstream to client: ``feed(chunk) -> bytes to send``, ``finish()`` at EOF.

    The upstream's bytes are kept for the record as they came; the client gets them as they are,
    less what token mode injected, or translated. ``ended`` turns True once the client has been
    handed its stream's last event (an SDK may hang up right after, as they do at ``[DONE]``)."""

    __slots__ = ("_end", "cap", "filter", "sent")

    def __init__(self, cap: Capture, plan: Plan | None) -> None:
        self.cap = cap
        self.filter: StreamFilter | None = plan.stream_filter() if plan is not None else None
        if plan is not None and plan.translated and self.filter is not None:
            cap.client_events = self.filter.client_events
        self._end: dialects.StreamEnd | None = None
        """Watches the client's bytes for the last event, unless the filter, which parses every
        event it hands on, keeps ``ended`` itself (token mode, native: ``StreamFilter.tracks_end``)."""
        if self.filter is None or not self.filter.tracks_end:
            self._end = dialects.StreamEnd(cap.dialect)
        self.sent = 0
        """Bytes handed to the client so far."""

    @property
    def ended(self) -> bool:
        return self._end.ended if self._end is not None else self.filter.ended  # type: ignore[union-attr]

    def feed(self, chunk: bytes) -> bytes:
        """The bytes the client should get for this upstream ``chunk`` (maybe none yet)."""
        cap = self.cap
        cap.chunks.append(chunk)
        cap.arrivals.append(time.monotonic())
        out = chunk if self.filter is None else self.filter.feed(chunk)
        if out and self._end is not None:
            self._end.feed(out)
        return out

    def finish(self) -> bytes:
        """At the upstream's EOF: the bytes still owed to the client (a translation's closing events)."""
        tail = self.filter.finish() if self.filter is not None else b""
        if tail and self._end is not None:
            self._end.feed(tail)
        return tail

    def sending(self, n: int) -> None:
        """``n`` more bytes are being handed to the client."""
        self.sent += n
        self.cap.bytes_out = self.sent

    def broke(self, message: str) -> bytes:
        """The upstream's stream broke after the client had its status line (a fleet's server died):
        the error as the client's dialect says it inside a stream (chat/completions: a ``data:
        {"error": ...}`` chunk, which the openai SDK raises; Responses and Messages: their ``error``
        event; ``WireDialect.stream_error``), when the client's bytes end on an event boundary; else
        nothing (the stream is cut)."""
        last = self.cap.chunks[-1] if self.cap.chunks else b""
        if self.filter is None and last and not last.endswith((b"\n\n", b"\r\n\r\n")):
            return b""
        wire = dialects.get(self.cap.dialect)
        return wire.stream_error(message) if wire is not None else b""
