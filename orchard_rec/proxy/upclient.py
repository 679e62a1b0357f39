"""The proxy's HTTP/1.1 client to its upstreams: keep-alive connections, the answer parsed by
httptools (llhttp), aiohttp's own exception classes.

Why not aiohttp's ``ClientSession``: on a small call it is most of a forwarder's CPU. The bare
aiohttp forwarder (``bench/floor.py``) spends ~99 us of CPU a call at c=32 on this machine, the
same forwarder with this client ~40 (``bench/PROFILE.md`` round 15): ``ClientSession._request``
builds a ``ClientRequest``, a ``ClientResponse``, a payload object, a ``StreamReader``, a trace
context and two timers per call, and wakes a coroutine per read. Here a call is one write of its
head and body, an llhttp parser fed what arrives, and the body handed to the reader in the
callbacks; a streamed body wakes its reader once per arrival.

What it does, as aiohttp's client did for the proxy (``tests/proxy/test_upclient.py``):

- Requests: ``Host`` (no port when it is the scheme's default), the caller's headers, ``Accept:
  */*`` when the caller sent no Accept, ``Content-Type: application/octet-stream`` for a body
  without one, ``Content-Length`` (``0`` for a POST, PUT or PATCH without a body); the path and
  query as yarl quotes them.
- Answers: a body by ``Content-Length``, chunked, or until the server closes; 1xx answers other
  than 101 skipped; HEAD, 204 and 304 without a body; ``Content-Encoding`` gzip and deflate
  decoded (br and zstd too when their module is installed), others passed as sent.
- Keep-alive: a connection goes back to the pool as soon as its answer is complete (the body is
  the reader's by then), unless either side said ``close``; an idle one is given up after
  ``keepalive`` seconds or as soon as the server closes it, and is never written to once closed.
  A request that a reused connection drops before any byte of the answer is sent once more on a
  new connection when its method is idempotent (as aiohttp does); a POST never is: the server
  may have started it.
- Back pressure: while more than 64 KiB of a streamed body wait unread, the socket is not read.
- Timeouts: ``connect_timeout`` for a new connection (``aiohttp.ConnectionTimeoutError``);
  ``read_timeout`` seconds without a byte while the reader waits for one
  (``aiohttp.SocketTimeoutError``; time the reader spends elsewhere, handing a chunk to a slow
  client, does not count), checked by one timer per answer that wakes once per period.
- Errors: refused or unreachable ``aiohttp.ClientConnectorError`` (TLS:
  ``ClientConnectorCertificateError`` / ``ClientConnectorSSLError``), closed before the whole head
  ``ServerDisconnectedError``, closed or broken mid-body ``ClientPayloadError``, an answer that is
  not HTTP ``BadAnswer`` (an ``aiohttp.ClientError``).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import zlib
from collections import deque
from collections.abc import Mapping
from typing import Any

import aiohttp
import httptools
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = ["BadAnswer", "UpResponse", "UpstreamClient"]

HIGH_WATER = 1 << 16
"""Bytes of a streamed body waiting unread above which the socket is not read."""

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_BODILESS = frozenset({"POST", "PUT", "PATCH"})  # methods that say Content-Length: 0 without a body
_PLAIN_TARGET = re.compile(r"/[A-Za-z0-9\-._~/!$&'()*+,;=:@?]*")
"""A request target yarl leaves as it is (no escapes, no dot segments checked separately)."""


_SKIP, _HOST, _ACCEPT, _CTYPE, _CONNECTION = 1, 2, 3, 4, 5
_KIND_OF = {"content-length": _SKIP, "transfer-encoding": _SKIP, "host": _HOST, "accept": _ACCEPT}
_KIND_OF["content-type"] = _CTYPE
_KIND_OF["connection"] = _CONNECTION
_KINDS: dict[str, int] = {}
"""What a header's spelling is to the request's head (0: a header like any), learned once, bounded."""


def _kind(name: str) -> int:
    kind = _KIND_OF.get(name.lower(), 0)
    if len(_KINDS) < 4096:
        _KINDS[name] = kind
    return kind


class BadAnswer(aiohttp.ClientError):
    """The upstream's answer is not HTTP/1.1 the client can parse."""


