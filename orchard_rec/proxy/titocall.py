"""Tito mode's call, sans-io: the steps between the client's request and its answer, for both doors.

The aiohttp proxy (``proxy.app``) and the mitmproxy addon (``intercept.addon``) drive one
``TitoCall`` per call that tito renders (a dialect with a chat view), in this order:

1. ``plan()``: the prompt's exact ids (``TitoSessions.plan``: the session's branch extended, or a
   fresh rendering). CPU work (the chat template), no I/O: a front door may run it off its loop.
2. ``upstream()``: the token endpoint's path and the bytes to POST there (the prompt's ids in the
   body by identity, ``tito.wire_body``; a VLM's images with them).
3. ``answer(status, data)``: the endpoint's answer arrived. An error status gives the client's
   error body (recorded as ``upstream_error``); else the answer is parsed (the echoed prompt's ids
   cut out, ``idcut``) and ``first()`` is the generation it holds.
4. (the aiohttp door only) an aborted generation is continued after ``/resume`` (``proxy.partial``,
   which needs the network); either way the door hands the final ``Generated`` to
5. ``settle(gen)``: the assistant's message parsed from the ids, the record's tokens and metadata.
6. ``commit()``: the session's branch extended by this turn (``TitoSessions.commit``; CPU work).
7. ``reply()``: the bytes the client receives (an object, or the event stream of its dialect) and
   their content type. The door then makes the call durable (``wait_durable``), acknowledges it
   (``TitoSessions.acknowledge``) and writes the bytes.

Nothing here awaits or touches a socket: the steps are tested with bytes in, bytes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from orchard_rec import dialects, policy, rlwire
from orchard_rec.dialects.sse import DONE_FRAME, encode
from orchard_rec.errors import UpstreamProtocolError
from orchard_rec.proxy import idcut
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.tito import TitoSessions, wire_body
from orchard_rec.proxy.tito_wire import (
    chat_completion,
    parse_generation,
    read_upstream,
    server_prompt,
    synth_chunks,
    upstream_request,
)
from orchard_rec.records import CallOutcome, Dialect

__all__ = ["Generated", "TitoCall"]


@dataclass
class Generated:
    """One generation, however many parts it took."""

    ids: list[int]
    lps: list[float] | None
    finish: str
    text: str | None
    spans: tuple[policy.Span, ...] | None
    status: int = 200
    data: bytes = b""
    """The last part's answer as the server sent it."""
    obj: Any = None
    parts: list[dict[str, Any]] = field(default_factory=list)
    """``[{"tokens": n, "finish": "abort"}, ...]``: one entry per part, when there was more than one."""

    @classmethod
    def of(
        cls, kind: str, obj: Any, ids: list[int], lps: list[float] | None, finish: str, text: str | None
    ) -> Generated:
        """A first part, as ``tito.read_upstream`` read it, with the answer's version spans."""
        return cls(ids, lps, finish, text, rlwire.spans_in(kind, obj, len(ids)), obj=obj)


