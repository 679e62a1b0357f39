"""Reading a request body in O(what is new): the previous body of the conversation, reused.

Every call of an agent session resends the whole history: body N+1 is usually body N with
messages appended, the bytes before and after the conversation array unchanged. Parsing it
whole costs O(context) on the event loop and allocates thousands of containers the garbage
collector then scans. ``RequestCache.parse`` keeps recent bodies with their parsed objects and
where their conversation array's elements end (byte offsets); a new body that repeats an
earlier one's bytes up to the end of some element and from the array's closing ``]`` on is
that body's object with the elements in between parsed alone (``orjson``), the earlier
elements' objects shared.

The result always equals ``orjson.loads(raw)`` (a body that does not fit is parsed whole; a
malformed one raises ``orjson.JSONDecodeError`` as orjson does), so a "wrong" base (another
conversation sharing the cache key) is harmless: any base whose bytes match gives the same
object. Why the reuse is exact: JSON values are context-free, so if ``raw[:e]`` equals a
base's bytes up to the end of its element ``k`` (the parser then sits inside the array, after a
value), ``raw`` ends with the base's bytes from the array's ``]`` on (which close the array and
the object exactly as in the base), and the bytes in between are ``, value, value ...`` (or
nothing), then ``raw`` is valid and its object is the base's with elements ``k..`` replaced by
those values. They are parsed alone as ``[...]``, one JSON text only if its brackets are each
other's: new bytes that close the array and go on with other keys fail there, and the body is
parsed whole (a deeper wrapper such as ``{"":[...]}`` would accept them). New bytes with enough brackets
to come near orjson's nesting limit, which counts from the body's top, are parsed whole too. A
conversation key present twice at the top level is never reused (the last one wins, so the
offsets would not be the object's).

Offsets: a body parsed whole gets them only when a later body may repeat it (``_Entry.locate``:
a cache that thrashes costs nothing beyond the parse), from the standard library's C scanner
walking the top level of its Latin-1 decoding (one character per byte, so positions are byte
offsets; JSON's structure is ASCII and UTF-8's multi-byte sequences are all >= 0x80, never a
quote or a backslash). A body read from a base inherits the base's offsets and knows where its
last element ends; its new elements' own ends are scanned only if a later body repeats it only
in part (``_Entry.fill``).

Sharing: the returned dict is fresh, its conversation list fresh, but the elements' objects
(and the other top-level values) are the cached ones, shared with other calls of the session.
Consumers must not mutate a parsed request in place (tests check every recording path).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from json.scanner import make_scanner
from typing import Any, NamedTuple, cast

import orjson

from orchard_rec import dialects
from orchard_rec.errors import cache_stats
from orchard_rec.proxy.recent import Recent
from orchard_rec.settings import current

__all__ = ["CONVERSATION_KEYS", "Parsed", "RequestCache", "scan_offsets"]

CONVERSATION_KEYS = dialects.conversation_keys()
"""Top-level keys whose array value is a conversation (every dialect's ``conversation_keys``, registry order)."""

_WS = re.compile(r"[ \t\n\r]*")
_ws = cast(Callable[[str, int], "re.Match[str]"], _WS.match)
"""JSON whitespace from an offset (always matches)."""
_WSB = b" \t\n\r"
_scan_once = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]

MIN_BYTES = 2048
"""Bodies shorter than this are parsed whole and not cached (nothing to gain)."""
MIN_REUSE = 16384
"""Bodies shorter than this are parsed whole (orjson is as fast as the reuse there), and cached
for the longer ones that follow."""
CANDIDATES = 8
"""Bases kept per cache key (sub-agents sharing a session, sessions sharing an opening)."""
_DEEP = 1000
"""Fewer opening brackets than this in the new bytes: they cannot reach orjson's nesting limit
(1024 levels, counted from the top of the body; the elements sit two levels down)."""
HASH_WINDOW = 1024
"""Without a session name, the key is a hash of the body's first bytes (the same through a conversation)."""


class Parsed(NamedTuple):
    """A parse: the object, and the base it reused (``(call_id, P, S)``) or None."""

    obj: Any
    base: tuple[str, int, int] | None


