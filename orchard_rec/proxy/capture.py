"""What the response path collects about a call, and how it becomes a ``CallRecord``.

The handler fills a ``Capture`` with cheap appends only (the request body it already
parsed, the raw response chunks, timestamps). Everything costly — SSE parsing, stream
reassembly, token extraction — happens in ``to_record``, which the recorder runs on
its writer thread, never on the event loop.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate
from operator import add
from typing import Any

import orjson

from orchard_rec import dialects, policy, routing
from orchard_rec.dialects import assemble, extract_tokens
from orchard_rec.dialects.sse import SSEParser, parse_block, parse_sse
from orchard_rec.proxy.idcut import MIN_BYTES, IdParser, Known
from orchard_rec.records import CallOutcome, CallRecord, Dialect
from orchard_rec.storage import layout
from orchard_rec.storage.delta import Ids

__all__ = ["Capture"]


_ids: list[str] = []
"""Call ids handed out from the end (``list.pop`` is atomic: no lock), refilled 256 at a time."""
_VERSION = bytes((b & 0x0F) | 0x40 for b in range(256))
"""Byte 6 of a version-4 UUID: its high nibble 4."""
_VARIANT = bytes((b & 0x3F) | 0x80 for b in range(256))
"""Byte 8: its two high bits 10 (RFC 4122's variant)."""


def _forget_ids() -> None:
    _ids.clear()  # a forked child (``serve --workers``) must not hand out its parent's ids


os.register_at_fork(after_in_child=_forget_ids)


def _more_ids() -> list[str]:
    """256 random (version 4) UUIDs' hex digits from one 4 KiB read of the OS's random bytes, the
    version and variant bits set for all of them at once (``bytes.translate`` over a strided slice)."""
    raw = bytearray(os.urandom(4096))
    raw[6::16] = raw[6::16].translate(_VERSION)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    digits = raw.hex()
    return [digits[i : i + 32] for i in range(0, 8192, 32)]


def new_call_id() -> str:
    """A random (version 4) UUID's 32 hex digits, as ``uuid.uuid4().hex``: from the OS's random
    bytes taken 4 KiB at a time, not one ``getrandom`` per call (a system call on the event loop
    lets the writer thread take the interpreter lock)."""
    while True:
        try:
            return _ids.pop()
        except IndexError:  # empty (another thread may take the last one between two steps)
            _ids.extend(_more_ids())


class Capture:
    __slots__ = (
        "arrivals",
        "body",
        "bytes_in",
        "bytes_out",
        "call_id",
        "chunks",
        "client_events",
        "client_response",
        "complete",
        "dialect",
        "done_at",
        "error",
        "first_byte_at",
        "harness",
        "harness_session",
        "headers",
        "id_cut",
        "metadata",
        "method",
        "outcome",
        "path",
        "received_at",
        "request",
        "request_base",
        "request_raw",
        "session_id",
        "started",
        "status_code",
        "stream",
        "submitted",
        "tokens",
        "upstream_dialect",
        "upstream_raw",
        "upstream_request",
    )

    def __init__(self, dialect: Dialect, method: str, path: str, session_id: str | None) -> None:
        self.call_id = new_call_id()
        self.session_id = session_id
        self.dialect = dialect
        self.method = method
        self.path = path
        self.headers: dict[str, str] = {}
        self.harness: str | None = None
        self.harness_session: str | None = None
        self.request: Any = None
        self.request_raw: bytes | None = None
        """The client's body as sent (decoded to text on the writer thread, in ``to_record``)."""
        self.request_base: tuple[str, int, int] | None = None
        """``(call_id, P, S)`` when the body repeats an earlier call's (``base_raw``, that call's
        ``request_raw``): ``request_raw == base_raw[:P] + request_raw[P:len(request_raw) - S] +
        base_raw[len(base_raw) - S:]`` (``proxy.reqparse``; the base may be a call of another
        session with the same bytes, or one that was refused later and never recorded)."""
        self.upstream_request: Any = None
        self.upstream_raw: bytes | None = None
        """``upstream_request`` as sent, where the handler serialized it (tito: its prompt's ids
        are an ``Ids`` there, written from their kept JSON): the spool line reuses the bytes."""
        self.stream = False
        self.status_code: int | None = None
        self.outcome = CallOutcome.OK
        self.error: str | None = None
        self.received_at = time.time()
        self.started = time.monotonic()
        """``received_at`` on the monotonic clock (what ``arrivals`` count from)."""
        self.first_byte_at: float | None = None
        self.done_at: float | None = None
        self.chunks: list[bytes] = []
        """Raw stream bytes as relayed (streams only)."""
        self.arrivals: list[float] = []
        """When each of ``chunks`` arrived (``time.monotonic()``, one read per chunk): each event's
        arrival is its last chunk's (``metadata["event_ms"]``)."""
        self.body: bytes | None = None
        """Raw non-stream response body as relayed."""
        self.id_cut: tuple[bytes, list[Any]] | None = None
        """Token mode: ``body`` less its id arrays, and where they were (``idcut``), found on the
        response path already."""
        self.bytes_in = 0
        self.bytes_out = 0
        self.metadata: dict[str, Any] = {}
        self.tokens: tuple[Any, Any, Any, Any] | None = None
        """Token-in/token-out calls set ``(prompt_ids, completion_ids, logprobs, finish)`` themselves."""
        self.submitted = False
        """Handed to the recorder already (wal durability submits before the last byte)."""
        self.complete = False
        """Every response byte was handed to the client's connection; a disconnect after this is not an abort."""
        self.upstream_dialect = dialect
        """The dialect spoken upstream (chat, when token mode translates Responses or Messages)."""
        self.client_response: Any = None
        """Translated calls: the object the client received (non-stream)."""
        self.client_events: list[Any] | None = None
        """Translated calls: the events the client received (stream)."""

    def fail(self, outcome: CallOutcome, error: str) -> None:
        self.outcome = outcome
        self.error = error

    def _ids_injected(self) -> bool:
        """Token mode asked the upstream for the ids the client did not (storage strips them from
        what the client received, events included: ``layout.client_view``)."""
        return layout.injected(self.upstream_dialect.value, self.request, self.upstream_request)[0]

    def to_record(self, ids: IdParser | None = None) -> CallRecord:
        """The record (writer thread). ``ids`` parses large answers' token-id arrays (only the ids
        new to the session, when it has seen the session's previous prompt)."""
        events: list[Any] | None = None
        at: list[int] | None = None
        upstream_obj: Any = None
        known: list[Known] = []
        if self.stream:
            events, at = _stream_events(self.chunks, self.arrivals, self.started, ids, self.session_id, known)
            upstream_obj = assemble(self.upstream_dialect, events)  # [name, data] pairs
        elif self.body is not None:
            try:
                if ids is not None and self.body:
                    upstream_obj, known = ids.load(self.body, self.session_id, self.id_cut)
                else:
                    upstream_obj = orjson.loads(self.body) if self.body else None
            except orjson.JSONDecodeError:
                upstream_obj = self.body.decode("utf-8", errors="replace")
        up_wire = dialects.get(self.upstream_dialect)
        prompt_ids, completion_ids, logprobs, finish, usage = (
            up_wire.extract_tokens(upstream_obj)
            if up_wire is not None
            else extract_tokens(self.upstream_dialect, upstream_obj)
        )
        if self.tokens is not None:
            prompt_ids, completion_ids, logprobs, finish = self.tokens
        response = upstream_obj
        wire = up_wire
        if self.upstream_dialect is not self.dialect:  # translated: keep what the client saw
            if self.client_events is not None:
                events = self.client_events
                response = assemble(self.dialect, [(n, d) for n, d in self.client_events])
            elif self.client_response is not None:
                response = self.client_response
            wire = dialects.get(self.dialect)
            finish = (wire.finish_of(response) if wire is not None else None) or finish
        prompt, completion = _ints(prompt_ids, known), _ints(completion_ids, known)
        if known or not self.stream or response is not upstream_obj:
            # a stream holds an ``Ids`` only where ``ids.load`` put one (it is then in ``known``)
            _settle(response, events, prompt, self.stream and self._ids_injected())
        if self.outcome is CallOutcome.OK and self.status_code is not None and self.status_code >= 400:
            self.outcome = CallOutcome.UPSTREAM_ERROR
        completion_t = None if completion is None else tuple(completion)
        metadata, versions = _versions(self.metadata, completion_t)
        if at and events is not None and len(at) == len(events):  # not a translation's
            metadata = {**metadata, "event_ms": at}
        routed = None
        if metadata.get("routed_experts") is True:
            metadata = {k: v for k, v in metadata.items() if k != "routed_experts"}
            sent = self.upstream_request if self.upstream_request is not None else self.request
            routed = _routing(upstream_obj, events, sent)
        model = wire.model_of(self.path, self.request) if wire is not None else None
        return _record(
            call_id=self.call_id,
            session_id=self.session_id,
            dialect=self.dialect,
            method=self.method,
            path=self.path,
            stream=self.stream,
            status_code=self.status_code,
            outcome=self.outcome,
            received_at=self.received_at,
            first_byte_at=self.first_byte_at,
            done_at=self.done_at or time.time(),
            headers=self.headers,
            harness=self.harness,
            harness_session=self.harness_session,
            model=model,
            request=self.request,
            request_text=_text(self.request_raw) if self.request is not None else None,
            upstream_request=_unshared(self.upstream_request, prompt),
            response=response,
            events=events,
            error=self.error,
            usage=usage if isinstance(usage, dict) else None,
            prompt_ids=prompt,  # ``Ids``: a sequence, equal to the tuple
            completion_ids=completion_t,
            completion_logprobs=None if logprobs is None else tuple(map(float, logprobs)),
            finish_reason=finish if isinstance(finish, str) else None,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            metadata=metadata,
            seq=None,
            policy_versions=versions,
            routed_experts=routed,
        )


def _record_maker() -> Callable[..., CallRecord]:
    """``CallRecord(**fields)``, every field by name (``to_record`` gives them all), ~1 us less a
    record: the frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``
    (a global and an attribute looked up, then the slot found by name); this sets each slot
    through its own descriptor. Generated as ``dataclasses`` generates ``__init__``, from the
    fields themselves: a field added to ``CallRecord`` is a missing argument here until
    ``to_record`` gives it (a ``TypeError`` at the first call, not a record without it)."""
    names = [f.name for f in dataclasses.fields(CallRecord)]
    ns: dict[str, Any] = {f"_set_{n}": CallRecord.__dict__[n].__set__ for n in names}
    ns["_new"], ns["_cls"] = object.__new__, CallRecord
    body = "".join(f"    _set_{n}(r, {n})\n" for n in names)
    exec(f"def make(*, {', '.join(names)}):\n    r = _new(_cls)\n{body}    return r\n", ns)
    make: Callable[..., CallRecord] = ns["make"]
    return make


_record = _record_maker()


def _stream_events(
    chunks: list[bytes],
    arrivals: list[float],
    started: float,
    ids: IdParser | None,
    session: str | None,
    known: list[Known],
) -> tuple[list[Any], list[int] | None]:
    """The stream's events as recorded (``[name, data]``, ``data`` as ``_event_data`` reads it) and
    their times (``_timed_events``).

    The usual stream, each chunk one event (a server writes an event at a time), is read in one
    pass: the chunks joined and split at their blank lines, and when the i-th event ends where the
    i-th chunk does, each event takes its chunk's time; when every event is one ``data:`` line of
    JSON small enough for no id parsing, they are parsed in bulk (``_data_lines``), else one by
    one as they come (``_one_per_chunk``); anything else goes the general way."""
    n = len(chunks)
    if len(arrivals) == n:
        buf = b"".join(chunks)
        if b"\r" not in buf:
            got = _data_lines(buf, chunks, arrivals, started, ids)
            if got is not None:
                return got
            blocks = buf.split(b"\n\n")
            if len(blocks) == n + 1 and not blocks[n]:
                del blocks[n]
                ends = list(accumulate(map(len, chunks)))
                if list(map(add, accumulate(map(len, blocks)), range(2, 2 * n + 2, 2))) == ends:
                    return _one_per_chunk(blocks, arrivals, started, ids, session, known)
    sse, at = _timed_events(chunks, arrivals, started)
    return [[name, _event_data(data, ids, session, known)] for name, data in sse], at


def _data_lines(
    buf: bytes, chunks: list[bytes], arrivals: list[float], started: float, ids: IdParser | None
) -> tuple[list[list[Any]], list[int]] | None:
    """``_stream_events`` of chunks that are each one ``data:`` line of JSON and its blank line
    (the last maybe ``[DONE]``), each too small for the id parser, parsed in bulk; None when they
    are not (nothing is consumed). ``buf``: the chunks joined, no CR.

    Its only line feeds are ``n`` blank lines, the last at the end, every other one followed by
    ``data: ``, as is the start: then each event is the ``data:`` line between them, and it is
    the i-th chunk's when the i-th ends where that chunk does."""
    n = len(chunks)
    if (
        buf.count(b"\n") != 2 * n
        or buf[-2:] != b"\n\n"
        or buf[:6] != b"data: "
        or buf.count(b"\n\ndata: ") != n - 1
    ):
        return None
    datas = buf[6:-2].split(b"\n\ndata: ")  # each event ends 8 bytes after its data
    if list(map(add, accumulate(map(len, datas)), range(8, 8 * n + 8, 8))) != list(
        accumulate(map(len, chunks))
    ):
        return None
    done = datas[-1] == b"[DONE]"
    if done:
        del datas[-1]
    if not datas or not min(map(len, datas)) or (ids is not None and max(map(len, datas)) >= MIN_BYTES):
        return None
    try:
        events = [[None, obj] for obj in map(orjson.loads, datas)]  # [DONE] among them: an error
    except orjson.JSONDecodeError:
        return None
    if done:
        events.append([None, "[DONE]"])
    return events, [round((t - started) * 1e6) // 1000 for t in arrivals]


def _one_per_chunk(
    blocks: list[bytes],
    arrivals: list[float],
    started: float,
    ids: IdParser | None,
    session: str | None,
    known: list[Known],
) -> tuple[list[list[Any]], list[int]]:
    """``_stream_events`` of a stream whose i-th chunk ends with its i-th event (``blocks``)."""
    loads, bad = orjson.loads, orjson.JSONDecodeError
    small = MIN_BYTES if ids is not None else sys.maxsize  # larger: the id parser's
    out: list[list[Any]] = []
    at: list[int] = []
    for block, t in zip(blocks, arrivals, strict=True):
        if block[:6] == b"data: " and b"\n" not in block:
            data: bytes | str = block[6:]
            if 0 < len(data) < small and data != b"[DONE]":
                try:
                    out.append([None, loads(data)])
                    at.append(round((t - started) * 1e6) // 1000)
                    continue
                except bad:
                    pass
            name = None
        else:
            ev = parse_block(block)
            if ev is None:
                continue
            name, data = ev
        out.append([name, _event_data(data, ids, session, known)])
        at.append(round((t - started) * 1e6) // 1000)
    return out, at


def _timed_events(
    chunks: list[bytes], arrivals: list[float], started: float
) -> tuple[list[tuple[str | None, bytes | str]], list[int] | None]:
    """The stream's events, and when each arrived: whole ms after the request (the arrival of
    the chunk that completed it, floored); None when the chunks' times are not known (a line of
    an older build). An event's data is its bytes as they came where that is all it is (one
    ``data:`` line), else the text ``parse_block`` makes of it (``_event_data`` reads either).

    The chunks are joined and split at their blank lines once, each event timed by the chunk
    that holds its blank line's last byte: the events and times ``SSEParser`` gives fed chunk
    by chunk (a stream with a CR anywhere takes that way itself), without a parser's work per chunk."""
    if len(arrivals) != len(chunks):
        return parse_sse(chunks), None  # type: ignore[return-value]
    buf = b"".join(chunks)
    if b"\r" in buf:
        return _timed_parsed(chunks, arrivals, started)
    blocks = buf.split(b"\n\n")
    tail = blocks.pop()  # after the last blank line: an event only if the stream ended without one
    out: list[tuple[str | None, bytes | str]] = []
    at: list[int] = []
    ends = list(accumulate(map(len, chunks)))
    j, end, ms, last = 0, 0, 0, -1
    for block in blocks:
        end += len(block) + 2
        if block.startswith(b"data: ") and b"\n" not in block:
            ev: tuple[str | None, bytes | str] | None = (None, block[6:])
        else:
            ev = parse_block(block)
        if ev is None:
            continue
        while ends[j] < end:  # the chunk with byte ``end - 1``
            j += 1
        if j != last:  # by way of µs: as a spool line's replay says
            ms, last = round((arrivals[j] - started) * 1e6) // 1000, j
        out.append(ev)
        at.append(ms)
    if tail.strip() and (ev := parse_block(tail)) is not None:
        out.append(ev)
        at.append(round((arrivals[-1] - started) * 1e6) // 1000)
    return out, at


def _timed_parsed(
    chunks: list[bytes], arrivals: list[float], started: float
) -> tuple[list[tuple[str | None, bytes | str]], list[int]]:
    """``_timed_events`` by a parser fed chunk by chunk (any line ends)."""
    p = SSEParser()
    out: list[tuple[str | None, bytes | str]] = []
    at: list[int] = []
    ms = 0
    for chunk, t in zip(chunks, arrivals, strict=True):
        got = p.feed(chunk)
        if got:
            ms = round((t - started) * 1e6) // 1000
            out += got
            at += [ms] * len(got)
    tail = p.flush()  # a last event without its blank line: complete with the last chunk
    if tail and arrivals:
        ms = round((arrivals[-1] - started) * 1e6) // 1000
    out += tail
    at += [ms] * len(tail)
    return out, at


def _event_data(data: bytes | str, ids: IdParser | None, session: str | None, known: list[Known]) -> Any:
    """One event's data as recorded: parsed JSON, else its text (``[DONE]``, an empty or
    malformed data: the text with any invalid UTF-8 replaced). Bytes are parsed as they are;
    were they not UTF-8, the parse fails and the text decides, as it always did."""
    if isinstance(data, bytes):
        if data and data != b"[DONE]":
            try:
                if ids is not None and len(data) >= MIN_BYTES:
                    if data.isascii():  # else its length in characters decides, as below
                        obj, more = ids.load(data, session)
                        known += more
                        return obj
                else:
                    return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
        data = data.decode("utf-8", errors="replace")
    try:
        if ids is not None and len(data) >= MIN_BYTES:
            obj, more = ids.load(data.encode(), session)
            known += more
            return obj
        return orjson.loads(data) if data and data != "[DONE]" else data
    except orjson.JSONDecodeError:
        return data


def _routing(answer: Any, events: list[Any] | None, upstream_request: Any) -> bytes | None:
    """The packed ``routed_experts`` of choice 0 (a stream's: the last event that carries it);
    None when the server sent none or something that is not vLLM's ``.npy`` (never a crash)."""
    found = None
    for obj in [answer, *(e[1] for e in events or () if isinstance(e, list) and len(e) == 2)]:
        choices = obj.get("choices") if isinstance(obj, dict) else None
        c0 = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        if c0 is not None and isinstance(c0.get("routed_experts"), str):
            found = c0["routed_experts"]
    if found is None:
        return None
    start = (
        upstream_request.get("routed_experts_prompt_start") if isinstance(upstream_request, dict) else None
    )
    try:
        return routing.pack(routing.from_npy_b64(found, start if isinstance(start, int) else 0))
    except (ValueError, KeyError, SyntaxError, TypeError, struct.error):
        return None


def _versions(
    metadata: dict[str, Any], completion: tuple[int, ...] | None
) -> tuple[dict[str, Any], tuple[policy.Span, ...] | None]:
    """The record's metadata and version spans from what the response path noted under
    ``metadata["policy"]``: the server's own ``spans`` (tito: vLLM's ``weight_versions``, SGLang's
    ``weight_version``), else the call's fence (``sent``/``done``, ``moved`` when the version
    changed and changed back in between). The spans go to their own column; the fence stays in
    the metadata only where the spans do not say it all: a straddle, or a call recorded without
    ids (passthrough: its spans are made at reconstruction, over the template's ids)."""
    fence = metadata.get("policy")
    if not isinstance(fence, dict):
        return metadata, None
    rest = {k: v for k, v in metadata.items() if k != "policy"}
    spans = fence.get("spans")
    if spans is not None:
        return rest, policy.from_json(spans)
    if completion is None:
        return metadata, None
    moved = fence.get("moved") or fence.get("sent") != fence.get("done")
    found = policy.fence_spans(
        fence.get("sent"), policy.UNKNOWN if moved else fence.get("done"), len(completion)
    )
    return (metadata if moved else rest), None if found is None else tuple(found)


def _unshared(sent: Any, prompt: Any) -> Any:
    """tito's ``upstream_request`` holds its prompt's ``Ids``, written by identity with the record's
    prompt; a call that failed before its tokens were settled (its server gone while an aborted
    generation waited to go on) has no such prompt: there the ids become the list they stand for
    (else neither the database nor the spool could write the record)."""
    if not isinstance(sent, dict):
        return sent
    loose = [k for k, v in sent.items() if type(v) is Ids and v is not prompt]  # (``Ids`` has no subclass)
    return {**sent, **{k: list(sent[k]) for k in loose}} if loose else sent


def _settle(response: Any, events: list[Any] | None, prompt: Any, in_events: bool) -> None:
    """Leave a prompt's ``Ids`` in what is recorded only where it is the record's prompt and where
    storage and the spool write it as ``null`` by identity: ``prompt_token_ids`` of the answer or
    of its first choice, and of an event (or its first choice) when token mode injected the ids
    (``in_events``: storage strips them from what the client received); anywhere else it becomes
    the list it stands for."""
    _settle_one(response, True, prompt)
    for e in events or ():
        if isinstance(e, list) and len(e) == 2:
            _settle_one(e[1], in_events, prompt)


def _settle_one(obj: Any, allowed: bool, prompt: Any) -> None:
    """``_settle`` of one answer or event: its ``prompt_token_ids`` and its choices'."""
    if not isinstance(obj, dict):
        return
    v = obj.get("prompt_token_ids")
    if isinstance(v, Ids) and not (allowed and v is prompt):
        obj["prompt_token_ids"] = list(v)
    choices = obj.get("choices")
    if isinstance(choices, list):
        for i, c in enumerate(choices):
            if isinstance(c, dict):
                v = c.get("prompt_token_ids")
                if isinstance(v, Ids) and not (allowed and i == 0 and v is prompt):
                    c["prompt_token_ids"] = list(v)


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _ints(v: Any, known: list[Known] | None = None) -> Sequence[int] | None:
    """``v`` as a tuple of ints; ``known``: arrays ``IdParser`` parsed as ints only, with their
    ids (no conversion needed: a prompt's ``Ids`` as it is). A stream's reassembly copies the
    list: compared then, at pointer speed (the same int objects)."""
    if type(v) is Ids:  # tito's prompt: the branch's ids, extended (``isinstance``: an ABC's check)
        return v
    for val, t, _, _ in known or ():
        if v is val:
            return t
    if not isinstance(v, list):
        return None
    for val, t, _, _ in known or ():
        if isinstance(val, list) and len(v) == len(val) and v == val:
            return t
    if len(v) >= 256:  # a prompt (tito's, 150k ids): 4-byte ints at C speed, not an int() call each
        try:
            return Ids(array("i", v))
        except (TypeError, OverflowError):  # not all ints in 4 bytes: as below
            pass
    try:  # 8-byte ints at C speed (what JSON gives: ints, or bools, taken as int() takes them)
        return tuple(array("q", v))
    except (TypeError, OverflowError):  # floats, strings, bigger ints: an int() call each
        pass
    try:
        return tuple(map(int, v))
    except (TypeError, ValueError):
        return None
