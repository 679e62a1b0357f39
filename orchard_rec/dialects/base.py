"""The one interface every wire dialect implements (``WireDialect``), and what it hands out.

A dialect module holds everything the proxy, storage, reconstruction and the viewer know about
one wire API, behind this class: its routes (a model named in the URL too), where its stream
flag lives, its conversation keys, validation, translation to and from chat (object and event
stream), stream reassembly and token extraction, terminal events, error bodies, images, and the
session opening. Callers never branch on a dialect's name: they look the dialect up in the
registry (``orchard_rec.dialects``) and ask it.

Defaults here are what a dialect without that trait answers (no images, no opening, no chat
view ...), so a dialect module overrides only what it knows. No I/O: dicts and bytes in, dicts
and bytes out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from orchard_rec.dialects.content import tool_names_in
from orchard_rec.dialects.images import ImageRef
from orchard_rec.dialects.sse import encode
from orchard_rec.dialects.view import Turn, chat_answer, chat_turns, first_user_in, instructions_in
from orchard_rec.errors import BadRequest, OrchardError, UpstreamError
from orchard_rec.records import Dialect

__all__ = [
    "MESSAGE_SCHEMA",
    "TOOL_SCHEMA",
    "ChatStream",
    "Fold",
    "ItemFold",
    "Route",
    "Tokens",
    "WireDialect",
    "answer_tokens",
    "assemble_chunks",
    "checked_to_chat",
    "event_object",
    "event_type_in",
    "head_until_user",
    "ids_of_type",
    "openai_type",
    "openapi_post",
    "untranslatable",
    "upstream_message",
]

Tokens = tuple[Any, Any, "list[float] | None", Any, Any]
"""``(prompt_ids, completion_ids, completion_logprobs, finish_reason, usage)`` of choice 0."""


@dataclass(frozen=True, slots=True)
class Route:
    """One ``METHOD path`` a dialect answers on."""

    method: str
    pattern: str
    """A regular expression over the path (no query string), matched at the path's end so a
    gateway's prefix (``/openai/v1/...``) is kept; a named group ``model`` is the model the URL names."""
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern + r"\Z"))

    def match(self, method: str, path: str) -> re.Match[str] | None:
        """The match in ``path`` (query string ignored) when ``method`` is this route's, else None."""
        if method != self.method:
            return None
        return self.regex.search(path.partition("?")[0])


class ChatStream(Protocol):
    """Turns chat completion chunks into one dialect's event sequence (a translated stream)."""

    def feed(self, chunk: dict[str, Any]) -> Sequence[tuple[str | None, dict[str, Any]]]:
        """The events one chat chunk becomes (maybe none)."""
        ...

    def finish(self) -> Sequence[tuple[str | None, dict[str, Any]]]:
        """The closing events, once the chat stream ended."""
        ...

    def error(self, err: dict[str, Any]) -> Sequence[tuple[str | None, dict[str, Any]]]:
        """An upstream ``{"message": ...}`` error met inside the stream, as this dialect's events."""
        ...


