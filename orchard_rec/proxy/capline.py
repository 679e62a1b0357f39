"""Capture lines: what the spool holds of a call under ``process`` and ``machine`` durability (format 3).

Under those the client's last byte waits for its call's spool line (written, or fsync'd), so the line
must cost O(what is new in the call), not O(context): at a 150k-token context a whole record's
line was ~1.8 MB (4 ms to encode, ~5 ms to fsync). A capture line holds the ``Capture``'s raw
material instead of the record, with the big byte strings written as deltas against calls of the
same session that this process spooled earlier (their *bases*):

- the request's raw bytes: "the first ``P`` and last ``S`` bytes of the base's request" plus the
  bytes in between (``cap.request_base`` when the request parser found the base, else a
  memcmp-speed prefix/suffix search against the session's previous request);
- the upstream request: token mode's native plans as their recipe (the request plus the injected
  keys); a translated plan (Responses / Messages to chat) as the leading messages it shares, object
  for object, with one of the session's last few upstream bodies (``proxy.tochat`` reuses them)
  plus its new messages and other keys; anything else (tito) as a delta of its JSON bytes;
- the answer (the body, or the stream's chunks joined): literal bytes, except the prompt's
  ``"prompt_token_ids":[...]`` array, written as "the base's array less its ``]``" plus the new
  bytes when it extends the base's (as ``idcut.IdParser`` reuses a prefix); a stream's line adds
  ``"arrivals"``, ``[µs after the request, bytes]`` of each chunk (the record's ``event_ms``);
- tito's ``tokens``: the prompt as a reference to the upstream request's ids when it is them.

The parsed request is not written (``orjson.loads(raw)`` again at replay). The live path never
decodes a line: the recorder hands the ``Capture`` objects themselves to the database thread.

A line is one JSON object, ``"_v": 3, "_k": "cap"``; each byte string is a list of parts:
``["t", text]`` (UTF-8 bytes as text), ``["b", base64]``, and ``["ref", kind, call_id, n, start,
end(, crc)]``: bytes ``start:end`` of call ``call_id``'s ``kind`` base (``req``: its raw request,
``ids``: its prompt-ids array, ``up``: its upstream request's JSON), which is ``n`` bytes long
(and whose first ``n - 1`` bytes have that CRC-32: the database rebuilds every base when it is
read back, ``ids`` and ``up`` from ids and a recipe, ``req`` from content-addressed blobs; the
request's CRC costs ~0.09 ms per 600 kB on the spool thread; lines of builds before it have no
CRC in their ``req`` refs, and are checked by length); a
translated upstream body is ``{"msgs": [call_id, n, k], "new": [...], "keys": [...], "other": {...}}``
(the first ``k`` of call ``call_id``'s ``n`` upstream messages, then ``new``). What a line offers
as bases to later lines is in its ``"bases"``.

At replay (``Decoder``) a line's bases are found among the lines decoded before it, else in the
database (the base's line was acknowledged, so its call is there): the request text as stored
(byte-exact), the prompt ids rendered compactly (``[1,2,3]``: an ids base is only ever a compact
array, checked at O(new) cost as it grows), the upstream request re-encoded. A base that cannot
be found, or whose length or CRC differs (where the ref has one: an older build's ``up`` refs have
none), makes the line undecodable (``SpoolFormatError``): the spool moves it to ``.rejected`` with
a log line, never drops it silently.
"""

from __future__ import annotations

import base64
import logging
import operator
import time
import zlib
from collections import OrderedDict
from typing import Any

import orjson

from orchard_rec.errors import cache_stats
from orchard_rec.proxy import idcut
from orchard_rec.proxy.capbases import Bases as _Bases
from orchard_rec.proxy.capbases import common_prefix, common_suffix
from orchard_rec.proxy.capbases import same as _same
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.proxy.reqparse import RequestCache
from orchard_rec.records import CallOutcome, CallRecord, Dialect
from orchard_rec.settings import current
from orchard_rec.storage.spool import FORMAT, SpoolFormatError, json_default, load_line, record_from_dict
from orchard_rec.storage.store import Store

