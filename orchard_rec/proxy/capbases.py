"""What ``capline``'s encoder writes a call's byte strings against: each session's last bases
(``Bases``), and where two byte strings stop being equal from either end (``common_prefix``,
``common_suffix``: memcmp-speed comparisons of blocks, then a bisection of the block that differs)."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["Bases", "common_prefix", "common_suffix", "same"]

_BLOCK = 1 << 16


def same(a: bytes, i: int, b: memoryview, j: int, n: int) -> bool:
    """``a[i:i+n] == b[j:j+n]`` at memcmp speed, without copying."""
    return a.startswith(b[j : j + n], i)


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    mb = memoryview(b)
    k = 0
    while k < n:
        step = min(_BLOCK, n - k)
        if not same(a, k, mb, k, step):
            lo, hi = k, k + step  # a[:lo] == b[:lo], a[:hi] != b[:hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if same(a, lo, mb, lo, mid - lo):
                    lo = mid
                else:
                    hi = mid
            return lo
        k += step
    return n


def common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """The length of the longest common suffix of ``a`` and ``b``, at most ``limit``."""
    la, lb = len(a), len(b)
    mb = memoryview(b)
    k = 0
    while k < limit:
        step = min(_BLOCK, limit - k)
        if not same(a, la - k - step, mb, lb - k - step, step):
            lo, hi = k, k + step  # the last lo bytes are equal, the last hi are not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if same(a, la - mid, mb, lb - mid, mid - lo):
                    lo = mid
                else:
                    hi = mid
            return lo
        k += step
    return limit


class Bases:
    """Per session, the last base of one kind: ``(call_id, data, start, end, crc)``, least
    recently used first out, bounded in bytes (shared by all kinds)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._d: OrderedDict[tuple[str, str], tuple[str, bytes, int, int, int]] = OrderedDict()
        self._by_id: dict[tuple[str, str], tuple[str, str]] = {}

    def get(self, kind: str, session: str) -> tuple[str, bytes, int, int, int] | None:
        return self._d.get((kind, session))

    def __len__(self) -> int:
        return len(self._d)

    def by_id(self, kind: str, call_id: str) -> tuple[str, bytes, int, int, int] | None:
        key = self._by_id.get((kind, call_id))
        return None if key is None else self._d.get(key)

    def put(self, kind: str, session: str, entry: tuple[str, bytes, int, int, int]) -> None:
        key = (kind, session)
        old = self._d.pop(key, None)
        if old is not None:
            self.bytes -= len(old[1])
            self._by_id.pop((kind, old[0]), None)
        size = len(entry[1])
        if size > self.max_bytes:
            return
        self._d[key] = entry
        self._by_id[(kind, entry[0])] = key
        self.bytes += size
        while self.bytes > self.max_bytes:
            (k, _), e = self._d.popitem(last=False)
            self._by_id.pop((k, e[0]), None)
            self.bytes -= len(e[1])

    def drop(self, kind: str, session: str) -> None:
        old = self._d.pop((kind, session), None)
        if old is not None:
            self.bytes -= len(old[1])
            self._by_id.pop((kind, old[0]), None)

    def clear(self) -> None:
        self._d.clear()
        self._by_id.clear()
        self.bytes = 0
