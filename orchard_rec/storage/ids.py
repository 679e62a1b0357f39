"""``Ids``: token ids that share one growing 4-byte buffer with the ids they extend (a session's
prompts, each the previous one + its completion + what is new), so a prefix is known without
comparing and a session's ids are held once. Re-exported by ``storage/delta.py``, where the
writer's session state keeps them. Moved out of ``storage/delta.py``.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

__all__ = ["Ids"]


def _compact(ids: Sequence[int]) -> array[int] | list[int]:
    """The ids as 4-byte ints (9x less memory than a list of Python ints, and nothing for the
    garbage collector to walk); a list when one does not fit (no real vocabulary's id)."""
    try:
        return array("i", ids)
    except (OverflowError, TypeError):
        return ids if type(ids) is list else list(ids)


def _grow(buf: array[int] | list[int], new: list[int]) -> bool:
    """``buf.extend(new)``; False, ``buf`` as it was, when it cannot: an exported buffer (a
    memoryview held), or an id past 4 bytes (``extend`` may have appended some before it raised)."""
    n = len(buf)
    try:
        buf.extend(new)
    except BufferError:
        return False
    except (OverflowError, TypeError):
        del buf[n:]
        return False
    return True


class Ids(Sequence[int]):
    """Token ids known to start with all of an earlier ``Ids``, the one whose ``mark`` is ``base``:
    an immutable sequence of ints read as the first ``len`` items of a buffer that only ever grows.

    The proxy's id parser builds a session's prompts this way: the next prompt (the previous one +
    the ids new to it) appends the new ids to the same buffer (``extend``), so neither the parser
    nor the writer copies the 150k ids a late prompt shares with the previous one, and the writer
    knows how much of the prompt is the previous one by identity, without comparing them. ``mark``
    is a fresh object per instance (it names these exact ids); holding it keeps no ids alive.
    The buffer is an ``array("i")`` (0.6 MB at 150k ids, where a list of ints held 5.4 MB and made
    every full collection walk it: the writer's caches hold a session's last prompt). Equal to a
    tuple or list of the same ints; slices and sums are plain tuples."""

    __slots__ = ("_buf", "_n", "base", "mark")

    def __init__(self, ids: Sequence[int], base: Ids | None = None) -> None:
        self._buf: array[int] | list[int] = _compact(ids)
        """Owned: only ``extend`` appends to it, and only past every view's end."""
        self._n = len(self._buf)
        self.mark = object()
        self.base = None if base is None else base.mark

    def extend(self, new: list[int]) -> Ids:
        """These ids + ``new``, based on these: in the same buffer when these are its end and it
        can grow, else in a copy of them (memcpy for an array), else (an id past 4 bytes) a list."""
        if self._n == len(self._buf) and _grow(self._buf, new):
            return self._view(self._buf)
        buf = self._buf[: self._n]  # another call extended the buffer, or it is exported
        if _grow(buf, new):
            return self._view(buf)
        return Ids([*self._buf[: self._n], *new], self)

    @classmethod
    def adopt(cls, buf: array[int]) -> Ids:
        """``buf``'s ids, without a copy: ``buf`` becomes these ids' own (the caller lets it go)."""
        out = cls.__new__(cls)
        out._buf, out._n, out.mark, out.base = buf, len(buf), object(), None
        return out

    def _view(self, buf: array[int] | list[int]) -> Ids:
        """All of ``buf`` (these ids + new ones) as an ``Ids`` based on these."""
        out = Ids.__new__(Ids)
        out._buf, out._n, out.mark, out.base = buf, len(buf), object(), self.mark
        return out

    def starts_with(self, other: Ids) -> bool:
        """Whether ``other`` is known to be a prefix of these ids without comparing them: both
        views of one buffer (it only ever grows past every view's end), ``other`` the shorter."""
        return other._buf is self._buf and other._n <= self._n

    def tolist(self) -> list[int]:
        return self._buf[: self._n].tolist() if isinstance(self._buf, array) else self._buf[: self._n]

    def count(self, value: Any) -> int:
        return self._buf[: self._n].count(value)

    def array(self) -> array[int] | None:
        """These ids as an ``array("i")`` (a copy at memcpy speed), None when they are not one."""
        return self._buf[: self._n] if isinstance(self._buf, array) else None

    @property
    def nbytes(self) -> int:
        """About the memory of the buffer these ids are a view of."""
        n = len(self._buf)
        return 4 * n if isinstance(self._buf, array) else 36 * n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step == 1:
                return tuple(self._buf[start:stop])
            return tuple(self._buf[: self._n][i])
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("Ids index out of range")
        return self._buf[i]

    def __iter__(self) -> Iterator[int]:
        return islice(self._buf, self._n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Ids):
            if self._n != other._n:
                return False
            if self._buf is other._buf:
                return True
            a, b = self._buf[: self._n], other._buf[: other._n]
            return a == b if type(a) is type(b) else tuple(a) == tuple(b)
        if isinstance(other, (tuple, list)):
            return self._n == len(other) and tuple(self._buf[: self._n]) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Any) -> tuple[int, ...]:
        return tuple(self) + tuple(other)

    def __radd__(self, other: Any) -> tuple[int, ...]:
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return f"Ids({tuple(self)!r})"