__all__ = [
    "FIELDS",
    "KIND",
    "LIVE_ONLY",
    "PARTS",
    "Decoder",
    "Encoder",
    "is_capture_line",
    "record_of_line",
    "snapshot",
]

log = logging.getLogger("orchard_rec.capline")

KIND = "cap"
"""``"_k"`` of a capture line (a line without it is a record line)."""
_INJECTED = ("return_token_ids", "logprobs")
"""The keys token mode adds to a native chat/completions request (``token.plan_for``)."""
_COMPACT = b"0123456789,-[]"
_SMALL = 4096
"""Byte strings shorter than this are written whole: a delta saves nothing worth its base."""

_SLOTS: tuple[str, ...] = tuple(Capture.__slots__)

FIELDS: tuple[str, ...] = (
    "call_id",
    "session_id",
    "dialect",
    "upstream_dialect",
    "method",
    "path",
    "headers",
    "harness",
    "harness_session",
    "stream",
    "status_code",
    "outcome",
    "error",
    "received_at",
    "first_byte_at",
    "done_at",
    "bytes_in",
    "bytes_out",
    "metadata",
    "client_response",
    "client_events",
)
"""The ``Capture`` slots a line holds as they are, under their own names (the enums in ``_ENUMS`` as
their values): the encoder writes and the decoder sets exactly these."""


def _head_of(names: tuple[str, ...]) -> Any:
    """A function giving a line's head, ``{"_v": FORMAT, "_k": KIND, <name>: cap.<name>, ...}`` for
    ``names`` in their order: one dict display, compiled once from ``FIELDS`` (so the encoder still
    reads the decoder's tuple), ~0.45 us a call less than ``zip`` over an ``attrgetter``."""
    assert all(n.isidentifier() for n in names)
    items = ", ".join(f"{n!r}: cap.{n}" for n in names)
    ns: dict[str, Any] = {}
    exec(f"def head(cap):\n    return {{'_v': {FORMAT!r}, '_k': {KIND!r}, {items}}}\n", ns)
    return ns["head"]


_head = _head_of(FIELDS)
_ENUMS: dict[str, type[Dialect] | type[CallOutcome]] = {
    "dialect": Dialect,
    "upstream_dialect": Dialect,
    "outcome": CallOutcome,
}
PARTS: tuple[str, ...] = (
    "request_raw",
    "request",
    "upstream_request",
    "upstream_raw",
    "tokens",
    "body",
    "chunks",
    "arrivals",
    "started",
    "id_cut",
)
"""The slots a line holds in its own form: ``request``, ``upstream``, ``tokens``, ``answer``."""
LIVE_ONLY: tuple[str, ...] = ("request_base", "complete", "submitted")
"""The slots no line holds: the response path's hints and state (a record is the same without them)."""


def snapshot(cap: Capture) -> Capture:
    """A shallow copy of ``cap`` as it is now (its lists and metadata copied): what its spool
    line says, so the record the database thread builds later from it is the record a replay of
    the line builds, whatever the handler does to ``cap`` afterwards."""
    c = Capture.__new__(Capture)
    for name in _SLOTS:
        try:
            setattr(c, name, getattr(cap, name))
        except AttributeError:  # a slot never set
            pass
    c.chunks = list(cap.chunks)
    c.arrivals = list(cap.arrivals)
    c.metadata = dict(cap.metadata)
    if cap.client_events is not None:  # a translated stream's list, the filter's own
        c.client_events = list(cap.client_events)
    if c.done_at is None:
        c.done_at = time.time()
    return c