class TitoCall:
    """One call in tito mode: ``cap`` is its ``Capture``, ``body`` the client's parsed request."""

    def __init__(
        self,
        cap: Capture,
        body: dict[str, Any],
        tito: TitoSessions,
        kind: str = "vllm",
        endpoint: str = "completions",
        salt: str | None = None,
    ) -> None:
        wire = dialects.get(cap.dialect)
        assert wire is not None
        self.cap, self.body, self.tito, self.kind, self.wire = cap, body, tito, kind, wire
        self.generate = endpoint == "generate"
        chat = dialects.to_chat(cap.dialect, body)
        self.model = wire.model_of(cap.path, body)
        if chat.get("model") is None and self.model is not None:  # a dialect naming its model in the URL
            chat = {**chat, "model": self.model}
        if salt is not None and "cache_salt" not in chat:
            chat = {**chat, "cache_salt": salt}
        self.chat = chat
        self.messages: list[dict[str, Any]] = chat["messages"]
        self.tools: list[dict[str, Any]] | None = chat.get("tools")
        self.key = cap.session_id
        self.obj: Any = None
        self.up_body: dict[str, Any] = {}
        self._chat_obj: dict[str, Any] | None = None
        self._answer: dict[str, Any] | None = None

    # -- 1, 2: the request ----------------------------------------------------------------------

    def plan(self) -> None:
        """The prompt's ids for this request (CPU: the chat template; no I/O)."""
        self.p = self.tito.plan(self.key, self.messages, self.tools)
        self.images = [u for u, _ in self.p.images]  # a VLM's images go with the ids (tito.py)

    @property
    def prompt(self) -> Any:
        return self.p.prompt

    def upstream(self) -> tuple[str, bytes]:
        """The token endpoint's path (``tito.upstream_url`` places it) and the bytes to POST there."""
        p, cap = self.p, self.cap
        if self.images:  # the server expands them: what it ran is recorded (``server_prompt``)
            path, up = upstream_request(
                self.kind, self.chat, list(p.prompt), self.images, generate=self.generate
            )
            wire = orjson.dumps(up)
        else:  # the prompt's ``Ids`` in the body (the record's prompt by identity), its JSON kept
            path, up = upstream_request(self.kind, self.chat, p.prompt, self.images, generate=self.generate)
            wire = wire_body(up, p.prompt, p.json)
        self.up_body = up
        cap.upstream_request = up
        cap.upstream_raw = wire
        cap.upstream_dialect = Dialect.COMPLETIONS
        return path, wire

    # -- 3: the endpoint's answer ---------------------------------------------------------------

    def answer(self, status: int, data: bytes) -> bytes | None:
        """The token endpoint answered ``status`` with ``data``: the error body the client gets (in
        its dialect, with the server's own message) for an error status, else None (``obj`` parsed)."""
        cap = self.cap
        cap.body = data
        cap.status_code = status
        if status >= 400:  # relayed as the server said it, in the client's dialect
            cap.fail(CallOutcome.UPSTREAM_ERROR, f"upstream token endpoint answered {status}")
            err = self.wire.upstream_error(status, data)
            cap.bytes_out = len(err)
            return err
        # vLLM echoes the prompt's ids (``return_token_ids``): 150k of them late in a session, ~3 ms to
        # parse. Cut out (as token mode does), only the generated ids are parsed here; the writer
        # reads the echo from the cut (``IdParser``: the ids new since the session's last)
        got = idcut.cut(data) if not self.images else None
        if got is not None:
            rest, obj, spans = got
            for where, s, e in spans:
                if where[-1] == "token_ids":
                    node = obj
                    for step in where[:-1]:
                        node = node[step]
                    node[where[-1]] = orjson.loads(data[s:e])
            cap.id_cut = (rest, spans)
        else:
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                raise UpstreamProtocolError("the upstream's token endpoint did not answer JSON") from exc
        self.obj = obj
        return None

    def first(self) -> Generated:
        """The generation the answer holds (one part)."""
        return Generated.of(self.kind, self.obj, *read_upstream(self.kind, self.obj))

    @property
    def aborted(self) -> bool:
        """The server cut the generation (``/pause?mode=abort``): ``proxy.partial`` can go on with it."""
        return rlwire.abort_finish(self.kind, self.obj)

    # -- 5, 6: the record and the session -------------------------------------------------------

    def settle(self, gen: Generated) -> None:
        """The final generation: the assistant's message parsed from its ids, the record's tokens."""
        cap, tok = self.cap, self.tito.tok
        self.gen = gen
        seen = server_prompt(self.obj, self.prompt) if self.images else self.prompt  # expanded images
        answer = parse_generation(
            tok.decode(gen.ids, skip_special_tokens=False) if gen.text is None else gen.text,
            getattr(tok, "eos_token", None),
            tools=bool(self.tools) and self.chat.get("tool_choice") != "none",
        )
        finish = "tool_calls" if answer.get("tool_calls") else gen.finish
        self._answer = answer
        self._chat_obj = chat_completion(self.model, answer, finish, len(seen), len(gen.ids))
        cap.tokens = (seen, gen.ids, gen.lps, finish)
        if gen.spans is not None and isinstance(cap.metadata.get("policy"), dict):
            cap.metadata["policy"]["spans"] = policy.to_json(gen.spans)

    def commit(self) -> None:
        """This turn's exact ids onto the session's branch (CPU; no I/O). A cut-off turn (``length``)
        is kept like one that ended on a stop string: the template's closing tokens come with the
        next turn's (``Tito.covered``)."""
        p, gen, cap = self.p, self.gen, self.cap
        assert self._answer is not None
        branch_index = self.tito.commit(
            self.key,
            p.branch,
            p.version,
            p.prompt,
            gen.ids,
            self.messages,
            self._answer,
            self.tools,
            p.text,
            p.json,
            p.images,
        )
        cap.metadata["tito"] = {**p.decision, "branch": branch_index, "upstream_kind": self.kind}
        if self.images:
            cap.metadata["tito"]["images"] = len(self.images)
        if gen.parts:
            cap.metadata["tito"]["parts"] = gen.parts

    # -- 7: the client's answer -----------------------------------------------------------------

    def reply(self) -> tuple[bytes, str]:
        """The bytes the client receives and their content type: its dialect's object, or its
        dialect's event stream of the whole answer (tito answers after the whole generation)."""
        cap, wire, body = self.cap, self.wire, self.body
        assert self._chat_obj is not None
        if wire.is_stream(cap.path, body):
            cap.stream = True
            frames = bytearray()
            events: list[list[Any]] = []
            translator = wire.chat_stream(body, cap.path)
            opts = body.get("stream_options")
            usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            for chunk in synth_chunks(self._chat_obj, usage=usage, translated=translator is not None):
                if translator is None:
                    events.append([None, chunk])
                    frames += encode(None, chunk)
                else:
                    for name, d in translator.feed(chunk):
                        events.append([name, d])
                        frames += wire.encode_event(name, d)
            if translator is None:
                frames += DONE_FRAME
            else:
                for name, d in translator.finish():
                    events.append([name, d])
                    frames += wire.encode_event(name, d)
            cap.client_events = events
            payload, ctype = bytes(frames), "text/event-stream"
        else:
            client_obj = wire.from_chat(self._chat_obj, body, cap.path)
            cap.client_response = client_obj
            payload, ctype = orjson.dumps(client_obj), "application/json"
        cap.bytes_out = len(payload)
        return payload, ctype

    def wait_durable(self, durability: str) -> bool:
        """Whether the call must be recorded before the client has its answer: by default, and
        always for a session's call (in the database then, so that whichever replica or restarted
        process serves the next turn rebuilds this branch, ``tito_history.py``)."""
        return durability != "async" or self.key is not None
