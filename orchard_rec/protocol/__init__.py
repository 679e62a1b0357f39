"""The wire dialects: what OpenAI Chat / Completions / Responses and Anthropic Messages
requests, answers, event streams and errors look like, and how each translates to and from chat.

Owns, one module per dialect (``chat``, ``completions``, ``responses``, ``anthropic``): its
request model (pydantic, ``extra="allow"``: the fields we read, never re-encoding what passes
through), translation to and from chat (objects and event streams), stream reassembly and token
extraction, the events that end its streams, its error body, and its session "opening". Shared:
``content`` (text of a content value, template messages) and ``sse`` (parse and encode). This
package root dispatches on a ``Dialect``; ``translate`` is kept as an alias module.

May import: the standard library, pydantic, orjson, ``orchard_rec.errors``, ``orchard_rec.records``
(the ``Dialect`` enum). Never imports ``proxy``, ``storage``, ``reconstruct``, ``exporters``,
``intercept``, ``trainers`` or ``demo``: no I/O here, dicts and bytes in, dicts and bytes out.
"""

from __future__ import annotations

from typing import Any

import orjson

from orchard_rec.errors import BadRequest, OrchardError
from orchard_rec.protocol import anthropic, chat, completions, responses
from orchard_rec.protocol.content import template_message
from orchard_rec.protocol.sse import SSEParser, last_boundary
from orchard_rec.records import Dialect

__all__ = [
    "Dialect",
    "StreamEnd",
    "assemble",
    "assistant_message",
    "chat_request_of",
    "error_body",
    "extract_tokens",
    "is_anthropic",
    "is_terminal",
    "opening",
    "template_message",
    "to_chat",
]

is_anthropic = anthropic.is_anthropic

_NONE5: tuple[None, None, None, None, None] = (None, None, None, None, None)


def _dialect(d: Dialect | str) -> Dialect | None:
    try:
        return Dialect(d)
    except ValueError:
        return None


def assemble(dialect: Dialect | str, events: list[tuple[str | None, Any]]) -> Any:
    """The object a non-stream call would have returned, rebuilt from a stream's parsed events."""
    d = _dialect(dialect)
    if d is Dialect.CHAT:
        return chat.assemble(events)
    if d is Dialect.COMPLETIONS:
        return completions.assemble(events)
    if d is Dialect.RESPONSES:
        return responses.assemble(events)
    if d is Dialect.MESSAGES:
        return anthropic.assemble(events)
    return None


def extract_tokens(
    dialect: Dialect | str, obj: Any
) -> tuple[list[int] | None, list[int] | None, list[float] | None, str | None, Any]:
    """``(prompt_ids, completion_ids, completion_logprobs, finish_reason, usage)`` of choice 0."""
    d = _dialect(dialect)
    if d is Dialect.CHAT:
        return chat.extract_tokens(obj)
    if d is Dialect.COMPLETIONS:
        return completions.extract_tokens(obj)
    if d is Dialect.RESPONSES:
        return responses.extract_tokens(obj)
    if d is Dialect.MESSAGES:
        return anthropic.extract_tokens(obj)
    return (None, None, None, None, obj.get("usage")) if isinstance(obj, dict) else _NONE5


def assistant_message(dialect: Dialect | str, response: Any) -> dict[str, Any] | None:
    """The assistant turn a response of any generation dialect represents, as a chat message."""
    d = _dialect(dialect)
    if d is Dialect.CHAT:
        return chat.assistant_message(response)
    if d is Dialect.RESPONSES:
        return responses.assistant_message(response)
    if d is Dialect.MESSAGES:
        return anthropic.assistant_message(response)
    return None


def chat_request_of(dialect: Dialect | str, request: Any) -> dict[str, Any] | None:
    """The chat-completions view of a recorded request of any generation dialect (unvalidated)."""
    if not isinstance(request, dict):
        return None
    d = _dialect(dialect)
    if d is Dialect.CHAT:
        return request
    if d is Dialect.RESPONSES:
        return responses.to_chat(request)
    if d is Dialect.MESSAGES:
        return anthropic.to_chat(request)
    return None


