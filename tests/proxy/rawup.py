"""A raw HTTP/1.1 upstream for client tests: every byte, pause and close is the test's own.

``RawUpstream(handler)`` listens on 127.0.0.1 (port 0) with ``asyncio.start_server`` and runs
``handler(conn)`` for each connection the client opens. ``conn.request()`` reads one request
(head, then a ``Content-Length`` body) exactly as it arrived; the handler answers with
``conn.send(bytes)`` and closes, half-closes or stays silent as the test needs. Connections and
requests are kept in order, so a test sees what the client sent and on which connection.
It shares no code with the client under test: it parses only what a test client sends.
The helpers at the end run a client against it with every await bounded, so a bug fails a test
instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

MAX_HEAD = 64 * 1024


@dataclass
class RawRequest:
    """One request as the upstream received it."""

    line: str  # "GET /p?q HTTP/1.1"
    headers: list[tuple[str, str]]  # in the order sent, names as sent
    body: bytes
    raw: bytes  # the head (through the blank line) and the body, byte for byte

    @property
    def method(self) -> str:
        return self.line.split(" ")[0]

    @property
    def target(self) -> str:
        return self.line.split(" ")[1]

    def values(self, name: str) -> list[str]:
        """Every value of the header ``name`` (case-insensitive), in order."""
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class Conn:
    """One connection the client opened; ``index`` counts from 0 in the order accepted."""

    index: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    requests: list[RawRequest] = field(default_factory=list)
    eof: asyncio.Event = field(default_factory=asyncio.Event)  # set when the client closed its side
    leftover: bytes = b""  # bytes read by ``wait_eof`` after the last request

    async def request(self) -> RawRequest | None:
        """The next request, or None if the client closed the connection before sending one."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            self.leftover += exc.partial
            self.eof.set()
            return None
        except ConnectionError:
            self.eof.set()
            return None
        lines = head[:-4].decode("latin-1").split("\r\n")
        headers = [(k, v.strip()) for k, _, v in (h.partition(":") for h in lines[1:])]
        length = [int(v) for k, v in headers if k.lower() == "content-length"]
        body = await self.reader.readexactly(length[0]) if length else b""
        req = RawRequest(lines[0], headers, body, head + body)
        self.requests.append(req)
        return req

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    async def wait_eof(self) -> bytes:
        """Read until the client closes its side; return what it sent meanwhile."""
        with contextlib.suppress(ConnectionError):
            while chunk := await self.reader.read(65536):
                self.leftover += chunk
        self.eof.set()
        return self.leftover

    def close(self) -> None:
        self.writer.close()

    def reset(self) -> None:
        """Drop the connection with a TCP reset (linger 0), not a FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    def half_close(self) -> None:
        """FIN to the client while still reading what it sends."""
        self.writer.write_eof()


Handler = Callable[[Conn], Awaitable[None]]


class RawUpstream:
    """``async with RawUpstream(handler) as up:`` a server at ``up.url``; ``up.conns`` in accept order."""

    def __init__(
        self, handler: Handler, *, ssl_context: ssl.SSLContext | None = None, sndbuf: int = 0
    ) -> None:
        self._handler = handler
        self._ssl = ssl_context
        self._sndbuf = sndbuf
        self.conns: list[Conn] = []
        self.errors: list[BaseException] = []
        self.connected = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[RawRequest]:
        return [r for c in self.conns for r in c.requests]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._sndbuf:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._sndbuf)
        conn = Conn(len(self.conns), reader, writer)
        self.conns.append(conn)
        self.connected.set()
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handler(conn)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client went away: some tests do exactly that
        except Exception as exc:  # a broken fake must fail the test, not vanish
            self.errors.append(exc)
        finally:
            self._tasks.discard(task)

    async def __aenter__(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for conn in self.conns:
            conn.writer.transport.abort()  # handlers blocked on the socket end with ConnectionError
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=0.2)
            for task in pending:  # those blocked elsewhere (an event the test never set)
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        if et is None:
            assert not self.errors, f"the fake upstream failed: {self.errors!r}"


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answer(status: str = "200 OK", body: bytes = b"", headers: tuple[str, ...] = ()) -> bytes:
    """A Content-Length response, byte for byte."""
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)


async def serve_forever(conn: Conn, response: bytes) -> None:
    """Answer every request on ``conn`` with ``response``, its head alone to a HEAD (a keep-alive upstream)."""
    while (req := await conn.request()) is not None:
        conn.send(response if req.method != "HEAD" else response.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n")
        await conn.drain()


# -- running a client against it (the client's class is the test module's: nothing imported here) --

T = TypeVar("T")
LIMIT = 4.0  # a whole test; each client await has its own, shorter bound


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), LIMIT))


async def within(aw: Awaitable[T], seconds: float = 1.5) -> T:
    return await asyncio.wait_for(aw, seconds)


@contextlib.asynccontextmanager
async def upstream_and_client(
    make_client: Callable[..., Any], handler: Handler, **client: Any
) -> AsyncIterator[tuple[RawUpstream, Any]]:
    """A raw upstream and ``make_client(**client)`` (short timeouts by default; closed on exit)."""
    client.setdefault("connect_timeout", 1.0)
    client.setdefault("read_timeout", 1.0)
    async with RawUpstream(handler) as up:
        c = make_client(**client)
        try:
            yield up, c
        finally:
            await within(c.close())


async def get(client: Any, url: str, method: str = "GET", **kw: Any) -> tuple[Any, bytes]:
    """Request, read the whole body, release; ``(response, body)``."""
    resp = await within(client.request(method, url, **kw))
    body = await within(resp.read())
    resp.release()
    return resp, body


async def collect(resp: Any) -> list[bytes]:
    return [chunk async for chunk in resp.content.iter_any()]


def counts(client: Any) -> tuple[int, int, int]:
    """``client.stats()`` as ``(opened, reused, idle)``."""
    s = client.stats()
    return s["opened"], s["reused"], s["idle"]


def redirect(port: int, default: int) -> None:
    """Make this loop's connects to 127.0.0.1:``default`` reach ``port`` (a test may not listen on 80).

    Covers ``loop.create_connection(factory, host, port, ...)`` (also what ``asyncio.open_connection``
    calls) and ``loop.sock_connect(sock, address)``, the ways an asyncio client connects; the client
    still believes it talks to the default port."""
    loop: Any = asyncio.get_running_loop()
    create, sock_connect = loop.create_connection, loop.sock_connect

    async def create_connection(factory: Any, *args: Any, **kw: Any) -> Any:
        if kw.get("port") == default:
            kw["port"] = port
        elif len(args) >= 2 and args[1] == default:
            args = (args[0], port, *args[2:])
        return await create(factory, *args, **kw)

    async def connect(sock: Any, address: Any) -> Any:
        if tuple(address[:2]) == ("127.0.0.1", default):
            address = ("127.0.0.1", port, *address[2:])
        return await sock_connect(sock, address)

    loop.create_connection, loop.sock_connect = create_connection, connect
