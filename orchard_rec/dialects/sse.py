"""Server-sent events: incremental parsing and encoding.

The proxy relays the upstream's bytes as they come; the parser reads them (a copy, for the
record; or to find the end of a stream, by event and never by a substring of the bytes).
The parser follows the WHATWG rules that matter for
LLM APIs: events end at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``),
``event:`` names the event, several ``data:`` lines join with ``\\n``, comment lines
(``:``) are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson

__all__ = [
    "DONE_FRAME",
    "Event",
    "SSEParser",
    "encode",
    "encode_data",
    "last_boundary",
    "parse_block",
    "parse_sse",
    "split_events",
]

Event = tuple[str | None, str]
"""One event: its ``event:`` name (or None) and its ``data:`` lines joined."""

DONE_FRAME = b"data: [DONE]\n\n"
"""The frame that ends an OpenAI chat or completions stream."""

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(rb"\r\n|\n|\r")


class SSEParser:
    """Feed bytes, get complete ``(event_name, data)`` pairs.

    Linear in the bytes fed however an event is chunked: a chunk without a boundary is only
    searched with the last bytes before it (a boundary is at most 4 bytes) and kept aside, and the
    buffered parts are joined once, when an event completes (a 1 MB first event of a 150k-token
    token-mode stream in 16 kB chunks: 385 ms re-searching and re-copying the whole buffer per
    chunk, on the event loop, before this)."""

    __slots__ = ("_parts", "_tail")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        """Bytes of an unfinished event, no boundary among them."""
        self._tail = b""
        """Their last 3 bytes (where a boundary finished by the next chunk may start)."""

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are buffered."""
        return bool(self._parts)

    @property
    def _buf(self) -> bytes:
        return b"".join(self._parts)

    def single(self, chunk: bytes) -> bytes | None:
        """The block of ``chunk`` when it is one whole event on one line ending in ``\\n\\n`` (no CR)
        and nothing is pending: what ``blocks`` gives then, found by two searches (a server writes an
        event a chunk); else None, and nothing is consumed (``blocks`` reads it)."""
        if self._parts or chunk[-2:] != b"\n\n" or chunk.find(b"\n") != len(chunk) - 2 or b"\r" in chunk:
            return None
        return chunk[:-2]

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        return [ev for b in self.blocks(chunk) if (ev := parse_block(b)) is not None]

    def blocks(self, chunk: bytes) -> list[bytes]:
        """The raw blocks (an event's bytes, without the blank line that ends it) completed by
        ``chunk``; ``parse_block`` reads one. For a relay that passes most events on as they are."""
        if not chunk:
            return []
        if self._parts:
            if _boundary(self._tail + chunk, 0)[0] < 0:
                self._parts.append(chunk)
                self._tail = (self._tail + chunk)[-3:]
                return []
            old = sum(map(len, self._parts))
            buf = b"".join(self._parts) + chunk
        else:
            old, buf = 0, chunk
        if b"\r" not in buf:  # blank lines are "\n\n" only: the leftmost ones, as the loop below finds
            out = buf.split(b"\n\n")
            rest = out.pop()
            self._parts = [rest] if rest else []
            self._tail = rest[-3:]
            return out
        out = []
        pos = 0
        while True:  # the first boundary is not in the old bytes but their last 3
            start, end = _boundary(buf, max(pos, old - 3))
            if start < 0:
                break
            out.append(buf[pos:start])
            pos = end
        rest = buf[pos:] if pos else buf
        self._parts = [rest] if rest else []
        self._tail = rest[-3:]
        return out

    def flush(self) -> list[tuple[str | None, str]]:
        """The last event, if the stream ended without a blank line."""
        block = self._buf
        self._parts, self._tail = [], b""
        ev = parse_block(block) if block.strip() else None
        return [ev] if ev is not None else []


def split_events(buf: bytes) -> tuple[list[tuple[str | None, str]], bytes]:
    """The complete events at the start of ``buf`` (which begins at an event boundary), and the rest."""
    p = SSEParser()
    events = p.feed(buf)
    return events, p._buf


def last_boundary(buf: bytes) -> int:
    """Where the bytes after the last blank line of ``buf`` start (0: none)."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buf.rfind(sep)) >= 0]
    return max(ends, default=0)


def _boundary(buf: bytes, pos: int) -> tuple[int, int]:
    """``(start, end)`` of the first blank line at or after ``pos`` (``_BOUNDARY``'s leftmost match),
    ``(-1, -1)`` if none: ``bytes.find`` for the usual ``\\n\\n``, the pattern only from a ``\\r``
    before it (a regular expression scans a 1 MB event at ~50 MB/s)."""
    i = buf.find(b"\n", pos)  # memchr: a line feed is rare in an event (each ends a line)
    while i >= 0 and buf[i + 1 : i + 2] != b"\n":
        i = buf.find(b"\n", i + 1)
    j = buf.find(b"\r", pos) if i < 0 else buf.find(b"\r", pos, i)
    if j >= 0:  # a CR-based boundary may come first; one ending after i + 2 cannot start before i
        m = _BOUNDARY.search(buf, j, len(buf) if i < 0 else i + 2)
        if m is not None:
            return m.start(), m.end()
    return (i, i + 2) if i >= 0 else (-1, -1)


def parse_block(block: bytes) -> tuple[str | None, str] | None:
    """Fields split in bytes and decoded once (``:`` and line ends are ASCII, never inside a UTF-8
    sequence: the same as decoding each line first, without copying a 1 MB line three times)."""
    name: str | None = None
    data: list[bytes] = []
    for raw in _LINE.split(block) if b"\r" in block else block.split(b"\n"):
        if not raw or raw[0] == 0x3A:  # ":" a comment
            continue
        k = raw.find(b":")
        if k < 0:
            field, value = raw, b""
        else:
            field = raw[:k]
            value = raw[k + 2 :] if raw[k + 1 : k + 2] == b" " else raw[k + 1 :]
        if field == b"event":
            name = value.decode("utf-8", errors="replace")
        elif field == b"data":
            data.append(value)
    if name is None and not data:
        return None
    return name, b"\n".join(data).decode("utf-8", errors="replace")


def parse_sse(chunks: Iterable[bytes]) -> list[tuple[str | None, str]]:
    p = SSEParser()
    out: list[tuple[str | None, str]] = []
    for c in chunks:
        out.extend(p.feed(c))
    out.extend(p.flush())
    return out


def encode(name: str | None, data: Any) -> bytes:
    """One event frame: ``event: NAME`` (when named) and ``data: JSON``; a str ``data`` is sent as it is."""
    body = data.encode() if isinstance(data, str) else orjson.dumps(data)
    if name is None:
        return b"data: " + body + b"\n\n"
    return b"event: " + name.encode() + b"\ndata: " + body + b"\n\n"


def encode_data(data: Any) -> bytes:
    """An unnamed event (OpenAI chat and completions chunks)."""
    return encode(None, data)