def _chunks(answer: bytes, arrivals: Any) -> tuple[list[bytes], list[float], float]:
    """A stream's chunks as they arrived, and when (a line of an older build: one chunk, no times)."""
    if not arrivals or sum(n for _, n in arrivals) != len(answer):
        return [answer], [], 0.0
    chunks, times, pos = [], [], 0
    for us, n in arrivals:
        chunks.append(answer[pos : pos + n])
        times.append(us / 1e6)
        pos += n
    return chunks, times, 0.0


def is_capture_line(d: dict[str, Any]) -> bool:
    return d.get("_k") == KIND


# -- byte helpers (the prefix/suffix search and the bases: ``capbases``) ---------------------------


def _lit(data: bytes | memoryview) -> list[Any]:
    b = bytes(data)
    try:
        return ["t", b.decode("utf-8")]
    except UnicodeDecodeError:
        return ["b", base64.b64encode(b).decode("ascii")]


def _compact(data: bytes) -> bool:
    return not data.translate(None, _COMPACT)


# -- encoding (the spool thread) -------------------------------------------------------------------


class Encoder:
    """Writes capture lines on the spool thread (one thread uses it). ``encode`` remembers each
    call's bases at once (a later call of the same batch may use them: it is decoded after it);
    ``reset`` forgets them all, after an append that failed (those lines may not be on disk)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is None:
            max_bytes = current().spool_bases_bytes
        self.bases = _Bases(max_bytes)
        self.objs: OrderedDict[str, list[tuple[str, dict[str, Any], int]]] = OrderedDict()
        """Per session, its last few translated upstream bodies ``(call id, body, size)``: their
        ``messages`` are shared, object for object, by the next call's (``proxy.tochat``)."""
        self.objs_bytes = 0
        self.max_objs_bytes = max_bytes
        self.whole = 0
        """Byte strings written whole (no base, or it did not match): a session's first call, mostly."""
        self.based = 0
        """Byte strings (and translated message lists) written as a reference to a base + what is new."""

    def stats(self) -> dict[str, int]:
        """Sessions' bases held (one per kind: request, upstream, ids) and translated bodies, their
        bytes, the bound (each: ``ORCHARD_SPOOL_BASES_MB``); values written on a base (hits) or
        whole (misses)."""
        return cache_stats(
            len(self.bases),
            self.bases.bytes + self.objs_bytes,
            self.bases.max_bytes + self.max_objs_bytes,
            self.based,
            self.whole,
        )

    def reset(self) -> None:
        self.bases.clear()
        self.objs.clear()
        self.objs_bytes = 0

    def encode(self, cap: Capture) -> bytes:
        sid = cap.session_id
        offers: dict[str, Any] = {}
        d: dict[str, Any] = _head(cap)  # orjson writes the enums (``_ENUMS``) as their values
        d["parsed"] = cap.request is not None
        d["request"] = self._request(cap, sid, offers)
        d["upstream"] = self._upstream(cap, sid, offers)
        d["tokens"] = None if cap.tokens is None else self._tokens(cap)
        if cap.stream:
            answer: bytes | None = b"".join(cap.chunks)
            if len(cap.arrivals) == len(cap.chunks):  # each chunk's arrival (µs) and length
                t0 = cap.started
                d["arrivals"] = [[round((t - t0) * 1e6), len(c)] for t, c in zip(cap.arrivals, cap.chunks)]
        else:
            answer = cap.body
        d["answer"] = None if answer is None else self._answer(cap, answer, sid, offers)
        if cap.id_cut is not None and answer is cap.body:
            d["cut"] = cap.id_cut[1]  # where the answer's id arrays are (token mode found them)
        if offers:
            d["bases"] = offers
        return orjson.dumps(d, default=json_default)

    # the request's raw bytes
    def _request(self, cap: Capture, sid: str | None, offers: dict[str, Any]) -> list[Any] | None:
        raw = cap.request_raw
        if raw is None:
            return None
        out: list[Any] | None = None
        if cap.request is not None and len(raw) >= _SMALL:
            base = None
            hint = getattr(cap, "request_base", None)
            if hint is not None:
                base = self.bases.by_id("req", hint[0])
            if base is None and sid is not None:
                base = self.bases.get("req", sid)
            if base is not None:
                out = _delta("req", base, raw)
                self.based += out is not None
        if out is None:
            self.whole += len(raw) >= _SMALL
            out = [_lit(raw)]
        if cap.request is not None and sid is not None:  # the database has its text: a base
            if len(raw) < _SMALL:  # no delta can use it (``_delta``): not kept, the session's last dropped
                self.bases.drop("req", sid)
            else:
                self.bases.put(
                    "req", sid, (cap.call_id, raw, 0, len(raw), -1)
                )  # its CRC: when a ref needs it
            offers["req"] = True
        return out

    # what went upstream
    def _upstream(self, cap: Capture, sid: str | None, offers: dict[str, Any]) -> Any:
        up = cap.upstream_request
        if up is None:
            return None
        recipe = _recipe(cap.request, up)
        if recipe is not None:
            return {"recipe": recipe}
        if sid is not None and type(up) is dict and isinstance(up.get("messages"), list):
            return self._messages(cap, up, sid, offers)
        data = cap.upstream_raw if cap.upstream_raw is not None else orjson.dumps(up, default=json_default)
        out: list[Any] | None = None
        if sid is not None and len(data) >= _SMALL:
            base = self.bases.get("up", sid)
            if base is not None:
                out = _delta("up", base, data)
                self.based += out is not None
        if out is None:
            self.whole += len(data) >= _SMALL
            out = [_lit(data)]
        if sid is not None:  # read back, it is rebuilt from the database's recipe: checked by CRC
            if len(data) < _SMALL:  # as a request's (``_request``)
                self.bases.drop("up", sid)
            else:
                self.bases.put("up", sid, (cap.call_id, data, 0, len(data), -1))
            offers["up"] = True
        return {"bytes": out}

    def _messages(self, cap: Capture, up: dict[str, Any], sid: str, offers: dict[str, Any]) -> Any:
        """A translated chat body: the messages it shares (by identity) with one of the session's
        last upstream bodies as a reference, the rest as JSON. O(messages + new bytes)."""
        msgs = up["messages"]
        best: tuple[str, int, int] | None = None
        for bid, body, _ in self.objs.get(sid, ()):
            old = body["messages"]
            n = min(len(old), len(msgs))
            k = 0
            while k < n and msgs[k] is old[k]:
                k += 1
            if k and (best is None or k > best[2]):
                best = (bid, len(old), k)
        if best is None:
            self.whole += 1
        else:
            self.based += 1
        out = {
            "msgs": None if best is None else list(best),
            "new": msgs if best is None else msgs[best[2] :],
            "keys": list(up),
            "other": {k: v for k, v in up.items() if k != "messages"},
        }
        size = max(cap.bytes_in, 1)
        before = self.objs.pop(sid, [])
        self.objs_bytes -= sum(e[2] for e in before)
        kept = [e for e in before if best is None or e[0] != best[0]]  # the continued one is replaced
        entries = [(cap.call_id, up, size), *kept[:3]]
        self.objs[sid] = entries
        self.objs_bytes += sum(e[2] for e in entries)
        while self.objs_bytes > self.max_objs_bytes and self.objs:
            _, gone = self.objs.popitem(last=False)
            self.objs_bytes -= sum(e[2] for e in gone)
        offers["upobj"] = True
        return out

    def _tokens(self, cap: Capture) -> Any:
        t = cap.tokens
        if t is None:
            return None
        prompt, rest = t[0], list(t[1:])
        up = cap.upstream_request
        if isinstance(up, dict) and prompt is not None:
            for key in ("prompt", "input_ids", "token_ids"):
                if up.get(key) is prompt:  # tito sends the prompt it records: once in the line
                    return {"prompt_from": key, "rest": rest}
        return {"prompt": prompt, "rest": rest}

    # the answer, its prompt-ids array as a delta
    def _answer(self, cap: Capture, answer: bytes, sid: str | None, offers: dict[str, Any]) -> list[Any]:
        at = _prompt_at(cap, answer) if sid is not None and len(answer) >= idcut.MIN_BYTES else None
        if at is None:
            return [_lit(answer)]
        assert sid is not None
        s, e = at  # e: the array's end when the response path found it already, else 0
        out: list[Any] = [_lit(memoryview(answer)[:s])]
        crc = -1
        base = self.bases.get("ids", sid)
        if base is not None:
            bid, bdata, bs, be, bcrc = base
            k = be - bs - 1  # the base's array less its "]"
            if (
                len(answer) > s + k
                and answer[s + k] in (0x2C, 0x5D)  # "," or "]"
                and _same(answer, s, memoryview(bdata), bs, k)
            ):
                end = e or answer.find(b"]", s + k) + 1  # only the new ids are searched
                tail = answer[s + k : end]
                if end > s + k and _compact(tail):  # flat and compact, as the base was
                    e = end
                    out.append(["ref", "ids", bid, k + 1, 0, k, bcrc])
                    self.based += 1
                    out.append(_lit(tail))
                    crc = zlib.crc32(tail[:-1], bcrc)
        if crc < 0:
            e = e or answer.find(b"]", s) + 1
            if e <= s:
                return [_lit(answer)]
            arr = answer[s:e]
            out.append(_lit(arr))
            self.whole += 1
            if _compact(arr):
                crc = zlib.crc32(memoryview(arr)[:-1])
        if crc >= 0:
            self.bases.put("ids", sid, (cap.call_id, answer, s, e, crc))
            offers["ids"] = [s, e]
        else:
            self.bases.drop("ids", sid)
        out.append(_lit(memoryview(answer)[e:]))
        return out


