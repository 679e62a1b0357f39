"""Token mode's translation of a request to chat, in O(what is new).

Every call of a Codex, Claude Code or Gemini CLI session resends the whole history, and since
``proxy.reqparse`` reads a body from its session's previous one, the history's items are the
*same objects* as in the previous call (never changed in place: the parsed request is read-only
everywhere). ``Translator.to_chat`` keeps, per session, the previous call's items and the dialect's
``Fold`` over them (``WireDialect.fold``), and translates only the items that are not those
objects: the fold resumed at the first new item (``Fold.resumed``: Messages reuse any leading run
of messages, a Responses fold continues only after all of its items) and fed the rest.

Validation stays the real one: the top level and the new items only (the others passed it in
the previous call, and are the same objects). The result always equals ``dialects.to_chat``
(same object, same errors; tests compare them over sequences of calls); it shares chat
messages with the previous calls' plans, which nothing changes either.
"""

from __future__ import annotations

from typing import Any

from orchard_rec import dialects
from orchard_rec.dialects import Fold, WireDialect
from orchard_rec.dialects.base import checked_to_chat, untranslatable
from orchard_rec.errors import cache_stats
from orchard_rec.proxy.recent import Recent
from orchard_rec.settings import current

__all__ = ["Translator"]

CANDIDATES = 4
"""Translations kept per session (its sub-agents' conversations each continue their own)."""


class _State:
    __slots__ = ("cost", "fold", "items")

    def __init__(self, items: list[Any], cost: int, fold: Fold) -> None:
        self.items = items
        """The previous call's conversation list (held: identity is compared against it)."""
        self.cost = cost
        self.fold = fold
        """The fold after all of ``items`` (never fed again: resumed copies are)."""


def _same_prefix(old: list[Any], new: list[Any]) -> int:
    """How many leading items of ``new`` are ``old``'s objects (identity, no comparison)."""
    n = min(len(old), len(new))
    i = 0
    while i < n and old[i] is new[i]:
        i += 1
    return i


class Translator:
    """Per-session translation states, bounded by the bytes of the requests they come from."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._recent: Recent[tuple[str, str], _State] = Recent(max_bytes, CANDIDATES)
        self.reused = 0
        """Items whose translation was reused."""
        self.hits = 0
        """Session requests translated on a previous one's translation."""
        self.misses = 0
        """Session requests translated whole."""

    @property
    def size(self) -> int:
        """Bytes its states are charged now."""
        return self._recent.size

    def stats(self) -> dict[str, int]:
        return cache_stats(len(self._recent), self._recent.size, self.max_bytes, self.hits, self.misses)

    def to_chat(
        self, dialect: WireDialect | str, body: dict[str, Any], session: str | None, cost: int
    ) -> dict[str, Any]:
        """``dialects.to_chat(dialect, body)``, reusing the session's previous translation.
        ``cost``: the request's size in bytes (what its state is charged)."""
        d = dialect if isinstance(dialect, WireDialect) else dialects.get(dialect)
        if d is None or not d.chat_view:
            raise ValueError(f"{dialect} requests have no chat view")
        key = d.conversation_keys[0] if d.conversation_keys else None
        items = body.get(key) if key is not None else None
        if session is None or self.max_bytes <= 0 or type(items) is not list or d.fold(body) is None:
            return checked_to_chat(d, body)
        assert key is not None
        skey = (session, d.name.value)
        fold, k, base = None, 0, None
        for st in self._recent.get(
            skey
        ):  # the one sharing the most items (a session's sub-agents keep their own)
            n = _same_prefix(st.items, items)
            if n > k:
                f = st.fold.resumed(n, body)
                if f is not None:
                    fold, k, base = f, n, st
        if fold is None:
            self.misses += 1
            return self._whole(d, body, skey, items, cost)
        self.hits += 1
        part = dict(body)
        part[key] = items[k:]
        d.validate(part)  # the real checks on the top level and the new items
        try:
            for item in items[k:]:
                fold.feed(item)
            chat = fold.chat(body)
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            raise untranslatable(d.name, exc) from exc
        self._recent.put(skey, _State(items, cost, fold), base)
        self.reused += k
        return chat

    def _whole(
        self, d: WireDialect, body: dict[str, Any], skey: tuple[str, str], items: list[Any], cost: int
    ) -> dict[str, Any]:
        """Translated from scratch (``dialects.to_chat``'s checks and errors), and its state kept."""
        d.validate(body)
        fold = d.fold(body)
        assert fold is not None
        try:
            for item in items:
                fold.feed(item)
            chat = fold.chat(body)
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            raise untranslatable(d.name, exc) from exc
        self._recent.put(skey, _State(items, cost, fold))
        return chat


def __getattr__(name: str) -> Translator:
    """``translator``: the process's translation states, built on first use (bounded like the
    request cache, by ``ORCHARD_REQUEST_CACHE_MB``; ``Settings``)."""
    if name != "translator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = globals()["translator"] = Translator(current().request_cache_bytes)
    return made
