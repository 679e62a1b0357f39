"""Token mode: ask a vLLM-style upstream for token ids and logprobs, hide that from the client.

A ``Plan`` says what one call sends upstream and how the answer is turned back into
what the client asked for:
- a dialect the upstream speaks natively (``token_native``: chat, completions) stays native;
  ``return_token_ids`` and ``logprobs`` are injected unless the client asked for them itself
  (``WireDialect.token_request``), and exactly the injected fields are removed again from the
  body or from every streamed chunk;
- any other dialect with a chat view (Responses, Messages ...) is translated to chat completions
  (the dialect token-aware servers answer with ids) and the answer translated back, object or
  events, by the client's dialect (``from_chat``, ``chat_stream``).

The record keeps the upstream's own answer (with the ids) and, for translated calls,
the events the client received.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import orjson

from orchard_rec import dialects
from orchard_rec.dialects import ChatStream, WireDialect
from orchard_rec.dialects.base import WireDialect as _Base
from orchard_rec.dialects.sse import DONE_FRAME, SSEParser, parse_block
from orchard_rec.proxy import idcut, tochat
from orchard_rec.records import Dialect

__all__ = ["Plan", "StreamFilter", "plan_for"]

log = logging.getLogger("orchard_rec.proxy.token")


_TRUE_SUFFIX = b"," + orjson.dumps({"return_token_ids": True, "logprobs": True})[1:]


class Plan:
    """How one call is carried out in token mode."""

    def __init__(
        self,
        client: Dialect,
        upstream: Dialect,
        body: dict[str, Any],
        client_body: dict[str, Any],
        inject_ids: bool,
        inject_logprobs: bool,
        path: str = "",
        wire: WireDialect | None = None,
    ) -> None:
        self.client = client
        self.wire: WireDialect | None = wire if wire is not None else dialects.get(client)
        """The client's dialect (its translations, its error shape)."""
        self.path = path
        """The client's path (a dialect may name the stream or the model in it)."""
        self.upstream = upstream
        self.body = body
        """The body sent upstream."""
        self.client_body = client_body
        self.inject_ids = inject_ids
        self.inject_logprobs = inject_logprobs
        self.cut: tuple[bytes, list[idcut.Span]] | None = None
        """The answer's id arrays as ``client_body_bytes`` cut them (the rest, and where they were),
        for the record: the writer need not search the answer again."""
        self.suffix: bytes | None = None
        """Native calls whose client set neither injected key: the keys as JSON text, to append to
        the client's own bytes (``{..., "return_token_ids": true, ...}``) instead of re-encoding."""
        if (
            client is upstream
            and client_body
            and "return_token_ids" not in client_body
            and "logprobs" not in client_body
        ):
            salted = "cache_salt" in body and "cache_salt" not in client_body
            if body["return_token_ids"] is True and body["logprobs"] is True and not salted:
                self.suffix = _TRUE_SUFFIX  # what every native call injects: encoded once
            else:
                extra = {k: body[k] for k in ("return_token_ids", "logprobs")}
                if salted:
                    extra["cache_salt"] = body["cache_salt"]
                self.suffix = b"," + orjson.dumps(extra)[1:]

    def upstream_bytes(self, raw: bytes | None) -> bytes:
        """The body to send upstream: the client's ``raw`` bytes with the injected keys appended
        when that is possible (O(1) beyond a copy, and the client's formatting kept), else ``body`` encoded."""
        if self.suffix is not None and raw is not None:
            end = len(raw.rstrip())
            if end and raw[end - 1] == 0x7D:  # "}": the object ``client_body`` was parsed from
                return raw[: end - 1] + self.suffix
        return orjson.dumps(self.body)

    @property
    def translated(self) -> bool:
        return self.client is not self.upstream

    @property
    def upstream_path(self) -> str:
        """Where the upstream dialect is called (from the root: ``core.upstream_url`` places it)."""
        # a native plan's upstream is the client's dialect (``wire``, from the registry: ``_plan``)
        d = (
            self.wire
            if self.upstream is self.client and self.wire is not None
            else dialects.get(self.upstream)
        )
        if d is None or d.upstream_path is None:
            raise ValueError(f"{self.upstream} has no token-aware upstream route")
        return d.upstream_path

    # -- non-stream ---------------------------------------------------------------------------

    def client_body_bytes(self, data: bytes, status: int) -> tuple[bytes, Any]:
        """The body the client gets for the upstream's ``data``, and its parsed form (translated calls).

        A large answer whose injected id arrays can be cut at byte level (``idcut.cut``) is
        handled without parsing them: the client gets the upstream's bytes with each array
        replaced by ``null`` (re-encoded from the small remainder only when logprobs are removed too)."""
        c = idcut.cut(data) if self.inject_ids and status < 400 else None
        if c is not None:
            rest, obj, spans = c
            self.cut = (rest, spans)
            if self.client is not self.upstream:  # (``translated``; a native call needs no look)
                translated = self._translated(obj)
                if translated is not None:
                    return translated
            if self._strip(obj):
                return orjson.dumps(obj), None
            return rest, None
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data, None
        if not isinstance(obj, dict):
            return data, None
        if status >= 400:
            if self.translated and self.wire is not None:  # in the client's dialect
                out = self.wire.upstream_error(status, data)
                return out, (orjson.loads(out) if out is not data else None)
            return data, None
        if self.client is not self.upstream:
            translated = self._translated(obj)
            if translated is not None:
                return translated
        if self._strip(obj):
            return orjson.dumps(obj), None
        return data, None

    def _translated(self, obj: dict[str, Any]) -> tuple[bytes, Any] | None:
        """The chat answer in a translated client's dialect (None when the client speaks the upstream's)."""
        if not self.translated or self.wire is None:
            return None
        out = self.wire.from_chat(obj, self.client_body, self.path)
        return orjson.dumps(out), out

    def _strip(self, obj: dict[str, Any]) -> bool:
        """Undo what we injected: the fields read as vLLM writes them when not asked (null).

        True if anything changed.
        """
        changed = False
        ids = self.inject_ids
        if ids and obj.get("prompt_token_ids") is not None:
            obj["prompt_token_ids"] = None
            changed = True
        for c in obj.get("choices") or ():
            if not isinstance(c, dict):
                continue
            if ids:
                if c.get("token_ids") is not None:
                    c["token_ids"] = None
                    changed = True
                if c.get("prompt_token_ids") is not None:
                    c["prompt_token_ids"] = None
                    changed = True
            if self.inject_logprobs and c.get("logprobs") is not None:
                c["logprobs"] = None
                changed = True
        return changed

    # -- stream ----------------------------------------------------------------------------------

    def stream_filter(self) -> StreamFilter:
        return StreamFilter(self)


