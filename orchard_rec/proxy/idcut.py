"""Token-id arrays in a JSON answer, handled at byte level: O(what is new), not O(context).

A vLLM-style answer in token mode carries the whole prompt's ids (``prompt_token_ids``: 150k
integers at a 150k-token context, most of a 0.5 MB body) although only the completion is new.
Parsing and re-encoding that on every call made the proxy's cost per call grow with the context.
Here:

- ``cut(data)`` finds every ``"prompt_token_ids":`` / ``"token_ids":`` key in the raw bytes
  (one C-speed forward search that jumps over each array found: the bytes outside the arrays are
  searched for the keys, each array only for its end and for ``"``, ``{``, ``[``), checks each value is ``null`` or a flat array (no string, object or nested
  array before its first ``]``), and parses the body with those arrays replaced by ``null`` (what
  remains is small). It is used only when the keys found are exactly the keys at the places
  vLLM writes them (root ``prompt_token_ids``, ``choices[i].token_ids`` /
  ``choices[i].prompt_token_ids``), in the same order: a key anywhere else (or a duplicate, or
  whitespace before a colon) makes it answer None and the caller parses the whole body as before.
  In valid JSON the pattern ``"name":`` can only start a key (a quote inside a string is escaped),
  so the search cannot hit message text.
- ``IdParser`` (the writer thread) parses the arrays themselves, reusing the previous call's ids
  of the same session when this call's prompt array starts with the same bytes (an agent's next
  prompt is its last prompt plus what came since): only the new ids are parsed, appended to the
  list the session's previous prompt is a view of (``delta.Ids``), so nothing it does per call
  grows with the context but one ``memcmp`` of the shared bytes. A prompt parsed whole (a
  session's first call, or one the cache let go) is parsed by Arrow's compute kernels
  (``int_array``) straight into the 4-byte buffer, with the interpreter lock released: 150k ids
  held it ~5 ms through ``orjson`` and the list-to-array copy, the event loop waiting meanwhile.
"""

from __future__ import annotations

import functools
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

from orchard_rec.errors import cache_stats
from orchard_rec.storage.delta import Ids

__all__ = ["Cut", "IdParser", "Known", "cut", "id_paths", "int_array"]

_TAIL = b'token_ids":'
"""What both keys end with (``"prompt_token_ids":``, ``"token_ids":``)."""
_WS = frozenset(b" \t\r\n")
_INT_CHARS = b"0123456789,- \t\r\n[]"
MIN_BYTES = 16 * 1024
"""Bodies smaller than this are parsed whole: nothing to gain."""

Path = tuple[Any, ...]
Span = tuple[Path, int, int]
Cut = tuple[bytes, Any, list[Span]]
Known = tuple[Any, Sequence[int], Any, Any]
"""``(value, ids, node, key)``: an id array ``IdParser.load`` parsed as ints only: the value it put
at ``node[key]`` (a list, or the prompt's ``Ids``) and the same ids for the record."""
"""``(rest, parsed rest, spans)``: the body with each id array replaced by ``null``, its parsed
object, and ``(path in the object, start, end)`` of each array in the original bytes."""


def _find(data: bytes) -> list[tuple[int, str, int, int]] | None:
    """Every id key in ``data`` in byte order: ``(key position, name, value start, value end)``;
    a ``null`` value has start == end. None when a value is neither null nor a flat array.

    One forward search for the keys' common tail ``token_ids":`` that jumps over each array it
    finds (an array with no quote in it cannot hold a key), so the multi-byte search covers what
    is not ids (a few kB of a 1 MB answer) and each array is checked by single-byte searches
    (``memchr``) only; a tail after another name (``"my_token_ids":``) is not a key of ours."""
    out = []
    n = len(data)
    i = data.find(_TAIL)
    while i >= 0:
        s = i + len(_TAIL)
        if data[i - 1 : i] == b'"':
            hit = (i - 1, "token_ids")
        elif data[i - 8 : i] == b'"prompt_':
            hit = (i - 8, "prompt_token_ids")
        else:
            i = data.find(_TAIL, s)
            continue
        while s < n and data[s] in _WS:
            s += 1
        if data.startswith(b"null", s):
            out.append((*hit, s, s))
            i = data.find(_TAIL, s + 4)
            continue
        if not data.startswith(b"[", s):
            return None
        e = data.find(b"]", s)
        if (
            e < 0
            or data.find(b'"', s, e) >= 0
            or data.find(b"{", s, e) >= 0
            or data.find(b"[", s + 1, e) >= 0
        ):
            return None
        out.append((*hit, s, e + 1))
        i = data.find(_TAIL, e + 1)
    return out


