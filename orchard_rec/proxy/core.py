"""The recording core, sans-io: one object per call that both front doors drive.

The aiohttp proxy (``proxy.app``) and the mitmproxy addon (``intercept.addon``) own their
sockets; everything else about a call is decided here, once: who is calling (session id,
harness), what they sent (the parsed body, the session it implies), the WebSocket refusal,
the token-mode plan (what goes upstream instead), what the client receives for the upstream's
answer (body or event stream, rewritten or not), when a stream has ended, and the error body
in the caller's dialect. The front doors feed it headers, bytes and statuses and write what it
returns; it never awaits and never touches a socket, so it is tested with bytes in, bytes out.

End of stream is read from parsed events of the bytes the client receives (``protocol.StreamEnd``),
never from a substring of them: a model that writes ``[DONE]`` or ``message_stop`` in its reply
does not end its own record.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from orchard_rec import protocol
from orchard_rec.errors import OrchardError, UpgradeRequired
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.identity import validate_session_id
from orchard_rec.proxy.request import caller, take_body
from orchard_rec.proxy.token import Plan, StreamFilter, plan_for
from orchard_rec.records import CallOutcome, Dialect

__all__ = [
    "ROUTES",
    "WEBSOCKET_REFUSAL",
    "Call",
    "StreamRelay",
    "dialect_of",
    "is_websocket",
    "refuse_websocket",
]

ROUTES = {
    ("POST", "chat/completions"): Dialect.CHAT,
    ("POST", "completions"): Dialect.COMPLETIONS,
    ("POST", "responses"): Dialect.RESPONSES,
    ("POST", "messages"): Dialect.MESSAGES,
    ("GET", "models"): Dialect.MODELS,
}
"""``(method, path after /v1/)`` -> the dialect it speaks; anything else is ``other``."""

TOKEN_DIALECTS = frozenset({Dialect.CHAT, Dialect.RESPONSES, Dialect.MESSAGES})
"""The dialects token-in/token-out mode renders itself."""


def dialect_of(method: str, tail: str) -> Dialect:
    return ROUTES.get((method, tail.strip("/")), Dialect.OTHER)


WEBSOCKET_REFUSAL = "WebSocket transport is not supported while recording; use HTTP POST with stream=true"


def is_websocket(headers: Mapping[str, str]) -> bool:
    return (headers.get("upgrade") or "").lower() == "websocket"


def refuse_websocket(path: str, headers: Mapping[str, str]) -> tuple[int, bytes] | None:
    """The 426 answer to a WebSocket upgrade (Codex tries one first, and falls back to POST + SSE
    at once when refused quickly: what it sends there could not be recorded as calls), else None."""
    if not is_websocket(headers):
        return None
    exc = UpgradeRequired(WEBSOCKET_REFUSAL)
    return exc.status, protocol.error_body(exc, protocol.is_anthropic(path, headers))


class Call:
    """One call being recorded: fed what arrives, answers what to send. Holds the ``Capture``."""

    __slots__ = ("anthropic", "cap", "plan", "relay")

    def __init__(self, dialect: Dialect, method: str, path: str, headers: Mapping[str, str]) -> None:
        self.cap = Capture(dialect, method, path, None)
        self.plan: Plan | None = None
        self.relay: StreamRelay | None = None
        self.anthropic = dialect is Dialect.MESSAGES or protocol.is_anthropic(path, headers)
        """Errors are answered in Anthropic's shape."""

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
        self.plan = plan = plan_for(mode, cap.dialect, body, cap.session_id, cap.bytes_in, salt)
        if plan is not None:
            cap.upstream_request = plan.body
            cap.upstream_dialect = plan.upstream
        return body

    def upstream_target(self, tail: str, query: str) -> tuple[str, bytes | None]:
        """The path under the upstream's base (``tail`` plus ``query``) and the body to send,
        ``None`` to send the client's own bytes untouched."""
        plan = self.plan
        if plan is None:
            return tail + ("?" + query if query else ""), None
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
        return protocol.error_body(exc, self.anthropic)

    # -- the answer --------------------------------------------------------------------------------

    def response(self, status: int, content_type: str | None) -> StreamRelay | None:
        """The upstream's status line arrived: a ``StreamRelay`` for an event stream, else None
        (then ``body`` takes the whole answer)."""
        cap = self.cap
        cap.first_byte_at = time.time()
        cap.status_code = status
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
        self._end = protocol.StreamEnd(cap.dialect)
        self.sent = 0
        """Bytes handed to the client so far."""

    @property
    def ended(self) -> bool:
        return self._end.ended

    def feed(self, chunk: bytes) -> bytes:
        """The bytes the client should get for this upstream ``chunk`` (maybe none yet)."""
        self.cap.chunks.append(chunk)
        out = chunk if self.filter is None else self.filter.feed(chunk)
        if out:
            self._end.feed(out)
        return out

    def finish(self) -> bytes:
        """At the upstream's EOF: the bytes still owed to the client (a translation's closing events)."""
        tail = self.filter.finish() if self.filter is not None else b""
        if tail:
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
        event), when the client's bytes end on an event boundary; else nothing (the stream is cut)."""
        from orchard_rec.protocol import anthropic, responses
        from orchard_rec.protocol.sse import encode

        last = self.cap.chunks[-1] if self.cap.chunks else b""
        if self.filter is None and last and not last.endswith((b"\n\n", b"\r\n\r\n")):
            return b""
        d = self.cap.dialect
        if d is Dialect.MESSAGES:
            return encode(*anthropic.stream_error_event({"message": message}))
        if d is Dialect.RESPONSES:
            return encode(*responses.stream_error_event({"message": message, "code": "server_error"}, 0))
        if d in (Dialect.CHAT, Dialect.COMPLETIONS):
            return encode(
                None, {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
            )
        return b""
