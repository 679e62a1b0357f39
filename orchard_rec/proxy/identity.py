"""Who is calling: session ids from the route or header, the harness from its headers.

Session ids are validated here (charset and length) before they reach anything else;
they only ever reach SQL as bound parameters. Secret headers are dropped here, before
a record exists, so no code path can store them.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from typing import Any

import orjson

from orchard_rec import dialects
from orchard_rec.errors import BadRequest, cache_stats
from orchard_rec.records import SESSION_ID_RULE, session_id_problem

__all__ = [
    "SESSION_HEADER",
    "derive_session",
    "harness_of",
    "opening_stats",
    "public_headers",
    "response_headers",
    "validate_session_id",
]

SESSION_HEADER = "X-Orchard-Session"
_SECRET_RE = re.compile(r"authorization|api[-_]?key|cookie|token|secret|password|credential", re.I)
_DROP = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding"})


def validate_session_id(sid: str) -> str:
    """``sid`` when it follows ``records.SESSION_ID_RULE``, else a 400 saying why."""
    problem = session_id_problem(sid)
    if problem is not None:
        raise BadRequest(f"invalid session id: {problem} ({SESSION_ID_RULE})", param="session_id")
    return sid


_KEEP: dict[str, str | None] = {}
"""Header name -> its stored (lower-case) name, or None when it is dropped; decided once per name."""


def _kept(name: str) -> str | None:
    low = name.lower()
    secret = _SECRET_RE.search(low) or low in dialects.secret_headers()  # a dialect's own credential header
    keep = None if low in _DROP or secret else low
    if len(_KEEP) < 4096:  # bounded: hostile clients cannot grow it without limit
        _KEEP[name] = keep
    return keep


def public_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers fit to store: no secrets, no transport noise."""
    out = {}
    for k, v in headers.items():
        name = _KEEP[k] if k in _KEEP else _kept(k)
        if name is not None:
            out[name] = v
    return out


_RESPONSE_SECRET_RE = re.compile(
    r"authorization|api[-_]?key|cookie|token(?!s)|secret|password|credential", re.I
)
"""A response header that may carry a credential (``set-cookie``, ``x-session-token``...); the
rate-limit counters (``x-ratelimit-remaining-tokens``) are not secrets."""
RESPONSE_HEADERS_MAX = 64
"""At most this many response headers are recorded, each name and value cut to ``_VALUE_MAX``."""
_VALUE_MAX = 512
_RESPONSE_KEEP: dict[str, str | None] = {}


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream's response headers fit to store: no secrets, no transport noise, bounded
    (``RESPONSE_HEADERS_MAX`` headers of at most ``_VALUE_MAX`` characters: ~33 kB at worst).
    A repeated header keeps its values joined with ``, ``."""
    out: dict[str, str] = {}
    for k, v in headers.items():
        name = _RESPONSE_KEEP.get(k, "")
        if name == "":
            low = k.lower()[:_VALUE_MAX]
            bad = _RESPONSE_SECRET_RE.search(low) or low in dialects.secret_headers()
            name = None if bad or low in _DROP else low
            if len(_RESPONSE_KEEP) < 4096:  # bounded: hostile upstreams cannot grow it without limit
                _RESPONSE_KEEP[k] = name
        if name is None:
            continue
        if name in out:
            out[name] = (out[name] + ", " + v)[:_VALUE_MAX]
        elif len(out) < RESPONSE_HEADERS_MAX:
            out[name] = v[:_VALUE_MAX]
    return out


def harness_of(headers: Mapping[str, str], body: Any = None) -> tuple[str | None, str | None]:
    """``(harness name, harness's own session id)``: the harness plug-ins decide (``orchard_rec.harnesses.identify``)."""
    from orchard_rec.harnesses import identify

    return identify(headers, body)


def derive_session(
    harness: str | None, harness_session: str | None, dialect: Any, body: dict[str, Any]
) -> str | None:
    """A session id for a call that named none: the harness's own session id, else the
    conversation's opening (system/developer instructions and first user message), hashed.

    Calls of one agent conversation share that opening, so a user who only set a base URL
    still gets sessions; the ids are prefixed ``h-`` and ``c-`` so they never collide with
    ids a client chose.
    """
    if harness_session:
        digest = hashlib.sha256(f"{harness}:{harness_session}".encode()).hexdigest()[:24]
        return f"h-{harness or 'x'}-{digest}"[:128]
    opening = dialects.opening(dialect, body)
    if opening is None:
        return None
    return "c-" + _openings.digest(opening)


class _Openings:
    """Recent openings' digests, by the identity of their parts. A session's bodies read through
    the request cache share their messages' objects (``reqparse``: parsed requests are never
    mutated), so a long system prompt is encoded and hashed once per session, not on every call
    (~5 us for 7 kB, ~16 us for 29 kB). An entry holds its parts: while it is kept, no other
    object can have their ids, so the same ids are the same objects. Bounded by the openings'
    encoded bytes. A small opening (under ``MIN_BYTES`` encoded: its objects are parsed anew each
    call) is kept by its encoded bytes instead (``small``, ``SMALL_MAX_BYTES`` of them): encoding it
    costs less than holding its objects, hashing it again more than a look-up (~0.35 us)."""

    MIN_BYTES = 2048
    MAX_BYTES = 8 * 1024 * 1024
    SMALL_MAX_BYTES = 256 * 1024

    def __init__(self) -> None:
        self.entries: dict[tuple[int, ...], tuple[list[Any], str, int]] = {}
        self.bytes = 0
        self.small: dict[bytes, str] = {}
        self.small_bytes = 0
        self.lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        """Openings kept (by their parts, or small ones by their bytes) that were encoded and hashed."""

    def stats(self) -> dict[str, int]:
        """Openings kept, their encoded bytes, the bound; digests found (hits) or computed (misses)."""
        return cache_stats(
            len(self.entries) + len(self.small),
            self.bytes + self.small_bytes,
            self.MAX_BYTES + self.SMALL_MAX_BYTES,
            self.hits,
            self.misses,
        )

    def digest(self, opening: list[Any]) -> str:
        key = tuple(map(id, opening))
        hit = self.entries.get(key)
        if hit is not None:
            self.hits += 1
            return hit[1]
        raw = orjson.dumps(opening)
        if len(raw) < self.MIN_BYTES:
            return self._small(raw)
        digest = hashlib.sha256(raw).hexdigest()[:32]
        if len(raw) <= self.MAX_BYTES // 4:
            self.misses += 1
            with self.lock:
                if key not in self.entries:
                    self.entries[key] = (opening, digest, len(raw))
                    self.bytes += len(raw)
                    while self.bytes > self.MAX_BYTES:
                        self.bytes -= self.entries.pop(next(iter(self.entries)))[2]
        return digest

    def _small(self, raw: bytes) -> str:
        digest = self.small.get(raw)
        if digest is not None:
            self.hits += 1
            return digest
        digest = hashlib.sha256(raw).hexdigest()[:32]
        self.misses += 1
        with self.lock:
            if raw not in self.small:
                self.small[raw] = digest
                self.small_bytes += len(raw)
                while self.small_bytes > self.SMALL_MAX_BYTES:
                    first = next(iter(self.small))
                    del self.small[first]
                    self.small_bytes -= len(first)
        return digest


_openings = _Openings()


def opening_stats() -> dict[str, int]:
    """The digests of long openings kept (``derive_session``): ``proxy.app.cache_stats``' ``openings``."""
    return _openings.stats()