def id_paths(obj: Any) -> list[tuple[Path, str]]:
    """The id keys at the places vLLM writes them, in document (parse) order."""
    out: list[tuple[Path, str]] = []
    if not isinstance(obj, dict):
        return out
    for k, v in obj.items():
        if k == "prompt_token_ids":
            out.append(((k,), k))
        elif k == "choices" and isinstance(v, list):
            for i, c in enumerate(v):
                if isinstance(c, dict):
                    for ck in c:
                        if ck == "token_ids" or ck == "prompt_token_ids":
                            out.append((("choices", i, ck), ck))
    return out


def without_arrays(data: bytes, spans: list[tuple[int, int]]) -> bytes:
    """``data`` with the bytes of each span (in order) replaced by ``null``: what ``cut`` parses."""
    parts: list[bytes] = []
    pos = 0
    for s, e in spans:
        parts += (data[pos:s], b"null")
        pos = e
    parts.append(data[pos:])
    return b"".join(parts)


def cut(data: bytes) -> Cut | None:
    """The body without its id arrays, parsed, and where they were; None when ``data`` has no
    array to cut, is small, or anything about it is not as expected (then parse it whole)."""
    if len(data) < MIN_BYTES:
        return None
    found = _find(data)
    if not found or all(s == e for _, _, s, e in found):
        return None
    rest = without_arrays(data, [(s, e) for _, _, s, e in found if s != e])
    try:
        obj = orjson.loads(rest)
    except orjson.JSONDecodeError:
        return None
    paths = id_paths(obj)
    if [name for _, name in paths] != [name for _, name, _, _ in found]:
        return None  # a key somewhere else, or a duplicate: not the shape this is for
    spans = [(path, s, e) for (path, _), (_, _, s, e) in zip(paths, found, strict=True) if s != e]
    return rest, obj, spans


def _only_ints(b: bytes) -> bool:
    return not b.translate(None, _INT_CHARS)


_DIGITS_COMMAS = b"0123456789,"
ARROW_BYTES = 64 * 1024
"""Id arrays at least this long (~10k ids) parsed whole go through ``int_array``; shorter ones hold
the lock for well under a millisecond through ``orjson``, and Arrow's fixed cost is ~50 us."""


@functools.cache
def _kernels() -> Any:
    """``pyarrow`` with its compute module, imported once, on first use."""
    import pyarrow
    import pyarrow.compute

    return pyarrow


def warm() -> None:
    """Import Arrow now (~0.15 s holding the lock) rather than at the first long prompt parsed
    whole, when the event loop would wait for it."""
    _kernels()


def int_array(span: bytes | memoryview) -> array[int] | None:
    """A compact JSON array of non-negative ints (``[1,2,3]``, no whitespace: token ids as vLLM and
    orjson write them) as an ``array("i")``, parsed by Arrow's C++ kernels (split on commas, cast
    to int32) with the interpreter lock released; None when ``span`` is not such an array (a
    minus sign, whitespace, a leading zero, an empty element) or an id does not fit 4 bytes: the
    caller parses it as before. Equal to ``array("i", orjson.loads(span))`` whenever it answers."""
    n = len(span)
    if n < 2 or span[0] != 0x5B or span[n - 1] != 0x5D:  # [ ]
        return None
    body = bytes(span[1 : n - 1])
    out: array[int] = array("i")
    if not body:
        return out
    if out.itemsize != 4 or body.translate(None, _DIGITS_COMMAS):
        return None
    pa = _kernels()
    pc = pa.compute
    try:
        parts = pc.split_pattern(pa.array([body], pa.binary()), b",").flatten()
        ints = pc.cast(parts, pa.int32())  # "1,,2" (an empty element), past 4 bytes: invalid
        # "01": a number, for Arrow; not for JSON
        if (
            ints.null_count
            or pc.any(pc.and_(pc.starts_with(parts, "0"), pc.greater(pc.binary_length(parts), 1))).as_py()
        ):
            return None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    buf = ints.buffers()[1]
    out.frombytes(memoryview(buf)[ints.offset * 4 : (ints.offset + len(ints)) * 4])
    return out


