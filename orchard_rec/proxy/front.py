"""The proxy's own HTTP/1.1 server for its calls, with aiohttp's server behind it for the rest.

A recorded call's path through aiohttp's web server (its protocol, request and payload
objects, router, handler task and response machinery) cost the event loop ~30 us, as much as
everything else a bare forwarder does (``bench/PROFILE.md`` round 17). This server parses with
llhttp (``httptools``) and hands the call to the same handler (``app.proxy_handler``, guarded)
through a small request object (``LeanRequest``) and answers through ``LeanReply``.

What it takes itself: ``GET`` and ``POST`` over HTTP/1.1 on ``/v1/...`` and ``/s/{sid}/v1/...``
with a plain path (no ``%``, ``+``, ``//`` or dot segments: what aiohttp would decode or
normalise), no ``Expect``, no ``Content-Encoding`` and no upgrade. Any other request (the
viewer, ``/healthz``, ``/metrics``, a ``HEAD``, HTTP/1.0, a malformed request) makes the
connection aiohttp's from that request on (``transport.set_protocol``): aiohttp's own protocol
is fed the request's bytes as they came and answers exactly as it always has. A request
pipelined in the same read behind another one has no known start; it is handed over rebuilt
from its parsed parts (its body re-framed with ``Content-Length``).

Behaviour kept from aiohttp's server (``server._runner``): handler cancellation when the client
hangs up, requests on one connection answered in order, ``Date`` and ``Server`` headers,
``Connection: close`` honoured, idle keep-alive connections closed after ``KEEPALIVE`` s,
graceful shutdown (in-flight calls finish within the shutdown timeout), write back pressure
above 64 KiB. A body over ``client_max_size`` is answered as the handler answers
``HTTPRequestEntityTooLarge`` (``read()`` raises it) as soon as it is over; the rest of the body
is read and dropped (up to ``LINGER`` s) and the connection goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import httptools
from aiohttp import hdrs, web
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_parser import SINGLETON_HEADERS as SINGLETONS
from aiohttp.tcp_helpers import tcp_keepalive
from multidict import CIMultiDict, CIMultiDictProxy, istr

__all__ = ["ENTRY", "Entry", "Front", "LeanReply", "LeanRequest", "reply", "stream"]

log = logging.getLogger("orchard_rec.proxy")

Handler = Callable[[Any], Awaitable[Any]]


class Entry:
    """What an app gives this server: the handler of its calls (``build_app``: the guarded
    ``proxy_handler``), and what the server counts (``/healthz``'s ``front``)."""

    __slots__ = ("calls", "handed_over", "handler", "max_body", "serving")

    def __init__(self, handler: Handler, max_body: int) -> None:
        self.handler = handler
        self.max_body = max_body
        """The largest request body taken (a larger one: ``read()`` raises ``HTTPRequestEntityTooLarge``)."""
        self.serving = False
        """Whether this server serves the app (else aiohttp's serves every request: ``ORCHARD_FRONT=aiohttp``)."""
        self.calls = 0
        """Requests this server took."""
        self.handed_over = 0
        """Connections handed to aiohttp's server (at their first request it does not take)."""

    def state(self) -> dict[str, Any]:
        if not self.serving:
            return {"server": "aiohttp"}
        return {"server": "lean", "calls": self.calls, "handed_over": self.handed_over}


ENTRY = web.AppKey("front", Entry)

KEEPALIVE = 3630.0
"""Seconds an idle keep-alive connection is kept (aiohttp's server default)."""
LINGER = 10.0
"""Seconds the rest of a body over the size limit is read and dropped before closing (aiohttp's)."""
HIGH_WATER = 65536
"""Bytes buffered for a slow client before a write waits for it to drain (aiohttp's limit)."""

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_FRAMING = frozenset({"content-length", "transfer-encoding"})
_ILLEGAL_PATH = ("%", "+", "//", "/.", "#", "\\")


class _Stop(Exception):
    """Raised from a parser callback to stop parsing where a request goes to aiohttp."""


class _Bad(Exception):
    """Raised from a parser callback for a request over aiohttp's limits whose start is not known."""


MAX_LINE = 8190
MAX_FIELD = 8190
MAX_HEADERS = 128
"""aiohttp's server limits on a request's target, a header's name or value, and the headers: a
request over one is aiohttp's (its 400), which also bounds what a head can make this server hold."""


def _date() -> str:
    now = int(time.time())
    if now != _DATE[0]:
        _DATE[0] = now
        _DATE[1] = email.utils.formatdate(now, usegmt=True)
    return _DATE[1]


_DATE: list[Any] = [0, ""]


_CANONICAL = {str(v).lower(): str(v) for v in vars(hdrs).values() if isinstance(v, istr)}
_NAMES: dict[bytes, str] = {}
"""Header names as aiohttp's parser gives them: a known one in its canonical spelling
(``content-type`` is ``Content-Type``), any other as sent (bounded)."""


def _name(raw: bytes) -> str:
    name = raw.decode("utf-8", "surrogateescape")
    name = _CANONICAL.get(name.lower(), name)
    if len(_NAMES) < 4096:
        _NAMES[raw] = name
    return name


def _route(url: str) -> tuple[str, str, dict[str, str]] | None:
    """``(path, query_string, match_info)`` when this server takes ``url``, else None."""
    path, _, query = url.partition("?")
    if any(c in url for c in _ILLEGAL_PATH):
        return None
    if path.startswith("/v1/"):
        if path == "/v1/orchard/policy":
            return None
        return path, query, {"tail": path[4:]}
    if path.startswith("/s/"):
        sid, slash, rest = path[3:].partition("/")
        if not sid or not slash or not rest.startswith("v1/") or "{" in sid or "}" in sid:
            return None
        return path, query, {"sid": sid, "tail": rest[3:]}
    return None


class LeanRequest:
    """What the call handler reads of a request (``web.Request``'s names for it)."""

    __slots__ = (
        "_body",
        "_chunks",
        "_conn",
        "_size",
        "app",
        "complete",
        "gone",
        "headers",
        "keep_alive",
        "match_info",
        "method",
        "path",
        "query_string",
        "too_large",
    )

    def __init__(self, conn: _Conn, method: str, path: str, query: str, match: dict[str, str]) -> None:
        self._conn = conn
        self.app = conn.front.app
        self.method = method
        self.path = path
        self.query_string = query
        self.match_info = match
        self.headers: Any = None
        self.keep_alive = True
        self._chunks: list[bytes] = []
        self._size = 0
        self._body = b""
        self.too_large = False
        self.gone = False  # the client left before its body ended (``read()`` is cancelled)
        self.complete = False  # (kept for a request over the size limit: whether its body has ended)

    @property
    def transport(self) -> Any:
        return self._conn.transport

    async def read(self) -> bytes:
        if self.gone:
            raise asyncio.CancelledError
        if self.too_large:
            limit = self._conn.front.max_size
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=self._size)
        return self._body


