"""A few recent entries per key, bounded in bytes over all keys: the hot path's per-session caches.

``reqparse.RequestCache`` (bodies to read the next one from) and ``tochat.Translator`` (translations
to continue) keep, per key, the latest few entries (most recent first; a key's sub-agents or
forks each keep theirs) and drop whole keys, least recently stored first, beyond ``max_bytes``.
An entry is charged its ``cost`` in bytes; one above a quarter of the bound is not kept at all.
Thread-safe (the event loop, and the mitmproxy addon's threads, may share one).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

__all__ = ["Recent"]


class _Costed(Protocol):
    @property
    def cost(self) -> int: ...


K = TypeVar("K", bound=Hashable)
E = TypeVar("E", bound=_Costed)


class Recent(Generic[K, E]):
    def __init__(self, max_bytes: int, per_key: int) -> None:
        self.max_bytes = max_bytes
        self.per_key = per_key
        self._keys: OrderedDict[K, list[E]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> list[E]:
        """The key's entries, most recent first (a copy)."""
        with self._lock:
            return list(self._keys.get(key, ()))

    def lists(self) -> list[list[E]]:
        """Every key's entries, least recently stored key first (copies; for tests and inspection)."""
        with self._lock:
            return [list(v) for v in self._keys.values()]

    def put(self, key: K, entry: E, replaces: E | None = None) -> None:
        """``entry`` first among the key's, ``replaces`` (one it supersedes) dropped."""
        if entry.cost > self.max_bytes // 4:
            return
        with self._lock:
            lst = self._keys.pop(key, None) or []
            if replaces is not None and replaces in lst:
                lst.remove(replaces)
                self._bytes -= replaces.cost
            lst.insert(0, entry)
            self._bytes += entry.cost
            while len(lst) > self.per_key:
                self._bytes -= lst.pop().cost
            self._keys[key] = lst
            while self._bytes > self.max_bytes and self._keys:
                _, gone = self._keys.popitem(last=False)
                self._bytes -= sum(g.cost for g in gone)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()
            self._bytes = 0

    def __len__(self) -> int:
        """Keys held."""
        return len(self._keys)

    @property
    def size(self) -> int:
        """Bytes charged now."""
        return self._bytes