class IdParser:
    """Parses id arrays for the writer thread, with the last prompt's ids of each session kept
    (least recently used first out, bounded in bytes) so that the next call parses only its new ids.

    A session's prompts are ``delta.Ids`` sharing one list that grows by each call's new ids: no
    call copies the ids it shares with the previous one, and the answer's array is that ``Ids``
    itself (``views``), not a list of it (storage and the spool write it as ``null``, knowing it by
    identity). The bytes a prompt is compared with are the previous answer's own (a view, no copy).

    One thread uses it (the recorder's writer)."""

    def __init__(self, max_bytes: int = 128 << 20) -> None:
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, tuple[memoryview, Ids, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def load(
        self,
        data: bytes,
        session: str | None,
        found: tuple[bytes, list[Span]] | None = None,
        *,
        views: bool = True,
    ) -> tuple[Any, list[Known]]:
        """``orjson.loads(data)``, and the id arrays it parsed as integers only (``Known``).
        ``found``: what ``cut(data)`` gave already (the rest and the spans), so ``data`` is not
        searched again. ``views``: a session's prompt array is put in the object as its ``Ids``
        (else as a list). Raises ``orjson.JSONDecodeError`` as loads does."""
        if found is not None:
            obj, spans = orjson.loads(found[0]), found[1]
        else:
            c = cut(data) if len(data) >= MIN_BYTES else None
            if c is None:
                return orjson.loads(data), []
            _, obj, spans = c
        ints: list[Known] = []
        for path, s, e in spans:
            node = obj
            for step in path[:-1]:
                node = node[step]
            key = path[-1]
            got, exact = self._array(data, s, e, session if key == "prompt_token_ids" else None)
            if isinstance(got, Ids):
                val: Any = got if views else list(got)
                ints.append((val, got, node, key))
            else:
                val = got
                if exact:
                    ints.append((val, tuple(got), node, key))
            node[key] = val
        return obj, ints

    def _array(self, data: bytes, s: int, e: int, session: str | None) -> tuple[Ids | list[Any], bool]:
        """The array ``data[s:e]``: an ``Ids`` for a session's prompt of ints, else a list; and
        whether every element is an int."""
        hit = self._cache.get(session) if session is not None else None
        if hit is not None and session is not None:
            prefix, old, _ = hit
            k = len(prefix)
            # the same bytes up to just before the old closing bracket, then a separator: the old
            # ids are the first ones, parse the rest
            if e - s > k and data[s + k] == 0x2C and data.startswith(prefix, s):  # ","
                tail = data[s + k + 1 : e]
                if _only_ints(tail):
                    self.hits += 1
                    grown = old.extend(orjson.loads(b"[" + tail))
                    self._remember(session, data, s, e, grown)
                    return grown, True
            elif e - s == k + 1 and data.startswith(prefix, s):  # the same array again
                self.hits += 1
                self._cache.move_to_end(session)
                return old, True
        if session is not None:
            self.misses += 1
        span = data[s:e]
        if session is not None and e - s >= ARROW_BYTES:
            buf = int_array(span)
            if buf is not None:
                ids = Ids.adopt(buf)
                self._remember(session, data, s, e, ids)
                return ids, True
        lst = orjson.loads(span)
        if not _only_ints(span):
            return lst, False
        if session is None:
            return lst, True
        ids = Ids(lst)
        self._remember(session, data, s, e, ids)
        return ids, True

    def stats(self) -> dict[str, int]:
        """Sessions held, their bytes, the bound; prompts parsed from a session's last (hits) or
        whole (misses: a session's first call, or one this cache had let go)."""
        return cache_stats(len(self._cache), self._bytes, self.max_bytes, self.hits, self.misses)

    def _remember(self, session: str, data: bytes, s: int, e: int, ids: Ids) -> None:
        size = len(data) + ids.nbytes  # the answer the prefix is a view of, the ids' buffer
        old = self._cache.pop(session, None)
        if old is not None:
            self._bytes -= old[2]
        if size > self.max_bytes:
            return
        self._cache[session] = (memoryview(data)[s : e - 1], ids, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, _, n) = self._cache.popitem(last=False)
            self._bytes -= n
