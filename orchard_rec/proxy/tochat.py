"""Token mode's translation of a Responses or Messages request to chat, in O(what is new).

Every call of a Codex or Claude Code session resends the whole history, and since
``proxy.reqparse`` reads a body from its session's previous one, the history's items are the
*same objects* as in the previous call (never changed in place: the parsed request is read-only
everywhere). ``Translator.to_chat`` keeps, per session, the previous call's items and what they
translated to, and translates only the items that are not those objects:

- Messages: each message translates alone (``anthropic.message_to_chat``), so the messages that
  are the previous call's objects reuse their chat messages, wherever the first new one is;
- Responses: an item's translation depends on the items before it (``responses.InputFold``), so
  a call whose items start with all of the previous call's (and whose ``instructions`` are equal)
  continues a copy of the previous fold; any other is folded whole.

Validation stays the real one: the top level and the new items only (the others passed it in
the previous call, and are the same objects). The result always equals ``protocol.to_chat``
(same object, same errors; tests compare them over sequences of calls); it shares chat
messages with the previous calls' plans, which nothing changes either.
"""

from __future__ import annotations

from typing import Any

from orchard_rec import protocol
from orchard_rec.errors import BadRequest, cache_stats, env_megabytes
from orchard_rec.protocol import anthropic, responses
from orchard_rec.proxy.recent import Recent
from orchard_rec.records import Dialect

__all__ = ["Translator", "translator"]

CANDIDATES = 4
"""Translations kept per session (its sub-agents' conversations each continue their own)."""


class _State:
    __slots__ = ("cost", "fold", "instructions", "items", "outs")

    def __init__(self, items: list[Any], cost: int) -> None:
        self.items = items
        """The previous call's conversation list (held: identity is compared against it)."""
        self.cost = cost
        self.outs: list[list[dict[str, Any]]] = []
        """Messages: each item's chat messages."""
        self.fold: responses.InputFold | None = None
        """Responses: the fold after all of ``items`` (never fed again: resumed copies are)."""
        self.instructions: Any = None


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
        self._recent: Recent[tuple[str, Dialect], _State] = Recent(max_bytes, CANDIDATES)
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
        self, dialect: Dialect, body: dict[str, Any], session: str | None, cost: int
    ) -> dict[str, Any]:
        """``protocol.to_chat(dialect, body)``, reusing the session's previous translation.
        ``cost``: the request's size in bytes (what its state is charged)."""
        key = "messages" if dialect is Dialect.MESSAGES else "input"
        items = body.get(key)
        if session is None or self.max_bytes <= 0 or type(items) is not list:
            return protocol.to_chat(dialect, body)
        states = self._recent.get((session, dialect))
        state, k = None, 0
        for st in states:  # the one sharing the most items (a session's sub-agents keep their own)
            n = _same_prefix(st.items, items)
            if dialect is Dialect.RESPONSES and (
                n < len(st.items) or body.get("instructions") != st.instructions
            ):
                continue  # a fold continues only after all of its items
            if n > k:
                state, k = st, n
        if state is None:
            self.misses += 1
            return self._whole(dialect, body, session, items, cost)
        self.hits += 1
        if dialect is Dialect.MESSAGES:
            chat, new = self._messages(body, items, state, k, cost)
        else:
            chat, new = self._responses(body, items, state, cost)
        self._recent.put((session, dialect), new, state)
        self.reused += k
        return chat

    def _validate(self, dialect: Dialect, body: dict[str, Any], key: str, new: list[Any]) -> None:
        """The real checks on the top level and the ``new`` items."""
        module = responses if dialect is Dialect.RESPONSES else anthropic
        part = dict(body)
        part[key] = new
        module.validate(part)

    def _messages(
        self, body: dict[str, Any], items: list[Any], state: _State, k: int, cost: int
    ) -> tuple[dict[str, Any], _State]:
        self._validate(Dialect.MESSAGES, body, "messages", items[k:])
        try:
            outs = state.outs[:k] + [anthropic.message_to_chat(m) for m in items[k:]]
            messages = anthropic.system_to_chat(body)
            for out in outs:
                messages += out
            chat = anthropic.chat_request(body, messages)
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            raise _untranslatable(Dialect.MESSAGES, exc) from exc
        new = _State(items, cost)
        new.outs = outs
        return chat, new

    def _responses(
        self, body: dict[str, Any], items: list[Any], state: _State, cost: int
    ) -> tuple[dict[str, Any], _State]:
        assert state.fold is not None
        self._validate(Dialect.RESPONSES, body, "input", items[len(state.items) :])
        try:
            fold = state.fold.resumed()
            for item in items[len(state.items) :]:
                fold.feed(item)
            chat = responses.chat_request(body, fold.messages.copy())
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            raise _untranslatable(Dialect.RESPONSES, exc) from exc
        new = _State(items, cost)
        new.fold, new.instructions = fold, body.get("instructions")
        return chat, new

    def _whole(
        self, dialect: Dialect, body: dict[str, Any], session: str, items: list[Any], cost: int
    ) -> dict[str, Any]:
        """Translated from scratch (``protocol.to_chat``'s checks and errors), and its state kept."""
        module = responses if dialect is Dialect.RESPONSES else anthropic
        module.validate(body)
        new = _State(items, cost)
        try:
            if dialect is Dialect.MESSAGES:
                new.outs = [anthropic.message_to_chat(m) for m in items]
                messages = anthropic.system_to_chat(body)
                for out in new.outs:
                    messages += out
                chat = anthropic.chat_request(body, messages)
            else:
                fold = responses.InputFold(body)
                for item in items:
                    fold.feed(item)
                chat = responses.chat_request(body, fold.messages.copy())
                new.fold, new.instructions = fold, body.get("instructions")
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            raise _untranslatable(dialect, exc) from exc
        self._recent.put((session, dialect), new)
        return chat


def _untranslatable(dialect: Dialect, exc: Exception) -> BadRequest:
    """``protocol.to_chat``'s error for an item it cannot read (the same words)."""
    return BadRequest(
        f"could not translate this {dialect.value} request to chat completions: {type(exc).__name__}: {exc}"
    )


translator = Translator(env_megabytes("ORCHARD_REQUEST_CACHE_MB", 256))
"""The process's translation states (bounded like the request cache, by ``ORCHARD_REQUEST_CACHE_MB``)."""
