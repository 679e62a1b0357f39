"""The wire dialects: one module per wire API, behind one interface, found through a registry.

Each dialect module (``chat``, ``completions``, ``responses``, ``anthropic`` ...) holds everything
orchard-rec knows about its API as a ``WireDialect`` (``base``): routes, where the stream flag
lives, conversation keys, validation, translation to and from chat (objects and event streams),
stream reassembly and token extraction, terminal events, error bodies, images and the session
opening. ``registry`` lists them (one line each, plus the entry-point group
``orchard_rec.dialects``). This package root answers by registry lookup, never by a dialect's
name: a caller asks ``get(dialect)`` or one of the functions below. Shared: ``content`` (text of
a content value, template messages), ``sse`` (parse and encode), ``images`` (image refs) and
``view`` (a stored conversation as neutral turns, what the viewer and the step parser read).
What a request's opening says (``instructions_of``, ``first_user_text``, ``tool_names_of``: what
the harness plug-ins recognise a call by) is asked of the call's dialect, or of each dialect whose
shape the body has when the caller does not know it.

May import: the standard library, pydantic, orjson, ``orchard_rec.errors``, ``orchard_rec.records``
(the ``Dialect`` name). Never imports ``proxy``, ``storage``, ``reconstruct``, ``exporters``,
``intercept``, ``trainers``, ``ui`` or ``demo``: no I/O here, dicts and bytes in, dicts and bytes out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from orchard_rec.dialects.base import ChatStream, Fold, Route, WireDialect, checked_to_chat
from orchard_rec.dialects.content import template_message
from orchard_rec.dialects.images import ImageRef
from orchard_rec.dialects.registry import registered
from orchard_rec.dialects.sse import SSEParser, last_boundary
from orchard_rec.dialects.view import Block, Turn, chat_turns
from orchard_rec.errors import OrchardError
from orchard_rec.records import Dialect

__all__ = [
    "Block",
    "ChatStream",
    "Dialect",
    "Fold",
    "Reader",
    "Route",
    "StreamEnd",
    "Turn",
    "WireDialect",
    "answer_turn_of",
    "assemble",
    "assistant_message",
    "caller",
    "chat_request_of",
    "chat_turns",
    "conversation_keys",
    "error_body",
    "extract_tokens",
    "first_user_text",
    "get",
    "images_of",
    "instructions_of",
    "is_terminal",
    "known",
    "opening",
    "raw_text",
    "redact_query",
    "route",
    "secret_headers",
    "template_message",
    "to_chat",
    "tool_names_of",
    "turns_of",
    "upstream_address",
    "without_secrets",
]

_NONE5: tuple[None, None, None, None, None] = (None, None, None, None, None)


def known() -> tuple[WireDialect, ...]:
    """Every registered dialect, in registry order."""
    return tuple(registered().values())


def get(dialect: Dialect | str | None) -> WireDialect | None:
    """The dialect registered under that name, or None (``models``, ``other``, an unknown name)."""
    return registered().get(str(dialect)) if dialect is not None else None


def route(method: str, path: str) -> tuple[WireDialect, re.Match[str]] | None:
    """The dialect whose route ``method path`` takes (first in registry order), and the match."""
    for d in registered().values():
        m = d.route(method, path)
        if m is not None:
            return d, m
    return None


def caller(path: str, headers: Mapping[str, str], dialect: Dialect | str | None = None) -> WireDialect:
    """The dialect whose error shape a caller gets: the first that ``claims`` it (Anthropic's SDK
    says ``anthropic-version`` on any route), else its route's ``dialect``, else chat's."""
    for d in registered().values():
        if d.claims(path, headers):
            return d
    return get(dialect) or registered()[Dialect.CHAT.value]


@functools.cache
def conversation_keys() -> tuple[str, ...]:
    """The top-level keys any dialect keeps its conversation array under, in registry order."""
    out: list[str] = []
    for d in registered().values():
        out += [k for k in d.conversation_keys if k not in out]
    return tuple(out)


@functools.cache
def secret_headers() -> frozenset[str]:
    """Lower-case headers some dialect carries a credential in."""
    return frozenset().union(*(d.secret_headers for d in registered().values()))


@functools.cache
def _secret_params() -> frozenset[str]:
    return frozenset().union(*(d.secret_params for d in registered().values()))


def redact_query(path: str) -> str:
    """``path`` with the value of every credential query parameter (``?key=``) replaced by ``REDACTED``."""
    base, sep, query = path.partition("?")
    secret = _secret_params()
    if not sep or not secret:
        return path
    parts = []
    for p in query.split("&"):
        k, eq, _ = p.partition("=")
        parts.append(f"{k}=REDACTED" if eq and k in secret else p)
    return base + "?" + "&".join(parts)


def without_secrets(path: str) -> str:
    """``path`` less its credential query parameters (a recorded path's ``key=REDACTED`` too)."""
    base, sep, query = path.partition("?")
    secret = _secret_params()
    if not sep or not secret:
        return path
    kept = [p for p in query.split("&") if p.partition("=")[0] not in secret]
    return base + ("?" + "&".join(kept) if kept else "")


def upstream_address(base: str, path: str) -> str:
    """Where a client's ``path`` (from the root, with its query) goes on an upstream whose base is
    ``base``: under the base for ``/v1/...`` (``http://host/v1`` or a gateway's ``.../openai/v1``),
    under its root otherwise (``/v1beta/models/...``)."""
    if path.startswith("/v1/"):
        return base + path[3:]
    return (base[:-3] if base.endswith("/v1") else base) + path


def assemble(dialect: Dialect | str, events: list[tuple[str | None, Any]]) -> Any:
    """The object a non-stream call would have returned, rebuilt from a stream's parsed events."""
    d = get(dialect)
    return d.assemble(events) if d is not None else None


def extract_tokens(
    dialect: Dialect | str, obj: Any
) -> tuple[list[int] | None, list[int] | None, list[float] | None, str | None, Any]:
    """``(prompt_ids, completion_ids, completion_logprobs, finish_reason, usage)`` of choice 0."""
    d = get(dialect)
    if d is not None:
        return d.extract_tokens(obj)
    return (None, None, None, None, obj.get("usage")) if isinstance(obj, dict) else _NONE5


def assistant_message(dialect: Dialect | str, response: Any) -> dict[str, Any] | None:
    """The assistant turn a response of any generation dialect represents, as a chat message."""
    d = get(dialect)
    return d.assistant_message(response) if d is not None else None


def chat_request_of(dialect: Dialect | str, request: Any) -> dict[str, Any] | None:
    """The chat-completions view of a recorded request of any generation dialect (unvalidated)."""
    d = get(dialect)
    if not isinstance(request, dict) or d is None or not d.chat_view:
        return None
    return d.to_chat(request)


_UNREADABLE = (TypeError, AttributeError, KeyError, ValueError, IndexError)
"""What a dialect's reader raises on a stored body it cannot read (the view then says None)."""


def turns_of(dialect: Dialect | str, request: Any) -> list[Turn] | None:
    """A recorded request's conversation as neutral turns (``view``), read by its dialect; None
    when no registered dialect reads it (``models``, ``other``, an unknown name, a shape it cannot read)."""
    d = get(dialect)
    if d is None or not isinstance(request, dict):
        return None
    try:
        return d.turns(request)
    except _UNREADABLE:
        return None


def answer_turn_of(dialect: Dialect | str, response: Any) -> Turn | None:
    """The assistant turn a recorded answer carried, as a neutral turn, or None."""
    d = get(dialect)
    if d is None or not isinstance(response, dict):
        return None
    try:
        return d.answer_turn(response)
    except _UNREADABLE:
        return None


_Readers = tuple[tuple[str, Callable[[dict[str, Any]], Any]], ...]


def _by_shape(what: str) -> _Readers:
    """``(conversation key, the reader ``what`` of a dialect keeping its conversation under it)`` for
    each registered dialect and key, in registry order."""
    return tuple((k, getattr(d, what)) for d in registered().values() for k in d.conversation_keys)


_T_co = TypeVar("_T_co", covariant=True)


class Reader(Protocol[_T_co]):
    """``reader(body, dialect=None)``: what a request body says, read by its dialect."""

    def __call__(self, body: Any, dialect: Dialect | str | None = None, /) -> _T_co: ...


def _ask(name: str, what: str, doc: str) -> Reader[Any]:
    """The function ``name`` (its docstring ``doc``) reading a ``body``: it asks ``what`` (a
    ``WireDialect`` reader's name) of the call's ``dialect`` when that is a registered one, else of
    each dialect whose conversation key ``body`` holds, in registry order, and answers the first
    answer that is not None (a reader that cannot read the body answers None). On every call's path
    (harness identification): one function, its readers looked up once per registry (again when
    the registry is rebuilt: a dialect registered at runtime is found)."""
    state: tuple[Any, _Readers] = (None, ())  # (the registry its readers were taken from, the readers)

    def ask(body: Any, dialect: Dialect | str | None = None) -> Any:
        if not isinstance(body, dict):
            return None
        nonlocal state
        if dialect is not None and (d := get(dialect)) is not None:
            table: _Readers = (("", getattr(d, what)),)
        else:
            reg = registered()
            if state[0] is not reg:
                state = (reg, _by_shape(what))
            table = state[1]
        for key, read in table:
            if key and key not in body:
                continue
            try:
                out = read(body)
            except _UNREADABLE:
                continue
            if out is not None:
                return out
        return None

    ask.__name__ = ask.__qualname__ = name
    ask.__doc__ = doc
    return ask


instructions_of: Reader[str | None] = _ask(
    "instructions_of",
    "instructions",
    """``instructions_of(body, dialect=None)``: the text of a request's instructions (its system prompt,
    or a system/developer message before the first user message: ``WireDialect.instructions``), or
    None. Read by ``dialect`` when given and registered, else by each registered dialect whose
    conversation key ``body`` holds, in registry order (the first answer that is not None).""",
)
first_user_text: Reader[str | None] = _ask(
    "first_user_text",
    "first_user_text",
    """``first_user_text(body, dialect=None)``: the text of a request's first user message
    (``WireDialect.first_user_text``), or None; read as ``instructions_of`` reads.""",
)
tool_names_of: Reader[list[str] | None] = _ask(
    "tool_names_of",
    "tool_names",
    """``tool_names_of(body, dialect=None)``: the names of the tools a request offers
    (``WireDialect.tool_names``), in order, read as ``instructions_of`` reads; None when no
    dialect reads the body.""",
)


def raw_text(dialect: Dialect | str, request: Any, response: Any) -> tuple[str, str] | None:
    """A text-in, text-out call's prompt and completion text (``WireDialect.raw_text``), or None."""
    d = get(dialect)
    return d.raw_text(request, response) if d is not None else None


def to_chat(dialect: Dialect | str, body: dict[str, Any]) -> dict[str, Any]:
    """A request as chat completions, checked like the real API checks it; anything it cannot
    read is a 400 in the caller's dialect, never a proxy error."""
    d = get(dialect)
    if d is None or not d.chat_view:
        raise ValueError(f"{dialect} requests have no chat view")
    return checked_to_chat(d, body)


def opening(dialect: Dialect | str, body: dict[str, Any]) -> list[Any] | None:
    """What every call of one conversation repeats (instructions and first user message), or None."""
    d = get(dialect)
    return d.opening(body) if d is not None else None


def images_of(dialect: Dialect | str, request: Any) -> list[ImageRef]:
    """The images of a request, in prompt order (the order a chat template places them); [] when none."""
    d = get(dialect)
    return d.images(request) if d is not None and isinstance(request, dict) else []


def error_body(exc: OrchardError, dialect: WireDialect | None = None) -> bytes:
    """The JSON error body a client of ``dialect`` expects (chat's, the OpenAI shape, by default)."""
    return (dialect or registered()[Dialect.CHAT.value]).error_body(exc)


def is_terminal(dialect: Dialect | str, name: str | None, data: str) -> bool:
    """Whether this parsed event is the last of a ``dialect`` stream (a client may hang up after it).

    Decided by the event (its name, or the ``type`` of its data object), never by text inside it:
    a model that writes ``[DONE]`` or ``message_stop`` does not end its own stream."""
    d = get(dialect)
    return d.is_terminal(name, data) if d is not None else data == "[DONE]"


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
        d = get(dialect)
        self._marks: tuple[bytes, ...] = d.end_marks if d is not None else (b"[DONE]",)
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