def _delta(kind: str, base: tuple[str, bytes, int, int, int], data: bytes) -> list[Any] | None:
    """``data`` as the base's first ``P`` bytes + new bytes + the base's last ``S`` bytes, or None
    when they share too little to be worth it."""
    bid, bdata, bs, be, crc = base
    b = bdata if (bs, be) == (0, len(bdata)) else bdata[bs:be]
    n = len(b)
    p = common_prefix(data, b)
    s = common_suffix(data, b, min(len(data), n) - p)
    if p + s < _SMALL:
        return None
    check: list[int] = []  # ``ids`` refs carry theirs in their own place
    if kind in ("up", "req"):
        # a request's or upstream body's CRC is taken when a ref to it is written (-1 until then):
        # a base no later line refers to (a session's last call) costs none
        check.append(crc if crc >= 0 else zlib.crc32(memoryview(bdata)[:-1]))
    # cut at character boundaries: the new bytes are then text of their own
    while p and p < len(data) and (data[p] & 0xC0) == 0x80:
        p -= 1
    while s and (data[len(data) - s] & 0xC0) == 0x80:
        s -= 1
    out: list[Any] = []
    if p:
        out.append(["ref", kind, bid, n, 0, p, *check])
    if len(data) - s > p:
        out.append(_lit(memoryview(data)[p : len(data) - s]))
    if s:
        out.append(["ref", kind, bid, n, n - s, n, *check])
    return out