class StreamFilter:
    """Feed upstream SSE bytes, get the bytes the client should see.

    A native call's events (chat, completions) are read as raw blocks: one ``data:`` line is
    parsed once from its bytes and, when it holds nothing injected, passed on as the very bytes
    that came (no decode, no re-encoding); only an event that carries an injected field is
    encoded again, without it. Anything else (named, several lines, comments, CRs) takes the
    general path (``parse_block``), which writes the same bytes for a plain ``data:`` line.
    ``ended`` says when the client has been handed the stream's last event (the relay then needs
    no second watcher of the same bytes: ``tracks_end``)."""

    __slots__ = ("client_events", "ended", "finished", "parser", "plan", "tracks_end", "translator")

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.parser = SSEParser()
        self.translator: ChatStream | None = None
        if plan.translated and plan.wire is not None:
            self.translator = plan.wire.chat_stream(plan.client_body, plan.path)
        self.finished = False
        self.client_events: list[list[Any]] | None = [] if self.translator is not None else None
        """The events the client received (translated calls only)."""
        self.ended = False
        self.tracks_end = (
            self.translator is None
            and plan.wire is not None
            and type(plan.wire).is_terminal is _Base.is_terminal
        )
        """A native call whose dialect ends at ``[DONE]`` alone: ``ended`` is kept here."""

    def _emit(self, events: Sequence[tuple[str | None, dict[str, Any]]]) -> bytes:
        out = bytearray()
        assert self.plan.wire is not None
        encode = self.plan.wire.encode_event
        for name, data in events:
            self.client_events.append([name, data])  # type: ignore[union-attr]
            out += encode(name, data)
        return bytes(out)

    def feed(self, chunk: bytes) -> bytes:
        if self.translator is not None:
            events = self.parser.feed(chunk)
            return b"".join([self._one(name, data) for name, data in events]) if events else b""
        one = self.parser.single(chunk)  # the usual chunk: one event on one line
        if one is not None and one[:6] == b"data: ":
            return self._data(one, chunk)
        blocks = self.parser.blocks(chunk)
        if not blocks:
            return b""
        if len(blocks) == 1:
            return self._block(blocks[0])
        return b"".join([self._block(b) for b in blocks])

    def _block(self, block: bytes) -> bytes:
        """One raw event of a native stream, as the client gets it."""
        if block[:6] == b"data: " and b"\n" not in block and b"\r" not in block:
            return self._data(block, None)
        ev = parse_block(block)
        return self._one(*ev) if ev is not None else b""

    def _data(self, block: bytes, frame: bytes | None) -> bytes:
        """A one-line ``data:`` event (``block``; ``frame``: it with its blank line, when at hand)."""
        data = block[6:]
        if data == b"[DONE]":
            self.ended = True
            return DONE_FRAME
        plan = self.plan
        if len(data) < idcut.MIN_BYTES or not plan.inject_ids:
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                return frame if frame is not None else block + b"\n\n"
            if type(obj) is dict and plan._strip(obj):
                return b"data: " + orjson.dumps(obj) + b"\n\n"
            return frame if frame is not None else block + b"\n\n"
        ev = parse_block(block)
        return self._one(*ev) if ev is not None else b""

    def _one(self, name: str | None, data: str) -> bytes:
        if data == "[DONE]":
            self.ended = True
            if self.translator is None:
                return DONE_FRAME
            return self._finish_translation()
        obj = None
        if len(data) >= idcut.MIN_BYTES and self.plan.inject_ids:  # the first chunk: the prompt's ids
            raw = data.encode()
            c = idcut.cut(raw)
            if c is not None:
                rest, obj, spans = c
                if self.translator is None:
                    data = orjson.dumps(obj).decode() if self.plan._strip(obj) else rest.decode()
                    head = f"event: {name}\n" if name else ""
                    return (head + "data: " + data + "\n\n").encode()
                for path, s, e in spans:  # the translator reads only how many prompt ids there are
                    if path == ("prompt_token_ids",):
                        flat = e - s > 16 or raw[s + 1 : e - 1].strip()
                        obj["prompt_token_ids"] = [0] * (raw.count(b",", s, e) + 1 if flat else 0)
        if obj is None:
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                obj = None
        if self.translator is None:
            if isinstance(obj, dict) and self.plan._strip(obj):
                data = orjson.dumps(obj).decode()
            head = f"event: {name}\n" if name else ""
            return (head + "data: " + data + "\n\n").encode()
        if not isinstance(obj, dict):
            return b""
        try:
            return self._translate(obj)
        except (TypeError, AttributeError, KeyError, ValueError):
            log.exception("untranslatable upstream chunk skipped")
            return b""

    def _translate(self, obj: dict[str, Any]) -> bytes:
        assert self.translator is not None
        if "error" in obj and "choices" not in obj:
            err = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            return self._emit(self.translator.error(err))
        return self._emit(self.translator.feed(obj))

    def _finish_translation(self) -> bytes:
        if self.finished or self.translator is None:
            return b""
        self.finished = True
        return self._emit(self.translator.finish())

    def finish(self) -> bytes:
        """At the upstream's EOF: anything left, and the closing events if [DONE] never came."""
        tail = b"".join(self._one(n, d) for n, d in self.parser.flush())
        return tail + self._finish_translation()

    @property
    def final(self) -> Any:
        """The object a non-stream call would have returned to the client, when its translator keeps one."""
        return getattr(self.translator, "final", None)


