"""A raw HTTP/1.1 client over a blocking socket, for pinning what a server puts on the wire.

``RawClient(port)`` connects to 127.0.0.1 with every socket operation bounded (``timeout``), so a
server that hangs fails a test instead of the suite. ``send`` writes bytes exactly as given (a
head split byte by byte, several requests in one write ...); ``response(method)`` reads the next
answer off the connection and returns it with its framing (``Content-Length``, chunked, or until
the server closes) and the bytes as they came, so pipelined answers are read one after the other.
``closed()`` says whether the server closed its side.

It parses only what a test needs and shares no code with any server under test.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any

HOST = "127.0.0.1"


@dataclass
class RawResponse:
    """One answer as received."""

    version: str  # "HTTP/1.1"
    status: int
    reason: str
    headers: list[tuple[str, str]]  # in order, names as sent
    body: bytes  # de-chunked
    framing: str  # "length", "chunked", "close" or "none" (HEAD, 1xx, 204, 304)
    raw: bytes  # head and body as they came off the wire
    chunks: list[bytes]  # the chunks of a chunked body, as framed by the server

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def header(self, name: str) -> str | None:
        vs = self.values(name)
        assert len(vs) <= 1, f"{name} sent {len(vs)} times: {vs}"
        return vs[0] if vs else None

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def names(self) -> set[str]:
        return {k.lower() for k, _ in self.headers}


class RawClient:
    """One TCP connection to the server under test."""

    def __init__(self, port: int, timeout: float = 5.0, rcvbuf: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # before connect: the window the server sees
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False
        self.received = 0  # bytes read off the socket so far
        self.recv_size = 65536  # a slow reader: small reads ...
        self.pause = 0.0  # ... with a sleep before each

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def trickle(self, data: bytes, step: int = 1, pause: float = 0.0) -> None:
        """``data`` in writes of ``step`` bytes (TCP_NODELAY: each its own segment)."""
        for i in range(0, len(data), step):
            self.sock.sendall(data[i : i + step])
            if pause:
                time.sleep(pause)

    def _fill(self) -> bool:
        if self.eof:
            return False
        if self.pause:
            time.sleep(self.pause)
        try:
            data = self.sock.recv(self.recv_size)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        self.received += len(data)
        return True

    def read_until(self, marker: bytes) -> None:
        """Read until ``marker`` has arrived (it stays in the buffer: ``response`` still reads it)."""
        while marker not in self.buf:
            if not self._fill():
                raise EOFError(f"connection closed before {marker!r}")

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError(f"connection closed with {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise EOFError(f"connection closed inside a line: {self.buf[:200]!r}")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def head(self) -> tuple[str, int, str, list[tuple[str, str]], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise EOFError(f"connection closed before a whole head: {self.buf[:200]!r}")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, status, reason = (lines[0].split(" ", 2) + [""])[:3]
        headers = [(k, v.strip()) for k, _, v in (h.partition(":") for h in lines[1:])]
        return version, int(status), reason, headers, head + b"\r\n\r\n"

    def response(self, method: str = "GET", *, interim: bool = False) -> RawResponse:
        """The next answer (a 1xx is returned as it is only with ``interim``; else skipped)."""
        while True:
            version, status, reason, headers, raw = self.head()
            if 100 <= status < 200 and status != 101 and not interim:
                continue
            break
        lower = [(k.lower(), v) for k, v in headers]
        te = [v.lower() for k, v in lower if k == "transfer-encoding"]
        cl = [int(v) for k, v in lower if k == "content-length"]
        chunks: list[bytes] = []
        if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
            return RawResponse(version, status, reason, headers, b"", "none", raw, chunks)
        if te and te[-1].endswith("chunked"):
            wire = b""
            while True:
                size_line = self._line()
                wire += size_line + b"\r\n"
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    while (trailer := self._line()) != b"":
                        wire += trailer + b"\r\n"
                    wire += b"\r\n"
                    break
                data = self._take(size + 2)
                assert data.endswith(b"\r\n"), f"chunk not followed by CRLF: {data[-10:]!r}"
                wire += data
                chunks.append(data[:-2])
            return RawResponse(
                version, status, reason, headers, b"".join(chunks), "chunked", raw + wire, chunks
            )
        if cl:
            assert len(set(cl)) == 1, f"Content-Length {cl}"
            body = self._take(cl[0])
            return RawResponse(version, status, reason, headers, body, "length", raw + body, chunks)
        while self._fill():
            pass
        body, self.buf = self.buf, b""
        return RawResponse(version, status, reason, headers, body, "close", raw + body, chunks)

    def closed(self, within: float = 2.0) -> bool:
        """Whether the server closes its side within ``within`` s with nothing more sent (bytes
        that do come are an error: the test read every answer)."""
        if self.eof:
            return True
        old = self.sock.gettimeout()
        self.sock.settimeout(within)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            data = b""
        finally:
            self.sock.settimeout(old)
        assert not data and not self.buf, f"unexpected bytes: {(self.buf + data)[:200]!r}"
        self.eof = True
        return True


def request(
    method: str,
    target: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    version: str = "HTTP/1.1",
) -> bytes:
    """A request, byte for byte: ``Host``, the given headers, ``Content-Length`` when there is a body."""
    h = {"Host": "127.0.0.1", **(headers or {})}
    if body is not None and not any(k.lower() in ("content-length", "transfer-encoding") for k in h):
        h["Content-Length"] = str(len(body))
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode("latin-1") + (body or b"")


def post_json(target: str, obj: Any, headers: dict[str, str] | None = None, **kw: Any) -> bytes:
    return request(
        "POST",
        target,
        json.dumps(obj).encode(),
        {"Content-Type": "application/json", **(headers or {})},
        **kw,
    )


def chunked(*pieces: bytes) -> bytes:
    """``pieces`` as a chunked body, with its last chunk."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