def _recipe(request: Any, up: Any) -> dict[str, Any] | None:
    """Token mode's native plan: ``up`` is the request with ``_INJECTED`` keys set (``plan_for``),
    as ``{key: value}`` to set on a copy of the request; None when it is anything else."""
    if type(request) is not dict or type(up) is not dict or up is request or len(up) < len(request):
        return None
    extra: dict[str, Any] = {}
    items = iter(up.items())
    for (rk, rv), (k, v) in zip(
        request.items(), items
    ):  # ``dict(request) | extra``: the request's keys first
        if k != rk:
            return None
        if v is rv:
            continue
        if k not in _INJECTED or isinstance(v, dict | list):
            return None
        extra[k] = v
    for k, v in items:  # (zip stops at the request's end without taking one of these)
        if k not in _INJECTED or isinstance(v, dict | list):
            return None
        extra[k] = v
    return extra


_KEY = b'"prompt_token_ids":'


def _prompt_at(cap: Capture, answer: bytes) -> tuple[int, int] | None:
    """Where the answer's (first) prompt-ids array starts, and its end if known already: from
    ``cap.id_cut`` (token mode found it on the response path), else the first ``"prompt_token_ids":``
    key followed by ``[`` (a C-speed search of the bytes before it: in valid JSON that pattern only
    starts a key). The array's bytes are not checked here: only what is new in them is, as it is
    written (``_answer``). None if there is none."""
    if not cap.stream and cap.id_cut is not None and cap.body is answer:
        for path, s, e in cap.id_cut[1]:
            if path and path[-1] == "prompt_token_ids":
                return s, e
        return None
    i = answer.find(_KEY)
    if i < 0:
        return None
    s = i + len(_KEY)
    while answer[s : s + 1] in (b" ", b"\n", b"\r", b"\t"):
        s += 1
    return (s, 0) if answer[s : s + 1] == b"[" else None