def _decoder(encoding: str) -> Any:
    """A decompressor object for a ``Content-Encoding`` (``decompress``/``flush``), or None."""
    enc = encoding.strip().lower()
    if enc in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc == "deflate":
        return _Deflate()
    if enc == "br":
        try:
            import brotli  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return None
        return _Brotli(brotli.Decompressor())
    if enc == "zstd":
        try:
            import zstandard
        except ImportError:
            return None
        return zstandard.ZstdDecompressor().decompressobj()
    return None


class _Deflate:
    """``deflate`` as servers send it: zlib-wrapped (RFC 9110) or raw (as some do)."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        self._d: Any = None

    def decompress(self, data: bytes) -> bytes:
        if self._d is None:
            wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0
            self._d = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return self._d.decompress(data)

    def flush(self) -> bytes:
        return b"" if self._d is None else self._d.flush()


class _Brotli:
    __slots__ = ("_d",)

    def __init__(self, d: Any) -> None:
        self._d = d

    def decompress(self, data: bytes) -> bytes:
        return self._d.process(data)

    def flush(self) -> bytes:
        return b""


class _Origin:
    """One scheme, host and port: its pooled connections and how to reach it."""

    __slots__ = ("host", "host_line", "idle", "key", "port", "ssl", "url")

    def __init__(self, origin: str, ssl_context: ssl.SSLContext | None) -> None:
        u = URL(origin)
        if u.scheme not in ("http", "https") or not u.host:
            raise aiohttp.InvalidURL(origin)
        self.url = origin
        self.host: str = u.host
        self.port: int = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = None
        if u.scheme == "https":
            self.ssl = ssl_context or ssl.create_default_context()
        self.host_line = f"Host: {u.host_port_subcomponent or self.host}"
        self.idle: list[_Conn] = []
        self.key = ConnectionKey(
            self.host, self.port, self.ssl is not None, ssl_context or True, None, None, None, None
        )


class _Conn(asyncio.Protocol):
    """A connection: reads into the answer it is reading (``resp``), if any."""

    __slots__ = ("closed", "idle_since", "origin", "owner", "resp", "transport")

    def __init__(self, owner: UpstreamClient, origin: _Origin) -> None:
        self.owner = owner
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.resp: UpResponse | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.owner._conns.add(self)

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is None:  # an idle connection the server talks on: not HTTP/1.1 as we use it
            self.abort()
            return
        r._last = time.monotonic()
        try:
            r._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            r._lost(BadAnswer("the upstream switched protocols"))
            self.abort()
        except httptools.HttpParserError as exc:
            err = r._error
            if err is None:
                if r.status >= 200:  # the body's framing (a chunk size, a chunk's end)
                    err = aiohttp.ClientPayloadError(f"Response payload is not completed: {exc}")
                else:
                    err = BadAnswer(f"the upstream's answer is not HTTP/1.1: {exc}")
            r._lost(err)
            self.abort()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.owner._conns.discard(self)
        r, self.resp = self.resp, None
        if r is not None:
            r._eof(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class UpResponse:
    """An upstream's answer: ``status``, ``reason``, ``headers`` once the head is in; the body by
    ``read()`` or ``content.iter_any()`` (``content`` is the answer itself)."""

    __slots__ = (
        "_began",
        "_buffered",
        "_chunks",
        "_close",
        "_conn",
        "_decode",
        "_done",
        "_error",
        "_exc",
        "_hdrs",
        "_head",
        "_last",
        "_method",
        "_parser",
        "_paused",
        "_reason",
        "_timeout",
        "_timer",
        "_waiter",
        "_whole",
        "content_type",
        "headers",
        "reason",
        "status",
    )

    def __init__(self, conn: _Conn, method: str, timeout: float | None) -> None:
        self._conn: _Conn | None = conn
        self._method = method
        self._parser: Any = httptools.HttpResponseParser(self)
        """(Dropped at the end: parser and answer refer to each other, a cycle only the collector frees.)"""
        self._hdrs: list[tuple[str, str]] = []
        self._reason = b""
        self._began = False
        self._close = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._head: asyncio.Future[None] | None = None
        self._done = False
        self._exc: BaseException | None = None
        self._error: BaseException | None = None
        self._decode: Any = None
        self._paused = False
        self._whole = False
        self._last = time.monotonic()
        self._timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self.status = 0
        self.reason = ""
        self.content_type = "application/octet-stream"
        self.headers: CIMultiDictProxy[str] = _EMPTY

    # -- llhttp's callbacks (on the connection's data_received) --------------------------------

    def on_message_begin(self) -> None:
        if self._head is not None and self._head.done() and self.status >= 200:
            self._error = BadAnswer("the upstream sent a second answer to one request")
            raise self._error
        self._began = True

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._hdrs.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # informational: the real answer follows
            self._hdrs = []
            self._reason = b""
            return
        self.status = status
        self.reason = self._reason.decode("utf-8", "surrogateescape")
        headers = CIMultiDict(self._hdrs)
        self.headers = CIMultiDictProxy(headers)
        ctype = headers.get("Content-Type")
        if ctype:
            self.content_type = ctype.partition(";")[0].strip().lower()
        enc = headers.get("Content-Encoding")
        if enc:
            self._decode = _decoder(enc)
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)
        if self._method == "HEAD":  # llhttp would wait for the body Content-Length announces
            self._finish(keep=self._parser.should_keep_alive() and not self._close)

    def on_body(self, body: bytes) -> None:
        if self._done:  # a HEAD answer is over at its head
            return
        if self._decode is not None:
            try:
                body = self._decode.decompress(body)
            except Exception as exc:
                self._error = aiohttp.ClientPayloadError(f"cannot decode the upstream's body: {exc}")
                raise
            if not body:
                return
        self._chunks.append(body)
        self._buffered += len(body)
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)
        if self._buffered > HIGH_WATER and not self._whole and not self._paused:
            conn = self._conn
            if conn is not None and conn.transport is not None:
                self._paused = True
                conn.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.status == 0 or self._done:  # the end of a 1xx; a HEAD answer ended at its head
            return
        if self._decode is not None:
            try:
                tail = self._decode.flush()
            except Exception as exc:
                self._error = aiohttp.ClientPayloadError(f"cannot decode the upstream's body: {exc}")
                raise
            if tail:
                self._chunks.append(tail)
                self._buffered += len(tail)
        self._finish(keep=self._parser.should_keep_alive() and not self._close)

    # -- the connection's end -----------------------------------------------------------------

    def _end(self) -> _Conn | None:
        """Mark the answer over: its parser dropped (parser and answer refer to each other), its
        timer stopped, its connection detached (returned: the caller pools or closes it)."""
        self._done = True
        self._parser = None
        self._stop_timer()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.resp = None
        return conn

    def _finish(self, *, keep: bool) -> None:
        """The whole answer is in: the connection back to the pool (or closed), the reader woken."""
        conn = self._end()
        if conn is not None:
            if self._paused and conn.transport is not None:
                self._paused = False
                conn.transport.resume_reading()
            if keep and not conn.closed:
                conn.owner._put(conn)
            else:
                conn.abort()
        self._wake()

    def _eof(self, exc: Exception | None) -> None:
        """The connection closed before the answer was complete."""
        if self._done:
            return
        head = self._head
        if head is not None and head.done() and self.status >= 200:
            headers = self.headers
            if (
                exc is None
                and "Content-Length" not in headers
                and "chunked" not in headers.get("Transfer-Encoding", "").lower()
            ):  # a body that ends when the server closes
                self._conn = None
                if self._decode is not None:
                    try:
                        tail = self._decode.flush()
                    except Exception as err:
                        self._lost(aiohttp.ClientPayloadError(f"cannot decode the upstream's body: {err}"))
                        return
                    if tail:
                        self._chunks.append(tail)
                self._end()
                self._wake()
                return
            why = f": {exc}" if exc is not None else ""
            self._lost(aiohttp.ClientPayloadError(f"Response payload is not completed{why}"))
            return
        self._lost(aiohttp.ServerDisconnectedError())

    def _lost(self, exc: BaseException) -> None:
        if self._done:
            return
        self._exc = exc
        conn = self._end()
        if conn is not None:
            conn.abort()
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    # -- the read timeout: one timer an answer, waking once per period ---------------------------

    def _start_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timeout:
            self._timer = loop.call_later(self._timeout, self._check)

    def _stop_timer(self) -> None:
        t = self._timer
        if t is not None:
            self._timer = None
            t.cancel()

    def _check(self) -> None:
        self._timer = None
        if self._done or not self._timeout:
            return
        now = time.monotonic()
        waiting = self._waiter is not None or (self._head is not None and not self._head.done())
        if not waiting:  # the reader is busy elsewhere: its time does not count
            self._last = now
        idle = now - self._last
        if idle < self._timeout:
            self._timer = asyncio.get_running_loop().call_later(self._timeout - idle, self._check)
            return
        self._lost(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))

    # -- the reader's side ----------------------------------------------------------------------

    async def _wait(self) -> None:
        """Until the callbacks wake the reader (``on_body``, the end); ``_last``: since when it waits."""
        w = asyncio.get_running_loop().create_future()
        self._waiter = w
        self._last = time.monotonic()
        try:
            await w
        finally:
            if self._waiter is w:
                self._waiter = None

    async def read(self) -> bytes:
        """The whole body (decoded)."""
        self._whole = True
        if self._paused:
            self._resume()
        while not self._done:
            await self._wait()
        if self._exc is not None:
            raise self._exc
        chunks = self._chunks
        if len(chunks) == 1:
            out = chunks.popleft()
        else:
            out = b"".join(chunks)
            chunks.clear()
        self._buffered = 0
        return out

    @property
    def content(self) -> UpResponse:
        """The body's reader (``content.iter_any()``, as aiohttp's): the answer itself (a property,
        not an attribute: an object that refers to itself is a cycle only the collector frees)."""
        return self

    def iter_any(self) -> UpResponse:
        """``async for chunk in resp.content.iter_any()``: the body's chunks as they arrive."""
        return self

    def __aiter__(self) -> UpResponse:
        return self

    async def __anext__(self) -> bytes:
        chunks = self._chunks
        while not chunks:
            if self._exc is not None:
                raise self._exc
            if self._done:
                raise StopAsyncIteration
            # ``_wait`` written out (a coroutine less per chunk); the callbacks clear the waiter
            w = self._waiter = asyncio.get_running_loop().create_future()
            self._last = time.monotonic()
            await w
        b = chunks.popleft()
        self._buffered -= len(b)
        if self._paused and self._buffered <= HIGH_WATER:
            self._resume()
        return b

    def _resume(self) -> None:
        self._paused = False
        conn = self._conn
        if conn is not None and conn.transport is not None:
            conn.transport.resume_reading()

    def set_exception(self, exc: BaseException) -> None:
        """Fail the reader with ``exc`` (the connection is closed)."""
        self._lost(exc)

    def release(self) -> None:
        """Done with the answer: a connection still reading it is closed (its body was not read
        to the end), else it is in the pool already."""
        if not self._done:
            self._lost(aiohttp.ClientConnectionError("the answer was released before its end"))
            self._exc = None

    close = release

    async def __aenter__(self) -> UpResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


