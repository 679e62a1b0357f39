"""Policy versions: which weights produced which generated tokens (asynchronous RL).

A trainer that updates the inference server's weights while agent sessions run needs, per
generated token, the version of the weights that sampled it (off-policy correction, staleness
filters). This module is the pure arithmetic of that: no I/O, imported by the proxy (to fence a
call), storage (to persist spans), reconstruction (to carry versions through a sample) and the
exporters (to write them out).

- A version is a string: vLLM labels weights with any string (``"default"`` until the trainer
  sets one with ``/update_weight_version``), SGLang likewise. ``UNKNOWN`` marks tokens whose
  version cannot be placed: a call that straddled an update the proxy could not locate inside
  it. Never a guess.
- Versions are stored as spans ``(version, start, end)`` over a call's (or a sample's response's)
  tokens, half-open and contiguous, as vLLM's ``weight_versions`` are; not one string per token.
- Staleness needs an order: ``number`` reads the integer a version ends with (``"7"``,
  ``"v7"``, ``"step-7"``); a version without one (``"default"``, ``UNKNOWN``) has no number and
  counts as stale wherever a bound is asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "UNKNOWN",
    "Span",
    "Staleness",
    "fence_spans",
    "from_json",
    "number",
    "per_token",
    "shift",
    "slice_spans",
    "spans_of",
    "to_json",
    "versions_in",
]

UNKNOWN = "unknown"
"""The version of tokens that cannot be placed (a straddled update, a fence the proxy lacks)."""

Span = tuple[str, int, int]
"""``(version, start, end)``: tokens ``[start, end)`` were sampled by weights ``version``."""

_TRAILING_INT = re.compile(r"(\d+)$")


def number(version: str | None) -> int | None:
    """The integer a version ends with (``"v12"`` -> 12), None when it has none."""
    if not version or version == UNKNOWN:
        return None
    m = _TRAILING_INT.search(version)
    return int(m.group(1)) if m else None


def spans_of(versions: Sequence[str]) -> list[Span]:
    """Per-token versions as contiguous spans (the inverse of ``per_token``)."""
    out: list[Span] = []
    for i, v in enumerate(versions):
        if out and out[-1][0] == v:
            out[-1] = (v, out[-1][1], i + 1)
        else:
            out.append((v, i, i + 1))
    return out


def per_token(spans: Iterable[Span] | None, n: int) -> list[str]:
    """One version per token, ``n`` of them; tokens no span covers are ``UNKNOWN``."""
    out = [UNKNOWN] * n
    for v, s, e in spans or ():
        for i in range(max(0, s), min(e, n)):
            out[i] = v
    return out


def fence_spans(sent: str | None, done: str | None, n: int) -> list[Span] | None:
    """Token/passthrough mode's spans from a call's fence: the version in force when it was sent
    and when its last token arrived. Equal: every token has it. Different: an update happened
    somewhere inside the generation, where is not known: one ``UNKNOWN`` span. Neither known:
    None (nothing recorded)."""
    if sent is None and done is None:
        return None
    if n <= 0:
        return []
    if sent == done:
        return [(str(sent), 0, n)]
    return [(UNKNOWN, 0, n)]


def slice_spans(spans: Iterable[Span], start: int, end: int) -> list[Span]:
    """The spans over tokens ``[start, end)``, renumbered from 0."""
    out: list[Span] = []
    for v, s, e in spans:
        lo, hi = max(s, start), min(e, end)
        if lo < hi:
            out.append((v, lo - start, hi - start))
    return out


def shift(spans: Iterable[Span], offset: int) -> list[Span]:
    return [(v, s + offset, e + offset) for v, s, e in spans]


def versions_in(spans: Iterable[Span]) -> list[str]:
    """The distinct versions in order of first appearance."""
    seen: dict[str, None] = {}
    for v, _, _ in spans:
        seen.setdefault(v, None)
    return list(seen)


def to_json(spans: Iterable[Span] | None) -> list[list[Any]] | None:
    """``[[version, start, end], ...]``: how spans are stored and exported."""
    return None if spans is None else [[v, s, e] for v, s, e in spans]


def from_json(value: Any) -> tuple[Span, ...] | None:
    """Spans from their stored form, or from vLLM's ``[{"version", "start", "end"}]``; None for
    anything else (an old record, a malformed field)."""
    if not isinstance(value, list):
        return None
    out: list[Span] = []
    for item in value:
        if isinstance(item, dict):
            item = [item.get("version"), item.get("start"), item.get("end")]
        if not (isinstance(item, (list, tuple)) and len(item) == 3):
            return None
        v, s, e = item
        if not (isinstance(s, int) and isinstance(e, int)) or s > e:
            return None
        out.append((UNKNOWN if v is None else str(v), s, e))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Staleness:
    """Which versions are too old: older than ``current - max_staleness``, or than ``minimum``.
    A version without a number (``UNKNOWN``, ``"default"``) is stale whenever a bound is set."""

    current: int | None = None
    max_staleness: int | None = None
    minimum: int | None = None

    @property
    def floor(self) -> int | None:
        floors = []
        if self.current is not None and self.max_staleness is not None:
            floors.append(self.current - self.max_staleness)
        if self.minimum is not None:
            floors.append(self.minimum)
        return max(floors) if floors else None

    def stale(self, version: str) -> bool:
        floor = self.floor
        if floor is None:
            return False
        n = number(version)
        return n is None or n < floor