class _Entry:
    """One cached body: its bytes, its object (never handed out), and once ``locate``d its
    conversation array's key (None: it has none fit for reuse), the offset just after its ``[``
    (``open``) and of its ``]`` (``close``), how many elements it has, where the last one ends
    (``last``; ``open`` when none), and the end offsets of the first ``len(ends)`` (the others are
    found when needed: ``fill``)."""

    __slots__ = ("call_id", "close", "count", "ends", "key", "last", "located", "obj", "open", "raw", "tail")

    def __init__(
        self, raw: bytes, obj: dict[str, Any], call_id: str, where: tuple[str, int, list[int], int] | None
    ) -> None:
        self.raw = raw
        self.obj = obj
        self.call_id = call_id
        self.key: str | None = None
        self.open = self.close = self.last = self.count = 0
        self.ends: list[int] = []
        self.tail = memoryview(b"")
        self.located = where is not None
        if where is not None:
            self._set(where)

    def _set(self, where: tuple[str, int, list[int], int]) -> None:
        self.key, self.open, self.ends, self.close = where
        self.count = len(self.ends)
        self.last = self.ends[-1] if self.ends else self.open
        self.tail = memoryview(self.raw)[self.close :]

    def locate(self) -> bool:
        """Find the offsets (once, O(body): bodies parsed whole are located only when a later body
        may repeat them); whether the body has a conversation array fit for reuse."""
        if not self.located:
            where = scan_offsets(self.raw)
            if where is not None:
                self._set(where)
            self.located = True
        return self.key is not None

    def fill(self) -> bool:
        """Every element's end offset known (scanning the elements past the last known end: the
        ones an append added); False when they cannot be had (nesting too deep for the scanner)."""
        ends = self.ends  # read once: another thread's fill may replace it meanwhile
        n = len(ends)
        if n == self.count:
            return True
        start = ends[-1] if n else self.open
        s = self.raw[start : self.close + 1].decode("latin-1")
        i = _ws(s, 0).end() + 1 if n else 0  # past ','
        try:
            more, _ = _elements(s, i)
        except (RecursionError, ValueError, StopIteration, IndexError):
            return False
        self.ends = ends + [start + x for x in more]  # a new list: entries share theirs
        return True

    @property
    def cost(self) -> int:
        """Bytes charged against the cache's bound: the raw body and its objects (about twice its size)."""
        return 3 * len(self.raw)

    def handed_out(self) -> dict[str, Any]:
        """A fresh top-level dict and conversation list (their elements shared)."""
        return _own(self.obj)