def plan_for(
    mode: str,
    dialect: Dialect,
    body: Any,
    session: str | None = None,
    size: int = 0,
    path: str = "",
    salt: str | None = None,
) -> Plan | None:
    """The token-mode plan for a call, or None to relay it natively. ``session`` (and the body's
    ``size`` in bytes): translations reuse the session's previous one (``proxy.tochat``);
    ``path``: the client's (a dialect may name the stream in it). ``salt``: a ``cache_salt`` to
    send (``--cache-salt policy``) unless the client set its own."""
    plan = _plan(mode, dialect, body, session, size, path)
    if plan is not None and salt is not None and "cache_salt" not in body:
        plan.body = {**plan.body, "cache_salt": salt}  # a translation's dict may be cached: a copy
        if plan.suffix is not None:
            plan.suffix = plan.suffix[:-1] + b',"cache_salt":' + orjson.dumps(salt) + b"}"
    return plan


def _plan(mode: str, dialect: Dialect, body: Any, session: str | None, size: int, path: str) -> Plan | None:
    if mode != "token" or not isinstance(body, dict):
        return None
    d = dialects.get(dialect)
    if d is None:
        return None
    if d.token_native:
        if d.upstream_path is None:  # spoken natively, but no token-aware upstream route named
            return None
        up, inject_ids, inject_lp = d.token_request(body)
        return Plan(dialect, dialect, up, body, inject_ids, inject_lp, path, d)
    if not d.chat_view:
        return None
    chat = tochat.translator.to_chat(d, body, session, size)
    if chat.get("model") is None:  # a dialect that names its model in the URL
        chat["model"] = d.model_of(path, body)
    chat["return_token_ids"] = True
    chat["logprobs"] = True
    if d.is_stream(path, body):
        chat["stream"] = True
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return Plan(dialect, Dialect.CHAT, chat, body, True, True, path, d)