class Fold(Protocol):
    """A request's conversation translated to chat item by item, so a session's next call (which
    resends the history as the *same objects*, ``proxy.reqparse``) translates only what is new."""

    def feed(self, item: Any) -> None:
        """Translate one more conversation item."""
        ...

    def resumed(self, k: int, body: dict[str, Any]) -> Fold | None:
        """A copy holding the first ``k`` items' translation, fit to continue for ``body``; None
        when the translation of ``body`` cannot start from it (then the request is folded whole)."""
        ...

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat request for ``body`` whose conversation items were all fed."""
        ...


class WireDialect:
    """One wire API. Subclasses set the data attributes and override the hooks they know."""

    name: Dialect
    """The dialect's registered name (stored on every call record)."""
    routes: tuple[Route, ...] = ()
    """Where clients call it."""
    conversation_keys: tuple[str, ...] = ()
    """Top-level request keys whose array is the conversation (resent whole on every call of a
    session): the request cache reads them incrementally and storage keeps each element once; a
    body holding one is read by this dialect when its caller does not know the call's dialect
    (``dialects.instructions_of`` ...: harness identification)."""
    secret_headers: frozenset[str] = frozenset()
    """Lower-case request headers that carry a credential in this dialect (never stored)."""
    secret_params: frozenset[str] = frozenset()
    """Query parameters that carry a credential (never stored: the recorded path has them redacted)."""
    token_native: bool = False
    """Token mode asks the upstream in this dialect itself (the fields it injects are removed again);
    otherwise token and tito modes translate the call to chat (``to_chat``) and the answer back."""
    chat_view: bool = False
    """``to_chat`` reads this dialect's requests (tito renders them; exporters read them as chat)."""
    end_marks: tuple[bytes, ...] = (b"[DONE]",)
    """Bytes without which no event ends its stream (cheap pre-filter for ``is_terminal``)."""
    terminal_events: frozenset[str] = frozenset()
    """Event types that end a stream (by the event's name, or unnamed by its data's ``type``), for
    ``is_terminal``; empty: the stream ends with ``[DONE]``."""
    finish_key: str | None = None
    """The answer's top-level key holding the finish reason its client saw (``finish_of``), if any."""
    upstream_path: str | None = None
    """Where a token-aware upstream (vLLM, SGLang) answers this dialect, from the root, when
    ``token_native``: token mode calls the upstream there."""

    # -- routes and request -----------------------------------------------------------------------

    def route(self, method: str, path: str) -> re.Match[str] | None:
        """The match of the first route that ``method path`` takes, or None."""
        for r in self.routes:
            m = r.match(method, path)
            if m is not None:
                return m
        return None

    def claims(self, path: str, headers: Mapping[str, str]) -> bool:
        """Whether a caller speaks this dialect, from what is known before its route is (the shape
        of an error for an unknown path). The OpenAI shape answers when no dialect claims a caller."""
        return False

    def auth_headers(self, key: str, headers: Mapping[str, str]) -> dict[str, str]:
        """The headers that carry the proxy's own upstream credential ``key`` for this dialect's calls,
        beside ``Authorization: Bearer`` (which every upstream gets)."""
        return {}

    def is_stream(self, path: str, body: Any) -> bool:
        """Whether the client asked for an event stream (the body's ``stream`` here)."""
        return isinstance(body, dict) and body.get("stream") is True

    def model_of(self, path: str, body: Any) -> str | None:
        """The model the call names (the body's ``model`` here)."""
        m = body.get("model") if isinstance(body, dict) else None
        return m[:256] if isinstance(m, str) else None

    def validate(self, body: dict[str, Any]) -> None:
        """The checks the real API makes before generating: ``BadRequest`` in its words."""

    # -- translation ------------------------------------------------------------------------------

    def token_request(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool, bool]:
        """A ``token_native`` dialect: the body sent upstream in token mode (asking for token ids and
        logprobs), and whether the ids and the logprobs were injected (the client did not ask)."""
        raise NotImplementedError(f"{self.name} is not spoken natively by a token-aware upstream")

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as a chat completions request (unvalidated; pure)."""
        raise NotImplementedError(f"{self.name} has no chat view")

    def fold(self, body: dict[str, Any]) -> Fold | None:
        """A ``Fold`` for ``body`` with nothing fed yet, or None (translate the whole request each time)."""
        return None

    def from_chat(self, chat: dict[str, Any], req: dict[str, Any], path: str = "") -> dict[str, Any]:
        """A chat completion (non-stream) as this dialect's answer to ``req``."""
        return chat

    def chat_stream(self, req: dict[str, Any], path: str = "") -> ChatStream | None:
        """A translator of chat chunks into this dialect's events (None: chat's own stream)."""
        return None

    def encode_event(self, name: str | None, data: Any) -> bytes:
        """One event as this dialect frames it on the wire."""
        return encode(name, data)

    # -- answers ----------------------------------------------------------------------------------

    def assemble(self, events: list[tuple[str | None, Any]]) -> Any:
        """The object a non-stream call would have returned, rebuilt from a stream's parsed events."""
        return None

    def extract_tokens(self, obj: Any) -> Tokens:
        """``(prompt_ids, completion_ids, completion_logprobs, finish_reason, usage)`` of choice 0."""
        return answer_tokens(obj, self.finish_key)

    def injected(self, request: Any, upstream: Any) -> tuple[bool, bool]:
        """Which of (ids, logprobs) token mode added to what a native client asked for."""
        return False, False

    def assistant_message(self, response: Any) -> dict[str, Any] | None:
        """The assistant turn an answer represents, as a chat message."""
        return None

    def finish_of(self, response: Any) -> str | None:
        """The finish reason the client saw in a translated answer (its own word for it)."""
        if self.finish_key is None or not isinstance(response, dict):
            return None
        s = response.get(self.finish_key)
        return s if isinstance(s, str) else None

    def is_terminal(self, name: str | None, data: str) -> bool:
        """Whether this parsed event is the last of a stream (a client may hang up after it).
        Decided by the event, never by text inside it."""
        if self.terminal_events:
            return event_type_in(name, data, self.terminal_events)
        return data == "[DONE]"

    # -- errors -----------------------------------------------------------------------------------

    def error_body(self, exc: OrchardError) -> bytes:
        """The JSON error body a client of this dialect expects (OpenAI's shape here)."""
        return orjson.dumps(
            {
                "error": {
                    "message": exc.message,
                    "type": openai_type(exc),
                    "param": exc.param,
                    "code": exc.code,
                }
            }
        )

    def upstream_error(self, status: int, data: bytes) -> bytes:
        """A chat upstream's error body as this dialect's client has it (as it is here)."""
        return data

    def stream_error(self, message: str) -> bytes:
        """An error met after the client had its status line (the server died mid-stream), as one
        event of this dialect's stream; the client's SDK raises it (OpenAI's ``data: {"error": ...}``
        chunk here)."""
        return encode(
            None, {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
        )

    def openapi(self) -> dict[str, dict[str, Any]]:
        """Its routes as OpenAPI path items (``proxy.openapi`` adds the ``/s/{session_id}`` copies)."""
        return {}

    # -- what a conversation holds ----------------------------------------------------------------

    def images(self, request: Any) -> list[ImageRef]:
        """The images of a request, in prompt order."""
        return []

    def opening(self, body: dict[str, Any]) -> list[Any] | None:
        """What every call of one conversation repeats (instructions and first user message), or None."""
        return None

    def tool_call_ids(self, response: Any) -> list[str]:
        """The tool-call ids the client received, in order."""
        msg = self.assistant_message(response)
        calls = (msg or {}).get("tool_calls") or []
        return [str(tc.get("id")) for tc in calls if isinstance(tc, dict)]

    # -- the neutral view (the viewer, the step parser) -------------------------------------------

    def turns(self, request: dict[str, Any]) -> list[Turn] | None:
        """A stored request's conversation as neutral turns (``dialects.view``), system prompt
        first; None when this dialect cannot read it. Here: its chat view's messages."""
        return chat_turns(self.to_chat(request)) if self.chat_view else None

    def answer_turn(self, response: dict[str, Any]) -> Turn | None:
        """The assistant turn a stored answer carried, as a neutral turn; None for an error or a
        call that generated nothing. Here: its ``assistant_message``."""
        return chat_answer(self.assistant_message(response))

    # -- what a harness is recognised by (``harnesses``: on every call, so the built-in dialects
    # -- read their own shape and stop early) ----------------------------------------------------

    def instructions(self, body: dict[str, Any]) -> str | None:
        """The text of a request's instructions: its system prompt, or the first system/developer
        message when one comes before the first user message; None without. Here: read from
        ``turns`` (the chat view's, by default)."""
        return instructions_in(self.turns(body) or ())

    def first_user_text(self, body: dict[str, Any]) -> str | None:
        """The text of a request's first user message, or None. Here: read from ``turns``."""
        return first_user_in(self.turns(body) or ())

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        """The names of the tools a request offers, in order. Here: its chat view's ``tools``."""
        return tool_names_in(self.to_chat(body).get("tools")) if self.chat_view else []

    def raw_text(self, request: Any, response: Any) -> tuple[str, str] | None:
        """A text-in, text-out dialect's prompt and completion as plain text (no chat template
        between them: ``reconstruct.retokenize`` encodes them as they are); None for a dialect
        that carries a conversation."""
        return None


def answer_tokens(obj: Any, finish_key: str | None) -> tuple[None, None, None, Any, Any]:
    """``Tokens`` of an answer that carries no token ids: its ``finish_key`` (None: no finish
    reason) and its ``usage``."""
    if not isinstance(obj, dict):
        return None, None, None, None, None
    return None, None, None, obj.get(finish_key) if finish_key else None, obj.get("usage")


def assemble_chunks(
    events: list[tuple[str | None, Any]],
    kind: str,
    new_choice: Callable[[int], dict[str, Any]],
    add_choice: Callable[[dict[str, Any], dict[str, Any]], None],
    add_chunk: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
    done: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """An OpenAI stream's chunks as the object (``object: kind``) a non-stream call returns: the first
    chunk's id, created and model, the last usage, and per index a choice started by ``new_choice``,
    fed each streamed choice by ``add_choice`` and closed by ``done``; ``add_chunk`` reads what else
    a chunk carries into the object. None without a chunk."""
    chunks = [d for _, d in events if isinstance(d, dict)]
    if not chunks:
        return None
    first = chunks[0]
    out: dict[str, Any] = {
        "id": first.get("id"),
        "object": kind,
        "created": first.get("created"),
        "model": first.get("model"),
    }
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for ch in chunks:
        if add_chunk is not None:
            add_chunk(out, ch)
        if ch.get("usage"):
            usage = ch["usage"]
        for c in ch.get("choices") or ():
            idx = c.get("index", 0)
            acc = choices.get(idx)
            if acc is None:
                acc = choices[idx] = new_choice(idx)
            add_choice(acc, c)
    out["choices"] = [choices[i] if done is None else done(choices[i]) for i in sorted(choices)]
    if usage is not None:
        out["usage"] = usage
    return out


def openai_type(exc: OrchardError) -> str:
    """The OpenAI dialects' word for an error (``error.type``), from its status and family."""
    s = exc.status
    if s in (401, 403):
        return "authentication_error"
    if s == 429:
        return "rate_limit_error"
    if s < 500:
        return "invalid_request_error"
    return "upstream_error" if isinstance(exc, UpstreamError) else "server_error"


def checked_to_chat(d: WireDialect, body: dict[str, Any]) -> dict[str, Any]:
    """``d.to_chat(body)`` checked like the real API checks it: anything it cannot read is a 400 in
    the caller's dialect, never a proxy error."""
    d.validate(body)
    try:
        return d.to_chat(body)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        raise untranslatable(d.name, exc) from exc


class ItemFold:
    """A ``Fold`` for a dialect whose conversation items each translate alone (``item``), so any
    leading run of the previous call's items is reused; ``head`` gives the messages before them
    (the system prompt) and ``request`` the chat request around all of them."""

    __slots__ = ("head", "item", "outs", "request")

    def __init__(
        self,
        item: Callable[[Any], list[dict[str, Any]]],
        head: Callable[[dict[str, Any]], list[dict[str, Any]]],
        request: Callable[[dict[str, Any], list[dict[str, Any]]], dict[str, Any]],
    ) -> None:
        self.item, self.head, self.request = item, head, request
        self.outs: list[list[dict[str, Any]]] = []

    def feed(self, item: Any) -> None:
        self.outs.append(self.item(item))

    def resumed(self, k: int, body: dict[str, Any]) -> ItemFold:
        out = ItemFold(self.item, self.head, self.request)
        out.outs = self.outs[:k]
        return out

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = self.head(body)
        for out in self.outs:
            messages += out
        return self.request(body, messages)


def untranslatable(name: str, exc: Exception) -> BadRequest:
    return BadRequest(
        f"could not translate this {name} request to chat completions: {type(exc).__name__}: {exc}"
    )


def head_until_user(head: list[Any], items: Sequence[Any]) -> list[Any] | None:
    """``head`` plus the system/developer contents up to and with the first user message's; None without one."""
    for m in items:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role == "user":
            head.append(m.get("content"))
            return head
        if role in ("system", "developer"):
            head.append(m.get("content"))
    return None


def ids_of_type(response: Any, items_key: str, kind: str, id_key: str) -> list[str]:
    """``id_key`` of each item of type ``kind`` in the answer's ``items_key`` list, in order."""
    items = response.get(items_key) or [] if isinstance(response, dict) else []
    return [str(i[id_key]) for i in items if isinstance(i, dict) and i.get("type") == kind]


def upstream_message(data: bytes) -> str:
    """The message of an upstream's error body (``error.message`` or ``message``), else its text."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    obj: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
    err = obj["error"] if isinstance(obj.get("error"), dict) else {}
    msg = err.get("message") or obj.get("message")
    return msg if isinstance(msg, str) else data[:2000].decode("utf-8", "replace")


def event_type_in(name: str | None, data: str, ends: frozenset[str]) -> bool:
    """Whether an event is one of ``ends``: by its name, or (unnamed) by its data object's ``type``."""
    if name is not None:
        return name in ends
    obj = event_object(data)
    return obj is not None and obj.get("type") in ends


def event_object(data: str) -> dict[str, Any] | None:
    """An event's data as the JSON object it holds, or None (not an object, or not JSON)."""
    if not data.startswith("{"):
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


MESSAGE_SCHEMA = {
    "type": "object",
    "properties": {"role": {"type": "string"}, "content": {}},
    "required": ["role"],
}
TOOL_SCHEMA = {"type": "object", "additionalProperties": True}


def openapi_post(operation: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAPI ``post`` operation taking an open JSON object with ``props`` (``required`` among them)."""
    schema = {"type": "object", "properties": props, "required": required, "additionalProperties": True}
    responses: dict[str, Any] = {
        "200": {"description": "the upstream's answer, relayed (JSON or server-sent events)"}
    }
    for c in (400, 413, 415, 502):
        responses[str(c)] = {"description": "an error in the dialect's own shape"}
    return {
        "post": {
            "operationId": operation,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": responses,
        }
    }