def _own(obj: dict[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    for k in CONVERSATION_KEYS:
        v = out.get(k)
        if type(v) is list:
            out[k] = v.copy()
    return out


def scan_offsets(raw: bytes) -> tuple[str, int, list[int], int] | None:
    """Where a JSON object's conversation array is: ``(key, offset after its '[', end offset of
    each element, offset of its ']')`` (the first of ``CONVERSATION_KEYS`` it has); None when it has none
    (or the key twice: the last one wins, so the first's offsets would lie), or ``raw`` is not an
    object. ``raw`` must be valid JSON (orjson parsed it)."""
    try:
        return _top_level(raw.decode("latin-1"))
    except (RecursionError, ValueError, StopIteration, IndexError):
        return None  # nested deeper than the stdlib scanner goes (or it disagrees): not cached


def _top_level(s: str) -> tuple[str, int, list[int], int] | None:
    ws = _ws
    i = ws(s, 0).end()
    if s[i : i + 1] != "{":
        return None
    i = ws(s, i + 1).end()
    if s[i] == "}":
        return None
    found: dict[str, tuple[str, int, list[int], int] | None] = {}
    while True:
        key, i = _scanstring(s, i + 1)  # s[i] == '"'
        i = ws(s, ws(s, i).end() + 1).end()  # past ':'
        if key in CONVERSATION_KEYS:
            if s[i] == "[":
                ends, close = _elements(s, i + 1)
                found[key] = None if key in found else (key, i + 1, ends, close)
                i = close + 1
            else:
                found[key] = None
                _, i = _scan_once(s, i)
        else:
            _, i = _scan_once(s, i)
        i = ws(s, i).end()
        if s[i] == "}":
            break
        i = ws(s, i + 1).end()  # past ','
    for k in CONVERSATION_KEYS:  # the first dialect's key wins (``messages`` before ``input``)
        if k in found:
            return found[k]
    return None


def _elements(s: str, i: int) -> tuple[list[int], int]:
    """The end offsets of the values of the array whose contents start at ``i``, and the offset of its ']'."""
    ws = _ws
    ends: list[int] = []
    i = ws(s, i).end()
    if s[i] == "]":
        return ends, i
    while True:
        _, i = _scan_once(s, i)
        ends.append(i)
        i = ws(s, i).end()
        if s[i] == "]":
            return ends, i
        i = ws(s, i + 1).end()  # ','


class RequestCache:
    """Recent bodies by key (a session name, else a hash of the body's opening), bounded in bytes."""

    def __init__(self, max_bytes: int, min_bytes: int = MIN_BYTES, min_reuse: int = MIN_REUSE) -> None:
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self.min_reuse = min_reuse
        self._recent: Recent[str, _Entry] = Recent(max_bytes, CANDIDATES)
        self.hits = 0
        """Bodies read from a base (equal, appended or partly reused)."""
        self.misses = 0

    def key_for(self, raw: bytes, session: str | None) -> str:
        if session is not None:
            return "s:" + session
        return "h:" + hashlib.blake2b(raw[:HASH_WINDOW], digest_size=16).hexdigest()

    def parse(self, raw: bytes, session: str | None = None, call_id: str = "") -> Parsed:
        """``orjson.loads(raw)`` (same result, same errors), reusing a cached base when one fits;
        the body is cached for the next call, tagged with ``call_id``."""
        if type(raw) is not bytes:
            raw = bytes(raw)  # kept: must not change under us
        if self.max_bytes <= 0 or len(raw) < self.min_bytes:
            return Parsed(orjson.loads(raw), None)
        key = self.key_for(raw, session)
        cands = self._recent.get(key) if len(raw) >= self.min_reuse else []
        best: tuple[_Entry, int] | None = None
        for e in cands:
            if len(raw) == len(e.raw) and raw == e.raw:  # a retry
                self.hits += 1
                return Parsed(e.handed_out(), (e.call_id, len(raw), 0))
            if not e.located and not _worth_locating(e.raw, raw):
                continue
            if not e.locate():
                continue
            k = _reusable(e, raw)
            if k is not None and (best is None or k > best[1]):
                best = (e, k)
                if k == e.count:
                    break
        if best is not None:
            got = _extend(best[0], best[1], raw, call_id)
            if got is not None:
                entry, base = got
                self.hits += 1
                # a body that repeats (nearly) all of its base supersedes it; one that shares only
                # the start (another conversation with the same opening, a compaction) is kept beside
                # it, or conversations sharing a key would keep displacing each other
                base_entry, k = best
                self._recent.put(key, entry, base_entry if k >= base_entry.count - 2 else None)
                return Parsed(entry.handed_out(), base)
        self.misses += 1
        obj = orjson.loads(raw)
        if isinstance(obj, dict):
            self._recent.put(key, _Entry(raw, _own(obj), call_id, None))
        return Parsed(obj, None)

    def stats(self) -> dict[str, int]:
        """Keys held (sessions, or openings), their bytes, the bound; bodies read from a cached
        one (hits) or parsed whole (misses)."""
        return cache_stats(len(self._recent), self._recent.size, self.max_bytes, self.hits, self.misses)

    def entries(self) -> list[_Entry]:
        """Every cached body (for tests and inspection)."""
        return [e for lst in self._recent.lists() for e in lst]

    def clear(self) -> None:
        self._recent.clear()

    @property
    def size(self) -> int:
        return self._recent.size


def _worth_locating(old: bytes, raw: bytes) -> bool:
    """Whether ``raw`` may repeat much of ``old`` (an append keeps all of it but the array's
    end, so its first or its second half): then ``old``'s offsets are worth finding."""
    half = len(old) // 2
    view = memoryview(old)
    return raw.startswith(view[:half]) or raw.endswith(view[half:])


def _reusable(e: _Entry, raw: bytes) -> int | None:
    """How many of ``e``'s elements (``e`` located) ``raw`` repeats byte for byte, the bytes
    after the array too; None when it does not even share the bytes before the array and after it."""
    if not raw.endswith(e.tail):
        return None
    view = memoryview(e.raw)
    if raw.startswith(view[: e.last]):
        return e.count
    if not raw.startswith(view[: e.open]) or not e.fill():
        return None
    ends = e.ends
    lo, hi = 0, len(ends) - 1  # the largest k with base[:ends[k-1]] a prefix of raw (ends[-1] is not)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if raw.startswith(view[: ends[mid - 1]]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _extend(e: _Entry, k: int, raw: bytes, call_id: str) -> tuple[_Entry, tuple[str, int, int]] | None:
    """``raw`` read as ``e``'s first ``k`` elements then what follows them: its entry and its
    base; None when the bytes between do not read as ``, value, ...`` (the caller then parses
    whole, for orjson's verdict)."""
    assert e.key is not None
    p = e.last if k == e.count else e.ends[k - 1] if k else e.open
    s = len(e.raw) - e.close
    stop = len(raw) - s
    if stop < p:
        return None
    mid = raw[p:stop]
    body = mid.lstrip(_WSB)
    if k and body:
        if body[0] != 0x2C:  # ","
            return None
        body = body[1:]
        if not body.strip(_WSB):
            return None  # a trailing comma
    if body.count(b"[") + body.count(b"{") >= _DEEP:
        return None  # might nest to orjson's limit, which counts from the body's top: parse whole
    try:
        # ``[`` + body + ``]`` is one JSON text only if the brackets are each other's, so body is
        # exactly ``value, value ...`` (a deeper wrapper could be closed early by body's own bytes)
        new = orjson.loads(b"[" + body + b"]") if body else []
    except orjson.JSONDecodeError:
        return None
    old = e.obj[e.key]
    obj = dict(e.obj)
    obj[e.key] = old[:k] + new if k < len(old) else old + new
    entry = _Entry(raw, obj, call_id, None)
    entry.located = True
    entry.key, entry.open, entry.close = e.key, e.open, stop
    entry.ends = e.ends if k == e.count else e.ends[:k]  # never changed in place (``fill``)
    entry.count = k + len(new)
    entry.last = p + len(mid.rstrip(_WSB)) if new else p
    entry.tail = memoryview(raw)[stop:]
    return entry, (e.call_id, p, s)


def __getattr__(name: str) -> RequestCache:
    """``cache``: the process's cache (both front doors read through it), built on first use.
    ``ORCHARD_REQUEST_CACHE_MB`` bounds it (default 256; 0 turns reuse off; ``Settings``)."""
    if name != "cache":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = globals()["cache"] = RequestCache(current().request_cache_bytes)
    return made
