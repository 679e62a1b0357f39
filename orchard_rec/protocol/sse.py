"""Incremental server-sent-events parsing, for recording (never for relaying).

The proxy relays the upstream's bytes as they come; this parser only reads a copy
to rebuild the events for the record. It follows the WHATWG rules that matter for
LLM APIs: events end at a blank line (``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``),
``event:`` names the event, several ``data:`` lines join with ``\\n``, comment lines
(``:``) are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["TERMINAL_EVENTS", "SSEParser", "parse_sse"]

TERMINAL_EVENTS = (
    b"data: [DONE]",
    b"response.completed",
    b"response.incomplete",
    b"response.failed",
    b"message_stop",
)
"""Bytes that mark the last event of a stream in each dialect (a client may hang up right after)."""

_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(rb"\r\n|\n|\r")


class SSEParser:
    """Feed bytes, get complete ``(event_name, data)`` pairs."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

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