class LeanReply:
    """A response on this server: ``web.Response`` and ``web.StreamResponse`` in one, for what the
    call handler does with them (``prepare``, ``write``, ``write_eof``; ``headers`` before ``prepare``)."""

    __slots__ = ("_body", "_chunked", "_conn", "_eof", "_started", "headers", "status")

    def __init__(self, status: int, headers: Any, body: bytes | None) -> None:
        self.status = status
        self.headers = CIMultiDict(headers) if headers else CIMultiDict()
        if status < 200 or status in (204, 304):  # no body, no length (aiohttp's rule too)
            body = b""
        self._body = body
        self._chunked = body is None
        self._started = False
        self._eof = False
        self._conn: _Conn | None = None

    def _head(self, request: LeanRequest) -> bytes:
        headers = self.headers
        lines = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}\r\n"]
        for k, v in headers.items():
            if k.lower() not in _FRAMING:
                lines.append(f"{k}: {v}\r\n")
        if self._chunked:
            lines.append("Transfer-Encoding: chunked\r\n")
        elif self.status < 200 or self.status in (204, 304):
            pass
        else:
            lines.append(f"Content-Length: {len(self._body or b'')}\r\n")
        if "Content-Type" not in headers and (self._chunked or self._body):
            lines.append("Content-Type: application/octet-stream\r\n")
        if "Date" not in headers:
            lines.append(f"Date: {_date()}\r\n")
        if "Server" not in headers:
            lines.append(f"Server: {SERVER_SOFTWARE}\r\n")
        if not request.keep_alive and "Connection" not in headers:
            lines.append("Connection: close\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape")

    async def prepare(self, request: LeanRequest) -> None:
        if self._started:
            return
        self._started = True
        conn = self._conn = request._conn
        head = self._head(request)
        if self._chunked:
            await conn.send(head)
        # a whole body goes with its head, in one write, at ``write_eof``
        else:
            self._body = head + (self._body or b"")

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn is None:
            raise RuntimeError("Cannot call write() before prepare()")
        if self._eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if data and self._chunked:  # (an answer that may have no body drops it, as aiohttp does)
            await conn.send(b"%x\r\n%b\r\n" % (len(data), data))

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof:
            return
        conn = self._conn
        assert conn is not None, "Response has not been started"
        self._eof = True
        if self._chunked:
            await conn.send((b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)) if data else b"0\r\n\r\n")
        else:
            body, self._body = self._body, None
            await conn.send(body or b"")


