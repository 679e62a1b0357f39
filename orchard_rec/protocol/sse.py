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
    """Feed bytes, get complete ``(event_name, data)`` pairs."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are buffered."""
        return bool(self._buf)

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        self._buf += chunk
        out: list[tuple[str | None, str]] = []
        while True:
            m = _BOUNDARY.search(self._buf)
            if m is None:
                return out
            block, self._buf = self._buf[: m.start()], self._buf[m.end() :]
            ev = _parse_block(block)
            if ev is not None:
                out.append(ev)

    def flush(self) -> list[tuple[str | None, str]]:
        """The last event, if the stream ended without a blank line."""
        block, self._buf = self._buf, b""
        ev = _parse_block(block) if block.strip() else None
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


def _parse_block(block: bytes) -> tuple[str | None, str] | None:
    name: str | None = None
    data: list[str] = []
    for raw in _LINE.split(block):
        line = raw.decode("utf-8", errors="replace")
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    if name is None and not data:
        return None
    return name, "\n".join(data)


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