def to_chat(dialect: Dialect, body: dict[str, Any]) -> dict[str, Any]:
    """A Responses or Messages request as chat completions, checked like the real API checks it;
    anything it cannot read is a 400 in the caller's dialect, never a proxy error."""
    module = responses if dialect is Dialect.RESPONSES else anthropic
    module.validate(body)
    try:
        return module.to_chat(body)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        raise BadRequest(
            f"could not translate this {dialect.value} request to chat completions: {type(exc).__name__}: {exc}"
        ) from exc


def opening(dialect: Dialect | str, body: dict[str, Any]) -> list[Any] | None:
    """What every call of one conversation repeats (instructions and first user message), or None."""
    d = _dialect(dialect)
    if d is Dialect.CHAT:
        return chat.opening(body)
    if d is Dialect.RESPONSES:
        return responses.opening(body)
    if d is Dialect.MESSAGES:
        return anthropic.opening(body)
    return None


def error_body(exc: OrchardError, anthropic_client: bool) -> bytes:
    """The JSON error body a client of that family expects (OpenAI's or Anthropic's shape)."""
    return anthropic.error_body(exc) if anthropic_client else chat.error_body(exc)


def is_terminal(dialect: Dialect, name: str | None, data: str) -> bool:
    """Whether this parsed event is the last of a ``dialect`` stream (a client may hang up after it).

    Decided by the event (its name, or the ``type`` of its data object), never by text inside it:
    a model that writes ``[DONE]`` or ``message_stop`` does not end its own stream."""
    if dialect is Dialect.CHAT or dialect is Dialect.COMPLETIONS:
        return data == chat.DONE
    ends = (
        responses.TERMINAL_EVENTS
        if dialect is Dialect.RESPONSES
        else anthropic.TERMINAL_EVENTS
        if dialect is Dialect.MESSAGES
        else None
    )
    if ends is None:
        return data == chat.DONE
    if name is not None:
        return name in ends
    if not data.startswith("{"):
        return False
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("type") in ends


class StreamEnd:
    """Watches the bytes a client receives and says when its stream's last event has passed.

    Cheap on the hot path and linear in the bytes fed: until the dialect's end marker occurs, a
    chunk is searched for it (and for a blank line) with only the few bytes before it, and the
    unfinished event after the last blank line is kept aside in parts (a relayed 1 MB event in
    4 kB chunks was re-joined and re-searched whole per chunk: 195 ms). From a marker on, the
    bytes are parsed into events (``SSEParser``, itself linear) until they end at an event
    boundary again. The decision itself is always made on a parsed event (``is_terminal``)."""

    __slots__ = ("_keep", "_marks", "_parser", "_parts", "_tail", "dialect", "ended")

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.ended = False
        self._marks: tuple[bytes, ...] = (
            tuple(e.encode() for e in responses.TERMINAL_EVENTS)
            if dialect is Dialect.RESPONSES
            else tuple(e.encode() for e in anthropic.TERMINAL_EVENTS)
            if dialect is Dialect.MESSAGES
            else (chat.DONE.encode(),)
        )
        self._keep = max(3, *map(len, self._marks)) - 1
        """Bytes of the unfinished event a marker or a blank line begun in them may end in the next chunk."""
        self._parts: list[bytes] = []
        """The unfinished event's bytes (no marker, no blank line in them)."""
        self._tail = b""
        """Their last ``_keep`` bytes."""
        self._parser: SSEParser | None = None
        """Set from a marker on, until the bytes fed end at an event boundary."""

    def feed(self, out: bytes) -> bool:
        """True once the last event has been among the bytes fed so far."""
        if self.ended:
            return True
        if not out:
            return False
        if self._parser is None:
            window = self._tail + out
            if not any(m in window for m in self._marks):
                b = last_boundary(window)  # a blank line ends in the window or not at all
                if b:
                    rest = window[b:]
                    self._parts = [rest] if rest else []
                    self._tail = rest[-self._keep :]
                else:
                    self._parts.append(out)
                    self._tail = window[-self._keep :]
                return False
            self._parser = SSEParser()  # the parts start at an event boundary
            events = self._parser.feed(b"".join(self._parts) + out)
            self._parts, self._tail = [], b""
        else:
            events = self._parser.feed(out)
        self.ended = any(is_terminal(self.dialect, name, data) for name, data in events)
        if not self._parser.pending:
            self._parser = None
        return self.ended