def reply(request: Any, status: int, body: bytes, headers: Any) -> Any:
    """A whole answer on the request's server: ``LeanReply`` here, ``web.Response`` on aiohttp's."""
    if type(request) is LeanRequest:
        return LeanReply(status, headers, body)
    return web.Response(status=status, body=body, headers=headers)


def stream(request: Any, status: int, headers: Any) -> Any:
    """A streamed answer on the request's server (``LeanReply`` here, else ``web.StreamResponse``)."""
    if type(request) is LeanRequest:
        return LeanReply(status, headers, None)
    return web.StreamResponse(status=status, headers=headers)


def _from_aiohttp(resp: web.StreamResponse) -> LeanReply:
    """An unsent ``web.Response`` a handler returned (an error, a probe's answer), on this server."""
    body = resp.body if isinstance(resp, web.Response) else b""
    if not isinstance(body, (bytes, bytearray)):
        body = bytes(getattr(body, "_value", b"") or b"")  # a BytesPayload's (the handlers' are bytes)
    out = LeanReply(resp.status, None, bytes(body))
    out.headers = CIMultiDict(resp.headers)
    return out


class _Conn(asyncio.Protocol):
    """One client connection: parses requests, runs the calls' handler one request at a time."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[LeanRequest] = deque()
        self.task: asyncio.Task[None] | None = None
        self.cur: LeanRequest | None = None  # the request being parsed, when this server takes it
        self.url = bytearray()
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.head_done = False  # the current request's head has ended (what follows are trailers)
        self.trailers = 0
        self.in_message = False
        self.fresh = False  # the read being parsed started at a request's first byte
        self.begun = 0  # requests begun within the read being parsed
        self.raw: list[bytes] | None = None  # the reads since the current request began (when known)
        self.body: list[bytes] = []  # a request's body, when it is rebuilt for aiohttp
        self.divert: bytearray | None = None  # requests for aiohttp, once one of them came
        self.waiting: list[bytes] | None = None  # reads held until the answers before them are sent
        self.paused = False
        self.drained: asyncio.Future[None] | None = None
        self.closing = False
        self.bad = ""  # why a request with no known start could not be parsed (answered 400)
        self.lingering: asyncio.Future[None] | None = None
        self.idle_since = 0.0

    # -- the transport's side -------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        tcp_keepalive(transport)  # SO_KEEPALIVE, as aiohttp's server sets it
        transport.set_write_buffer_limits(high=HIGH_WATER)
        self.idle_since = time.monotonic()
        self.front.conns.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        ours = self.closing  # (this server closed it)
        self.closing = True
        self.front.conns.discard(self)
        if self.task is not None:
            self.task.cancel()  # aiohttp's handler cancellation: the handler records ``aborted``
        elif self.cur is not None and not self.cur.too_large and not ours:
            # gone before its body ended: on aiohttp's server its handler had started (it starts
            # at the head) and was cancelled in ``read()``: the same here, so it is recorded ``aborted``
            self.cur.gone = True
            self.task = asyncio.get_running_loop().create_task(self._answer(self.cur))
        self.queue.clear()
        if self.drained is not None and not self.drained.done():
            self.drained.set_exception(ConnectionResetError("Connection lost"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    def data_received(self, data: bytes) -> None:
        if self.waiting is not None:  # a request for aiohttp waits for the answers before it
            self.waiting.append(data)
            self.transport.pause_reading()  # (resumed when the connection is aiohttp's)
            return
        self.fresh = not self.in_message
        self.begun = 0
        if self.fresh:
            self.raw = [data]
        elif self.raw is not None:
            self.raw.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, (_Stop, _Bad)):
                raise
            stopped = isinstance(exc.__context__, _Stop)  # (handled below: aiohttp's log not chained to it)
            why = str(exc.__context__)
        except httptools.HttpParserUpgrade as exc:  # only while rebuilding (else stopped at its head)
            self._upgrade_from(data[int(exc.args[0]) :])
            return
        except httptools.HttpParserError as exc:  # malformed
            stopped = False
            why = f"400, message: {exc}"
        else:
            if self.divert is not None and not self.in_message:
                self.waiting = []
                self._maybe_hand_over()
            return
        if self.cur is not None and not self.cur.too_large:
            self.cur = None  # (never handled: aiohttp's parser fails on it too, before any handler)
        if stopped or (self.raw is not None and self.divert is None):
            self._aiohttp_from_here()  # aiohttp answers it as it always has
        else:  # a bad request with no known start: answered after the answers before it
            self.bad = why or "400, message: Bad Request"
            self.waiting = []
            self._maybe_hand_over()

    # -- the parser's callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.begun += 1
        if not (self.fresh and self.begun == 1):
            self.raw = None  # its first byte is somewhere inside this read
        self.url = bytearray()
        self.raw_headers = []
        self.head_done = False
        self.trailers = 0
        self.body = []
        self.cur = None

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_LINE:
            self._over()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:  # a chunked body's trailer field: not a header, but counted (as aiohttp does)
            self.trailers += 1
            if len(self.raw_headers) + self.trailers > MAX_HEADERS:
                raise _Bad("Too many headers received")
            return
        self.raw_headers.append((name, value))
        if len(value) > MAX_FIELD or len(name) > MAX_FIELD or len(self.raw_headers) > MAX_HEADERS:
            self._over()

    def _over(self) -> None:
        raise _Stop if self.raw is not None and self.divert is None else _Bad("Too many headers received")

    def on_headers_complete(self) -> None:
        self.head_done = True
        parser = self.parser
        method = parser.get_method().decode("ascii", "replace")
        url = self.url.decode("utf-8", "surrogateescape")
        route = (
            _route(url)
            if self.divert is None
            and method in ("POST", "GET")
            and parser.get_http_version() == "1.1"
            and not parser.should_upgrade()
            else None
        )
        headers = None
        if route is not None:
            names = _NAMES
            raw = self.raw_headers
            try:
                headers = CIMultiDict(
                    [(names[k], v.rstrip(b" \t").decode("utf-8", "surrogateescape")) for k, v in raw]
                )
            except KeyError:
                headers = CIMultiDict(
                    [(_name(k), v.rstrip(b" \t").decode("utf-8", "surrogateescape")) for k, v in raw]
                )
            if len(set(headers)) != len(raw) and any(len(headers.getall(n, ())) > 1 for n in SINGLETONS):
                route = None  # a repeated singleton header: aiohttp's 400
            elif (
                "expect" in headers
                or "content-encoding" in headers
                or "host" not in headers  # (aiohttp's 400)
                or headers.get("transfer-encoding", "chunked").lower() != "chunked"
            ):
                route = None
        if route is None:  # aiohttp's, as it came when its bytes are known; else rebuilt at its end
            if self.raw is not None and self.divert is None:
                raise _Stop
            if self.divert is None:
                self.divert = bytearray()
            return
        req = self.cur = LeanRequest(self, method, *route)
        req.headers = CIMultiDictProxy(headers)  # type: ignore[arg-type]
        req.keep_alive = parser.should_keep_alive()
        if "transfer-encoding" not in req.headers:  # (a chunked body may be malformed: aiohttp answers it)
            self.raw = None  # this one is the front's: its reads need not be kept (a large body's twice)

    def on_body(self, body: bytes) -> None:
        req = self.cur
        if req is None:
            self.body.append(body)
            return
        if req.too_large:
            return
        req._size += len(body)
        if req._size > self.front.max_size:
            req.too_large = True
            req._chunks = []
            self.raw = None
            self._enqueue(req)  # answered now; the rest of its body is read and dropped
            return
        req._chunks.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        req = self.cur
        self.cur = None
        if req is None:  # one for aiohttp, rebuilt
            assert self.divert is not None
            self.divert += self._rebuilt()
            return
        if req.too_large:  # already answered
            req.complete = True
            if self.lingering is not None and not self.lingering.done():
                self.lingering.set_result(None)
            return
        chunks = req._chunks
        req._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        req._chunks = []
        if not req.keep_alive:
            self.waiting = []  # nothing after a ``Connection: close`` request is read
        self._enqueue(req)

    def _rebuilt(self) -> bytes:
        """The request just parsed, as bytes again (its body re-framed with Content-Length)."""
        parser = self.parser
        body = b"".join(self.body)
        lines = [
            b"%b %b HTTP/%b\r\n" % (parser.get_method(), bytes(self.url), parser.get_http_version().encode())
        ]
        for k, v in self.raw_headers:
            if k.lower() not in (b"content-length", b"transfer-encoding"):
                lines.append(b"%b: %b\r\n" % (k, v))
        if body or parser.get_method() in (b"POST", b"PUT", b"PATCH"):
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        lines.append(body)
        return b"".join(lines)

    # -- requests and answers -------------------------------------------------------------------

    def _enqueue(self, req: LeanRequest) -> None:
        self.front.entry.calls += 1
        if self.task is None and not self.queue:
            self.task = asyncio.get_running_loop().create_task(self._answer(req))
        else:
            self.queue.append(req)

    async def _answer(self, req: LeanRequest) -> None:
        while True:
            try:
                try:
                    resp = await self.front.handler(req)
                except web.HTTPException as exc:  # raised past the guard (a redirect): sent as aiohttp would
                    resp = exc
                if type(resp) is not LeanReply:
                    resp = _from_aiohttp(resp)
                if not resp._eof and not self.closing:
                    await resp.prepare(req)
                    await resp.write_eof()
            except asyncio.CancelledError:
                return  # the client is gone
            except (ConnectionResetError, ConnectionError):
                pass
            except Exception:
                log.exception("unanswered error on %s %s", req.method, req.path)
                self.transport.close()
                return
            if req.too_large and not req.complete and not self.closing and not await self._linger():
                req.keep_alive = False  # its body did not end: the connection cannot go on
            if not req.keep_alive or self.closing:
                self.closing = True
                self.transport.close()
                return
            if not self.queue:
                break
            req = self.queue.popleft()
        self.task = None
        self.idle_since = time.monotonic()
        if self.waiting is not None:
            self._maybe_hand_over()

    async def _linger(self) -> bool:
        """Read and drop the rest of a body too large to take, up to ``LINGER`` s (as aiohttp
        does): whether it ended (the connection then goes on)."""
        self.lingering = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self.lingering, LINGER)
            return True
        except TimeoutError:
            return False
        finally:
            self.lingering = None

    async def send(self, data: bytes) -> None:
        transport = self.transport
        if self.closing or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        transport.write(data)
        if self.paused:
            if self.drained is None:
                self.drained = asyncio.get_running_loop().create_future()
            await self.drained

    # -- handing the connection to aiohttp ------------------------------------------------------

    def _upgrade_from(self, rest: bytes) -> None:
        """An upgrade request among those rebuilt for aiohttp: it and the bytes after its head
        (``rest``, the new protocol's) go to aiohttp, after the answers before them."""
        if self.divert is None:
            self.divert = bytearray()
        if self.in_message:  # (llhttp may end the message before it pauses)
            self.in_message = False
            self.divert += self._rebuilt()
        self.waiting = [rest] if rest else []
        self._maybe_hand_over()

    def _aiohttp_from_here(self) -> None:
        """The request being parsed and all after it are aiohttp's (its bytes are ``self.raw``)."""
        self.waiting = list(self.raw or ())
        self.divert = bytearray()
        self._maybe_hand_over()

    def _maybe_hand_over(self) -> None:
        if self.task is not None or self.queue or self.closing:
            return  # after the answers before it
        if self.bad:
            self._bad_request()
            return
        data = bytes(self.divert or b"") + b"".join(self.waiting or ())
        proto = self.front.aiohttp()
        transport = self.transport
        self.front.conns.discard(self)
        self.front.entry.handed_over += 1
        self.parser = None  # type: ignore[assignment]
        transport.set_protocol(proto)
        proto.connection_made(transport)
        transport.resume_reading()
        if self.paused:
            proto.pause_writing()
        if data:
            proto.data_received(data)

    def _bad_request(self) -> None:
        """aiohttp's answer to a request it cannot parse (its shape: HTTP/1.0, plain text, closed)."""
        body = self.bad.encode("utf-8", "replace")
        self.transport.write(
            b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            b"Date: %b\r\nServer: %b\r\n\r\n%b"
            % (len(body), _date().encode(), SERVER_SOFTWARE.encode(), body)
        )
        self.closing = True
        self.transport.close()


class Front:
    """The server: ``start`` listens, ``close`` stops accepting, lets calls finish, closes the rest."""

    def __init__(self, app: web.Application, runner: web.AppRunner, entry: Entry) -> None:
        self.app = app
        self.entry = entry
        self.handler = entry.handler
        self.aiohttp: Callable[[], Any] = runner.server  # type: ignore[assignment]
        self.max_size = entry.max_body
        self.conns: set[_Conn] = set()
        self.server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False, ssl_context: Any = None) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _Conn(self),
            host,
            port,
            backlog=4096,
            reuse_address=True,
            reuse_port=reuse_port or None,
            ssl=ssl_context,
        )
        self._sweeper = loop.call_later(60.0, self._sweep)
        self.entry.serving = True
        sockets = self.server.sockets
        return int(sockets[0].getsockname()[1]) if sockets else port

    def _sweep(self) -> None:
        now = time.monotonic()
        for conn in list(self.conns):
            if conn.task is None and not conn.in_message and now - conn.idle_since > KEEPALIVE:
                conn.closing = True
                conn.transport.close()
        self._sweeper = asyncio.get_running_loop().call_later(60.0, self._sweep)

    async def close(self, timeout: float) -> None:
        """Stop accepting; idle connections close now, busy ones after their call (up to ``timeout``)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.server is not None:
            self.server.close()
        deadline = time.monotonic() + timeout
        while True:
            busy = [c for c in self.conns if c.task is not None]
            for conn in [c for c in self.conns if c.task is None and not c.in_message]:
                conn.closing = True
                conn.transport.close()
            if not busy or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            conn.closing = True
            conn.transport.close()
            if conn.task is not None:
                conn.task.cancel()
        with contextlib.suppress(Exception):
            if self.server is not None:
                await asyncio.wait_for(self.server.wait_closed(), 1.0)
