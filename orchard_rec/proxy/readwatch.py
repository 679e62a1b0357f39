"""The upstream's read timeout (``--read-timeout``) over a relayed event stream, at one timer per
timeout period instead of one per chunk.

aiohttp enforces ``sock_read`` by cancelling and re-arming a timer on every read of the socket: a
``TimerHandle`` built and pushed on the event loop's heap per relayed chunk (~1.8 µs a chunk with
2,000 streams open, the heap holding their timers and the cancelled ones; the bare forwarder sets no
``sock_read`` and pays none of it). ``ReadWatch`` takes the timeout over for the stream's body:
the connection's own timer is switched off (``read_timeout = None``: its next read drops the timer
armed at the headers, which until then still fires as before) and one timer of ours wakes once per
period, looks whether a chunk arrived since (the relay's ``Capture.arrivals``, one entry a chunk)
and, when the upstream was silent for the whole timeout while the relay waited on it, fails the
stream exactly as aiohttp does (``SocketTimeoutError`` on the connection and its payload: the relay
reads it as an upstream that broke off). While the relay hands a chunk on (``busy``: a slow
client, the spool line before the last byte) the upstream is not being read, and its silence
does not count: aiohttp stops its clock too when the client's back pressure pauses the reading.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

__all__ = ["ReadWatch"]


class ReadWatch:
    """The read timeout of ``up``'s body, fed by ``arrivals`` (one monotonic time per chunk read)."""

    __slots__ = ("_arrivals", "_handle", "_last", "_seen", "_timeout", "_up", "busy")

    def __init__(self, up: aiohttp.ClientResponse, arrivals: list[float]) -> None:
        self.busy = False
        """The relay is handing a chunk on (not waiting on the upstream)."""
        self._up = up
        self._arrivals = arrivals
        self._handle: asyncio.TimerHandle | None = None
        conn = up.connection
        proto = conn.protocol if conn is not None else None
        timeout = proto.read_timeout if proto is not None else None
        self._timeout = timeout or 0.0
        self._seen = len(arrivals)
        self._last = time.monotonic()
        if proto is None or not timeout:
            return
        proto.read_timeout = None  # the connection's own timer: off from its next read on
        self._handle = asyncio.get_running_loop().call_later(timeout, self._check)

    def _check(self) -> None:
        now = time.monotonic()
        n = len(self._arrivals)
        if n != self._seen:  # chunks came since the last look: silent since the last one
            self._seen, self._last = n, self._arrivals[-1]
        if self.busy:
            self._last = now
        idle = now - self._last
        if idle < self._timeout:
            self._handle = asyncio.get_running_loop().call_later(self._timeout - idle, self._check)
            return
        self._handle = None
        conn = self._up.connection
        if conn is None or conn.protocol is None:  # released: the stream is over
            return
        exc = aiohttp.SocketTimeoutError("Timeout on reading data from socket")  # aiohttp's own
        conn.protocol.set_exception(exc)
        self._up.content.set_exception(exc)

    def close(self) -> None:
        """The stream is over (read to its end, or broken): no more looks."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