# -- decoding (replay) -------------------------------------------------------------------------------

_PLAIN: tuple[str, ...] = tuple(n for n in FIELDS if n not in _ENUMS)
_plain_of = operator.itemgetter(*_PLAIN)
_OUTCOMES: dict[Any, CallOutcome] = {o.value: o for o in CallOutcome}


def _blank() -> Capture:
    """A ``Capture`` as ``__init__`` leaves one but for ``FIELDS`` (the line sets them all): no call
    id drawn (a lock and the OS's random bytes), one clock read (a stream's line sets ``started``)."""
    cap = Capture.__new__(Capture)
    cap.request = cap.request_raw = cap.request_base = None
    cap.upstream_request = cap.upstream_raw = cap.body = cap.id_cut = cap.tokens = None
    cap.chunks, cap.arrivals, cap.started = [], [], time.monotonic()
    cap.submitted = cap.complete = False
    return cap


class Decoder:
    """Turns capture lines back into ``Capture`` objects, in spool order (one replay pass).

    Bases come from the lines decoded before (kept until ``prune``) or from ``store``. Errors:
    ``SpoolFormatError`` for a line that cannot be rebuilt (set it aside); anything the database
    raises while a base is read propagates (the database is down: retry the pass later)."""

    def __init__(
        self, store: Store | None, *, requests: RequestCache | None = None, max_bytes: int | None = None
    ) -> None:
        self.store = store
        self.requests = requests
        """Parses requests reusing the session's earlier bodies (the database writer process: O(new)
        per call); else ``orjson.loads`` whole (a replay)."""
        self.max_bytes = max_bytes
        """``prune`` keeps at most this many bytes of bases (the least recently offered sessions'
        go first; a later line that needs one reads it from the database). None: no bound."""
        self._bases: dict[tuple[str, str], bytes] = {}
        """``(kind, call id)`` -> the base's bytes, from lines of this pass."""
        self._objs: dict[str, dict[str, Any]] = {}
        """call id -> its translated upstream body (this pass's, or read back)."""
        self._latest: OrderedDict[tuple[str, str | None], str] = OrderedDict()
        """``(kind, session)`` -> the call id of the session's latest base of that kind, the least
        recently offered first."""
        self._stale: list[tuple[str, str]] = []
        """``(kind, call id)`` of bases no longer a session's latest (superseded, or read back from
        the database): ``prune`` drops them, so its cost is what changed since the last one."""
        self._held = 0
        """Bytes in ``_bases``."""
        self.from_db = 0

    def prune(self) -> None:
        """Everything decoded so far is in the database: keep only each session's latest bases
        (and, with ``max_bytes``, only the most recently offered sessions' within it)."""
        for kind, cid in self._stale:
            self._drop(kind, cid)
        self._stale.clear()
        while self.max_bytes is not None and self._held > self.max_bytes and self._latest:
            (kind, _), cid = self._latest.popitem(last=False)
            self._drop(kind, cid)

    def _drop(self, kind: str, cid: str) -> None:
        if kind == "upobj":
            self._objs.pop(cid, None)
            return
        data = self._bases.pop((kind, cid), None)
        if data is not None:
            self._held -= len(data)

    def _keep(self, kind: str, cid: str, data: bytes) -> None:
        old = self._bases.get((kind, cid))
        self._held += len(data) - (0 if old is None else len(old))
        self._bases[(kind, cid)] = data

    def _latest_is(self, kind: str, sid: str | None, cid: str) -> None:
        old = self._latest.pop((kind, sid), None)  # to the end: eviction goes from the front
        if old is not None and old != cid:
            self._stale.append((kind, old))
        self._latest[(kind, sid)] = cid

    def capture(self, d: dict[str, Any]) -> Capture:
        try:
            return self._capture(d)
        except SpoolFormatError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as exc:
            raise SpoolFormatError(f"capture line: {type(exc).__name__}: {exc}") from None

    def _capture(self, d: dict[str, Any]) -> Capture:
        cap = _blank()
        for name, v in zip(_PLAIN, _plain_of(d), strict=True):
            setattr(cap, name, v)
        known = Dialect._interned  # (an unknown name: as ``Dialect`` takes it; not a string: TypeError)
        cap.dialect = known.get(d["dialect"]) or Dialect(d["dialect"])
        cap.upstream_dialect = known.get(d["upstream_dialect"]) or Dialect(d["upstream_dialect"])
        cap.outcome = _OUTCOMES.get(d["outcome"]) or CallOutcome(d["outcome"])
        offers = d.get("bases") or {}
        sid = cap.session_id
        if d["request"] is not None:
            raw = self._bytes(d["request"])
            cap.request_raw = raw
            if d["parsed"]:
                cap.request = (
                    orjson.loads(raw) if self.requests is None else self.requests.parse(raw, sid).obj
                )
            if offers.get("req"):
                self._offer("req", sid, cap.call_id, raw)
        up = d["upstream"]
        if up is not None:
            if "recipe" in up:
                if not isinstance(cap.request, dict):
                    raise SpoolFormatError("an upstream recipe without a parsed request")
                rebuilt = dict(cap.request)
                rebuilt.update(up["recipe"])
                cap.upstream_request = rebuilt
            elif "keys" in up:
                msgs = up["new"]
                if up["msgs"] is not None:
                    bid, n, k = up["msgs"]
                    msgs = self._messages(bid, n)[:k] + msgs
                other = up["other"]
                cap.upstream_request = {key: msgs if key == "messages" else other[key] for key in up["keys"]}
                if offers.get("upobj"):
                    self._objs[cap.call_id] = cap.upstream_request
                    self._latest_is("upobj", sid, cap.call_id)
            else:
                data = self._bytes(up["bytes"])
                cap.upstream_request = orjson.loads(data)
                cap.upstream_raw = data
                if offers.get("up"):
                    self._offer("up", sid, cap.call_id, data)
        t = d["tokens"]
        if t is not None:
            prompt = cap.upstream_request[t["prompt_from"]] if "prompt_from" in t else t["prompt"]
            cap.tokens = (prompt, *t["rest"])
        if d["answer"] is not None:
            answer = self._bytes(d["answer"])
            if cap.stream:
                cap.chunks, cap.arrivals, cap.started = _chunks(answer, d.get("arrivals"))
            else:
                cap.body = answer
            cut = d.get("cut")
            if cut and not cap.stream:  # the id arrays' places: the writer need not search for them
                spans = [(tuple(path), s, e) for path, s, e in cut]
                cap.id_cut = (idcut.without_arrays(answer, [(s, e) for _, s, e in spans]), spans)
            span = offers.get("ids")
            if span:
                self._offer("ids", sid, cap.call_id, answer[span[0] : span[1]])
        return cap

    def _messages(self, cid: str, n: int) -> list[Any]:
        """The ``messages`` of call ``cid``'s upstream body (``n`` of them), from this pass or the database."""
        body = self._objs.get(cid)
        if body is None and self.store is not None:
            rec = self.store.get_call(cid)
            body = None if rec is None else rec.upstream_request
            if isinstance(body, dict):
                self._objs[cid] = body
                self._stale.append(("upobj", cid))
                self.from_db += 1
        if not isinstance(body, dict):
            raise SpoolFormatError(
                f"its upstream base, call {cid}, is neither in the spool nor in the database "
                "(was the database replaced?)"
            )
        msgs = body.get("messages")
        if not isinstance(msgs, list) or len(msgs) != n:
            raise SpoolFormatError(f"its upstream base, call {cid}, is not the body it was written against")
        return msgs

    def _offer(self, kind: str, sid: str | None, call_id: str, data: bytes) -> None:
        self._keep(kind, call_id, data)
        self._latest_is(kind, sid, call_id)

    def _bytes(self, parts: list[Any]) -> bytes:
        out: list[bytes] = []
        for p in parts:
            tag = p[0]
            if tag == "t":
                out.append(p[1].encode("utf-8"))
            elif tag == "b":
                out.append(base64.b64decode(p[1], validate=True))
            elif tag == "ref":
                kind, cid, n, start, end = p[1:6]
                base = self._base(kind, cid, n, p[6] if len(p) > 6 else None)
                out.append(base[start:end])
            else:
                raise SpoolFormatError(f"capture line: unknown part {tag!r}")
        return b"".join(out)

    def _base(self, kind: str, cid: str, n: int, crc: int | None) -> bytes:
        data = self._bases.get((kind, cid))
        if data is not None:  # the bytes of a line of this pass: exact by construction
            if len(data) != n:
                raise SpoolFormatError(
                    f"its {kind} base, call {cid}, is not the bytes it was written against"
                )
            return data
        data = self._from_db(kind, cid)
        if data is None:
            raise SpoolFormatError(
                f"its {kind} base, call {cid}, is neither in the spool nor in the database "
                "(was the database replaced?)"
            )
        if len(data) != n or (crc is not None and zlib.crc32(memoryview(data)[: n - 1]) != crc):
            raise SpoolFormatError(
                f"its {kind} base, call {cid}, reads back from the database other than it was written"
            )
        self._keep(kind, cid, data)
        self._stale.append((kind, cid))
        self.from_db += 1
        return data

    def _from_db(self, kind: str, cid: str) -> bytes | None:
        if self.store is None:
            return None
        try:
            return self._read(kind, cid)
        except LookupError as exc:  # the database's own chain is broken there
            raise SpoolFormatError(f"its {kind} base, call {cid}, cannot be read: {exc}") from None

    def _read(self, kind: str, cid: str) -> bytes | None:
        assert self.store is not None
        if kind == "req":
            text = self.store.request_text(cid)
            return None if text is None else text.encode("utf-8")
        if kind == "ids":
            ids = self.store.prompt_ids(cid)
            return None if ids is None else orjson.dumps(list(ids))
        if kind == "up":
            rec = self.store.get_call(cid)
            return None if rec is None or rec.upstream_request is None else orjson.dumps(rec.upstream_request)
        raise SpoolFormatError(f"capture line: unknown base kind {kind!r}")


def record_of_line(dec: Decoder, line: bytes, ids: IdParser | None) -> CallRecord:
    """A spool line's record: a capture line's built by ``to_record`` as a live call's is.
    ``SpoolFormatError`` for a line that cannot become one."""
    d = load_line(line)
    if not is_capture_line(d):
        return record_from_dict(d)
    cap = dec.capture(d)
    try:
        return cap.to_record(ids)
    except Exception as exc:
        raise SpoolFormatError(f"its record cannot be built: {type(exc).__name__}: {exc}") from None