_EMPTY: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class UpstreamClient:
    """Keep-alive HTTP/1.1 connections to the upstreams (see the module's docstring)."""

    def __init__(
        self,
        *,
        connect_timeout: float | None = 10.0,
        read_timeout: float | None = 600.0,
        keepalive: float = 15.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self.ssl_context = ssl_context
        self._origins: dict[str, _Origin] = {}
        self._conns: set[_Conn] = set()
        self._opened = 0
        self._reused = 0
        self._closed = False
        self._sweep: asyncio.TimerHandle | None = None

    def stats(self) -> dict[str, int]:
        return {
            "opened": self._opened,
            "reused": self._reused,
            "idle": sum(len(o.idle) for o in self._origins.values()),
        }

    async def close(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for o in self._origins.values():
            o.idle.clear()
        for c in list(self._conns):
            c.abort()
        self._conns.clear()

    def _put(self, conn: _Conn) -> None:
        if self._closed:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        conn.origin.idle.append(conn)
        if self._sweep is None:  # idle connections are closed after ``keepalive`` s, as aiohttp's are
            self._sweep = asyncio.get_running_loop().call_later(self.keepalive, self._expire)

    def _expire(self) -> None:
        """Close the connections idle for ``keepalive`` s (the oldest are first in each pool)."""
        self._sweep = None
        old = time.monotonic() - self.keepalive
        left = False
        for o in self._origins.values():
            idle = o.idle
            n = 0
            while n < len(idle) and (idle[n].idle_since <= old or idle[n].closed):
                idle[n].abort()
                n += 1
            if n:
                del idle[:n]
            left = left or bool(idle)
        if left and not self._closed:
            self._sweep = asyncio.get_running_loop().call_later(self.keepalive / 2, self._expire)

    def _target(self, url: str) -> tuple[_Origin, str]:
        start = url.find("://")
        cut = url.find("/", start + 3) if start > 0 else -1
        if cut < 0:
            origin_url, target = url, "/"
        else:
            origin_url, target = url[:cut], url[cut:]
        origin = self._origins.get(origin_url)
        if origin is None:
            if len(self._origins) > 1024:  # URLs of the proxy's own making: a handful of servers
                self._origins.clear()
            origin = self._origins[origin_url] = _Origin(origin_url, self.ssl_context)
        if _PLAIN_TARGET.fullmatch(target) is None or "/." in target or target.endswith("?"):
            target = URL(url).raw_path_qs
        return origin, target

    def _head(
        self, method: str, origin: _Origin, target: str, headers: Mapping[str, str] | None, body: Any
    ) -> tuple[bytes, bool]:
        """The request's head, and whether the caller said ``Connection: close``."""
        lines = [f"{method} {target} HTTP/1.1", ""]  # [1]: the Host line
        host = accept = ctype = close = False
        if headers:
            kinds = _KINDS
            for k, v in headers.items():
                kind = kinds.get(k)
                if kind is None:
                    kind = _kind(k)
                if kind:
                    if kind == _SKIP:
                        continue
                    if kind == _HOST:
                        host = True
                        lines[1] = f"{k}: {v}"
                        continue
                    if kind == _ACCEPT:
                        accept = True
                    elif kind == _CTYPE:
                        ctype = True
                    elif "close" in v.lower():  # the caller's Connection: close: not pooled after
                        close = True
                lines.append(f"{k}: {v}")
        if not host:
            lines[1] = origin.host_line
        if not accept:
            lines.append("Accept: */*")
        if body is not None:
            if not ctype:
                lines.append("Content-Type: application/octet-stream")
            lines.append(f"Content-Length: {len(body)}")
        elif method in _BODILESS:
            lines.append("Content-Length: 0")
        lines.append("\r\n")
        text = "\r\n".join(lines)
        n = len(lines)  # line breaks: one a line; any more came inside a header
        if text.count("\n") != n or text.count("\r") != n:
            raise ValueError("Newline or carriage return character detected in HTTP header")
        return text.encode("utf-8", "surrogateescape"), close

    async def _connect(self, origin: _Origin) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Conn(self, origin),
                    origin.host,
                    origin.port,
                    ssl=origin.ssl,
                    server_hostname=origin.host if origin.ssl is not None else None,
                )
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {origin.url}") from exc
        except ssl.SSLCertVerificationError as exc:
            raise aiohttp.ClientConnectorCertificateError(origin.key, exc) from exc
        except ssl.SSLError as exc:
            raise aiohttp.ClientConnectorSSLError(origin.key, exc) from exc
        except OSError as exc:
            raise aiohttp.ClientConnectorError(origin.key, exc) from exc
        self._opened += 1
        return conn

    def _pooled(self, origin: _Origin) -> _Conn | None:
        idle = origin.idle
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            t = conn.transport
            if conn.closed or t is None or t.is_closing() or now - conn.idle_since > self.keepalive:
                conn.abort()
                continue
            return conn
        return None

    async def request(
        self,
        method: str,
        url: str,
        *,
        data: bytes | bytearray | memoryview | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> UpResponse:
        """Send the request; the answer once its status line and headers are in."""
        if self._closed:
            raise aiohttp.ClientConnectionError("the upstream client is closed")
        origin, target = self._target(url)
        head, close = self._head(method, origin, target, headers, data)
        retry = method in IDEMPOTENT
        while True:
            conn = self._pooled(origin)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(origin)
            else:
                self._reused += 1
            resp = UpResponse(conn, method, self.read_timeout)
            if close:
                resp._close = True
            loop = asyncio.get_running_loop()
            resp._head = loop.create_future()
            conn.resp = resp
            t = conn.transport
            assert t is not None
            if data:
                t.writelines((head, data))
            else:
                t.write(head)
            resp._start_timer(loop)
            try:
                await resp._head
            except aiohttp.ServerDisconnectedError:
                if reused and retry and not resp._began:
                    retry = False  # once, on a new connection (as aiohttp does)
                    continue
                raise
            except BaseException:
                resp._lost(aiohttp.ClientConnectionError("the request was cancelled"))
                raise
            return resp
