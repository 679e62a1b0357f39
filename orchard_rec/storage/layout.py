"""How a call is laid out on disk so that a session's storage grows with what is new in it.

Pure functions, no SQL. Four pieces:

- **Delta arrays** (``pack_delta`` / ``unpack_delta``): a sequence stored as "the first
  ``n`` items of the same sequence of call ``base``" + its own new items, packed. Token
  ids are int32 (a call's prompt is based on an earlier call's prompt + completion),
  content references are 16-byte digests.
- **Request text split** (``split_request``): the client's JSON text, cut at the elements
  of its message arrays (``messages``, ``input``) and at every other large top-level
  value (tool lists, system prompts): each such piece is a content-addressed blob stored
  once per session, the call keeps the literal text in between (``skeleton``) and its
  list of blob digests. Joining them gives back the exact text the client sent, key
  order, whitespace and escapes included. With the previous call's split at hand, the
  pieces it already had are recognised by comparing text (no re-hashing, no re-scanning),
  so the work is proportional to what is new.
- **Growing values** (``Split.bases``): a large top-level value that is not a message list
  (a ``/v1/completions`` ``prompt``: the whole context as one string or id list) is stored
  as "the first ``n`` characters of the same key's piece in the previous call" + its new
  text, so a session of growing prompts stores each prompt's new text once.
- **Images** (``image_spans``, ``cut``, ``paste``): the base64 of each image in a piece
  (chat ``image_url`` / Responses ``input_image`` data URLs, Anthropic ``image`` sources,
  also inside tool results) is cut out of the stored text and kept once, as bytes, in the
  ``images`` table; the piece keeps (offset, SHA-256) holes. Only base64 that re-encodes to
  the identical text is cut, so the text comes back byte for byte.
- **Upstream request derivation** (``derive_upstream`` / ``upstream_of``): what the proxy
  sent upstream, as "the request's value" per key, the prompt-ids marker (also with image
  runs collapsed: tito's ids for a VLM), or a literal; translated message lists and lists of
  image parts (tito's ``content_parts``) go to blobs like the request's, images cut out.
- **Client views** (``client_view``): the response and events as the client received
  them (the fields token mode injected are null again), with ids the id columns hold
  replaced by a restore note.

The byte formats of the delta arrays (and compression) live in ``storage/packing.py``, the image
cutting in ``storage/imagecut.py``; both are re-exported here, so ``layout.X`` stays the one name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any

import orjson

from orchard_rec import dialects
from orchard_rec.storage.imagecut import (
    IMAGE_MIN,
    _image_payloads,
    b64_exact,
    cut,
    image_spans,
    pack_holes,
    paste,
    unpack_holes,
)
from orchard_rec.storage.packing import (
    _int_array,
    common_prefix,
    compress,
    compress_json,
    decompress,
    pack_delta,
    pack_floats,
    pack_ints,
    unpack_delta,
    unpack_floats,
    unpack_ints,
)

__all__ = [
    "IMAGE_MIN",
    "Split",
    "b64_exact",
    "client_view",
    "collapse_runs",
    "compress",
    "compress_json",
    "continuation",
    "cut",
    "decompress",
    "derive_upstream",
    "digest",
    "events_json",
    "image_spans",
    "join_request",
    "pack_delta",
    "pack_floats",
    "pack_holes",
    "pack_ints",
    "paste",
    "restore_ids",
    "split_request",
    "unpack_delta",
    "unpack_floats",
    "unpack_holes",
    "unpack_ints",
    "upstream_of",
]

DIGEST = 16
ARRAY_KEYS = frozenset(dialects.conversation_keys())
"""Top-level keys whose array elements are stored one blob each (every dialect's conversation keys)."""
BLOB_MIN = 256
"""Other top-level values at least this long (characters) are stored as one blob."""
DELTA_MIN = 256
"""A growing value is stored on the previous call's piece when they share at least this many characters."""


def digest(data: bytes) -> bytes:
    return blake2b(data, digest_size=DIGEST).digest()


# -- request text --------------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_STR = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_STRUCT = re.compile(r'[\[\]{}"]')
_SCALAR = re.compile(r"-?[0-9][0-9.eE+\-]*|true|false|null")


class _Malformed(Exception):
    pass


def _ws(t: str, i: int) -> int:
    if t[i : i + 1] not in _SPACE:
        return i
    m = _WS.match(t, i)
    return m.end() if m else i


_SPACE = frozenset(" \t\n\r")


def _skip(t: str, i: int) -> int:
    """End of the JSON value starting at ``t[i]``."""
    c = t[i : i + 1]
    if c == '"':
        m = _STR.match(t, i)
        if m is None:
            raise _Malformed
        return m.end()
    if c in ("{", "["):
        depth, pos = 0, i
        while True:
            m = _STRUCT.search(t, pos)
            if m is None:
                raise _Malformed
            ch, p = m.group(), m.start()
            if ch == '"':
                s = _STR.match(t, p)
                if s is None:
                    raise _Malformed
                pos = s.end()
                continue
            depth += 1 if ch in "{[" else -1
            pos = p + 1
            if depth == 0:
                return pos
    m = _SCALAR.match(t, i)
    if m is None or not c:
        raise _Malformed
    return m.end()


class Split:
    """One request text cut into literal text and blob references."""

    __slots__ = ("bases", "blobs", "first", "literals", "pieces", "refs", "starts", "text")

    def __init__(self) -> None:
        self.literals: list[str] = []
        """``len(refs) + 1`` pieces of text around the blobs."""
        self.refs: list[bytes] = []
        """Blob digests, in text order."""
        self.blobs: dict[bytes, str] = {}
        """Blobs this split hashed itself (the ones the previous split did not have)."""
        self.pieces: dict[str, list[tuple[str, bytes]]] = {}
        """Per top-level key, its blob pieces (text, digest): what the next call's split compares against."""
        self.bases: dict[bytes, tuple[bytes, int]] = {}
        """New blobs that continue the previous split's piece of the same key: digest -> (that piece's
        digest, characters they share)."""
        self.text: str | None = None
        """The text split (the next call's split compares runs of pieces with it at once)."""
        self.starts: list[int] = []
        """Where each of ``refs`` starts in ``text``."""
        self.first: dict[str, int] = {}
        """Per array key, the index in ``refs`` of its first piece (-1: the key came twice)."""


def split_request(text: str, prev: Split | None = None, *, deltas: bool = True) -> Split:
    """Cut ``text`` (a JSON object) at its conversation elements and large values.

    ``prev``: the previous call's split of the session; pieces it already had (compared as
    text, at the same position of the same key) are not hashed again. ``deltas``: a large
    value that continues ``prev``'s value of the same key is noted in ``bases``.
    """
    if prev is not None and prev.text is not None and (text is prev.text or text == prev.text):
        return _again(prev)
    out = Split()
    out.text = text
    try:
        _split(text, prev, out, deltas)
    except (_Malformed, IndexError):
        out = Split()
        out.literals = [text]
    return out


def _again(prev: Split) -> Split:
    """The split of ``prev``'s text again (a harness that sent the same request twice, a retry):
    its pieces, all of them known, nothing hashed and nothing new (``blobs``, ``bases`` empty), as
    ``_split`` would find them one by one. The lists are ``prev``'s own (a split is never changed
    once made), so ``Encoder.encode`` knows the literals by identity."""
    out = Split()
    out.text, out.literals, out.refs, out.starts = prev.text, prev.literals, prev.refs, prev.starts
    out.pieces, out.first = prev.pieces, prev.first
    return out


def _run(t: str, i: int, key: str, k0: int, prev: Split | None, out: Split, cur: int) -> int:
    """The previous split's pieces ``k0`` to the last of ``key``'s array, when ``t`` has the
    same text at ``i`` (one comparison, not one per message): taken at once, their end returned
    (the caller's new ``cur``); else -1. Identical text from an element's start parses into the
    identical elements."""
    if prev is None or prev.text is None:
        return -1
    was: Sequence[tuple[str, bytes]] = prev.pieces.get(key, ())
    g = prev.first.get(key, -1)
    if g < 0 or k0 + 2 > len(was):
        return -1
    g0, gl = g + k0, g + len(was) - 1
    if gl >= len(prev.refs) or prev.refs[g0] != was[k0][1] or prev.refs[gl] != was[-1][1]:
        return -1
    a, b = prev.starts[g0], prev.starts[gl] + len(was[-1][0])
    if not t.startswith(prev.text[a:b], i):
        return -1
    refs = out.refs
    if key not in out.first:
        out.first[key] = len(refs)
    lits = out.literals
    lits.append(t[cur:i])
    lits.extend(prev.literals[g0 + 1 : gl + 1])
    refs.extend(prev.refs[g0 : gl + 1])
    out.starts.extend([x + i - a for x in prev.starts[g0 : gl + 1]])
    out.pieces.setdefault(key, []).extend(was[k0:])
    return i + b - a


def _blob(t: str, out: Split, key: str, start: int, end: int, reuse: bytes | None, cur: int) -> None:
    """``t[start:end]`` as a blob of ``key`` (hashed unless ``reuse`` is its digest), the text
    since ``cur`` as the literal before it; the caller's ``cur`` becomes ``end``."""
    piece = t[start:end]
    h = reuse
    if h is None:
        h = digest(piece.encode())
        out.blobs[h] = piece
    out.literals.append(t[cur:start])
    out.refs.append(h)
    out.starts.append(start)
    out.pieces.setdefault(key, []).append((piece, h))


def _split(t: str, prev: Split | None, out: Split, deltas: bool = True) -> None:
    i = _ws(t, 0)
    if t[i] != "{":
        raise _Malformed
    i += 1
    cur = 0
    lits, refs = out.literals, out.refs
    old = prev.pieces if prev is not None else {}
    while True:
        i = _ws(t, i)
        if t[i] == "}":
            break
        m = _STR.match(t, i)
        if m is None:
            raise _Malformed
        key = orjson.loads(m.group())
        i = _ws(t, m.end())
        if t[i] != ":":
            raise _Malformed
        i = _ws(t, i + 1)
        was = old.get(key, ())
        if key in out.pieces:
            out.first[key] = -1  # a key twice: its pieces are not one run
        if key in ARRAY_KEYS and t[i] == "[":
            i = _ws(t, i + 1)
            j = shift = 0
            if key not in out.first:
                out.first[key] = len(refs)
            if t[i] == "]":
                i += 1
            else:
                closed = False
                while not closed:
                    end = _run(t, i, key, j + shift, prev, out, cur)
                    if end >= 0:
                        cur = end
                        j = len(was) - shift
                    else:
                        reuse = None
                        k = _match(t, i, was, j + shift)
                        if k >= 0:
                            end, reuse = i + len(was[k][0]), was[k][1]
                            shift = k - j  # a harness that dropped or inserted messages: the rest shifts too
                        else:
                            end = _skip(t, i)
                        _blob(t, out, key, i, end, reuse, cur)
                        cur = end
                        j += 1
                    i, closed = _next_element(t, end)
        else:
            if was and t.startswith(was[0][0], i) and was[0][0][:1] in ("{", "[", '"'):
                end = i + len(was[0][0])
                _blob(t, out, key, i, end, was[0][1], cur)
                cur = i = end
            else:
                end = _skip(t, i)
                if end - i >= BLOB_MIN:
                    _blob(t, out, key, i, end, None, cur)
                    cur = end
                    if deltas and was:
                        n = common_prefix(was[0][0], t[i:end])
                        if n >= DELTA_MIN:
                            out.bases[out.refs[-1]] = (was[0][1], n)
                i = end
        i = _ws(t, i)
        if t[i] == ",":
            i += 1
            continue
        if t[i] != "}":
            raise _Malformed
        break
    lits.append(t[cur:])


def _next_element(t: str, i: int) -> tuple[int, bool]:
    """After an array element ending at ``t[i]``: where the next element starts, or (the array
    ended) the index past its ``]``; and whether it ended."""
    i = _ws(t, i)
    if t[i] == ",":
        return _ws(t, i + 1), False
    if t[i] != "]":
        raise _Malformed
    return i + 1, True


def _same(t: str, i: int, piece: str) -> bool:
    # a whole JSON object, array or string cannot be a strict prefix of another value
    return piece[:1] in ("{", "[", '"') and t.startswith(piece, i)


def _match(t: str, i: int, was: Sequence[tuple[str, bytes]], at: int) -> int:
    """Index of the previous split's piece that the value at ``t[i]`` is (tried at ``at`` first,
    then nearby: messages dropped or inserted before it), or -1."""
    if 0 <= at < len(was) and _same(t, i, was[at][0]):
        return at
    for k in range(max(0, at - 4), min(len(was), at + 33)):
        if k != at and _same(t, i, was[k][0]):
            return k
    return -1


CONTINUATIONS = 4
"""How a completions prompt writes the previous call's completion (``continuation``'s styles)."""


def continuation(style: int, text: str | None, ids: Sequence[int] | None) -> str | None:
    """The previous call's completion as the next prompt's JSON text carries it after the previous
    prompt (its closing ``"`` / ``]`` dropped): a JSON string's inside (0: ``\\u`` escapes for
    non-ASCII, as Python's ``json``; 1: raw UTF-8, as JavaScript, orjson, ``ensure_ascii=False``),
    or the ids appended to an id list (2: ``,`` between ids; 3: ``, ``). None when ``style``
    does not apply (no text, no ids). The standard library's ``json`` makes the escapes: what
    a stored continuation means never changes."""
    import json

    if style in (0, 1):
        if not isinstance(text, str) or not text:
            return None
        return json.dumps(text, ensure_ascii=style == 0)[1:-1]
    if style in (2, 3):
        if not ids:
            return None
        sep = "," if style == 2 else ", "
        return sep + sep.join(str(int(i)) for i in ids)
    return None


def join_request(literals: Sequence[str], refs: Sequence[bytes], blobs: dict[bytes, str]) -> str:
    parts = [literals[0]]
    for k, h in enumerate(refs):
        parts.append(blobs[h])
        parts.append(literals[k + 1])
    return "".join(parts)


_KEY_TAIL = re.compile(r'"((?:[^"\\]|\\.)*)"[ \t\n\r]*:[ \t\n\r]*(\[[ \t\n\r]*)?\Z')
"""The end of the literal text before a key's first blob: the key, and ``[`` when the blob is the
first element of its array."""
_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")


def rejoin(literals: Sequence[str], refs: Sequence[bytes], blobs: dict[bytes, str]) -> Split | None:
    """The ``Split`` that ``split_request(join_request(literals, refs, blobs), deltas=False)`` returns
    for a request this module split, rebuilt from its parts without parsing the text again (a session
    the writer reads back from the database: 600 pieces, ~0.5 ms where the parse took ~4 at 150k
    tokens). Each blob's key is the one the literal before it ends with (an array's next elements
    follow a bare ``,``). None when a literal does not read so: the caller splits the text. The
    next call's split only ever trusts a piece it compared as text, so a key read wrongly here
    would cost speed, never a wrong digest."""
    out = Split()
    parts = [literals[0]]
    pos = len(literals[0])
    key: str | None = None
    array = False
    for k, h in enumerate(refs):
        lit = literals[k]
        if not (array and k and _SEP.fullmatch(lit)):
            m = _KEY_TAIL.search(lit, max(0, len(lit) - 1024))
            if m is None:
                return None
            try:
                key = orjson.loads(f'"{m.group(1)}"')
            except orjson.JSONDecodeError:
                return None
            array = m.group(2) is not None and key in ARRAY_KEYS
            if m.group(2) is not None and not array:
                return None
            if key in out.pieces:
                out.first[key] = -1
            elif array:
                out.first[key] = k
        piece = blobs[h]
        assert key is not None
        out.literals.append(lit)
        out.refs.append(h)
        out.starts.append(pos)
        out.pieces.setdefault(key, []).append((piece, h))
        tail = literals[k + 1]
        parts.append(piece)
        parts.append(tail)
        pos += len(piece) + len(tail)
    out.literals.append(literals[len(refs)])
    out.text = "".join(parts)
    return out


# -- upstream request ----------------------------------------------------------------------------


def derive_upstream(
    upstream: Any, request: Any, prompt_ids: Sequence[int] | None
) -> tuple[Any, list[str] | None]:
    """``(recipe, texts)``: how to rebuild ``upstream`` from ``request``.

    The recipe is ``{"k": [[key, how, value?], ...]}`` in the upstream's key order, ``how``
    being ``"r"`` (the request's value), ``"p"`` (the prompt ids), ``"c"`` (the prompt ids with
    each run of image token ``value`` made one: tito's ids for vLLM's ``/inference/v1/generate``,
    whose server-expanded prompt is what was recorded; checked here, else literal), ``"m"`` (a
    translated message list), ``"b"`` (a list of ``value`` objects holding images, e.g.
    ``content_parts``), ``"v"`` (the literal value). ``"m"`` and ``"b"`` values are returned as
    ``texts`` (one JSON text per element, in recipe order) that are stored as blobs, where
    images are cut out as everywhere. Not a dict: the value itself as ``{"v": upstream}``.
    """
    if not isinstance(upstream, dict):
        return {"v": upstream}, None
    req = request if isinstance(request, dict) else {}
    keys: list[list[Any]] = []
    texts: list[str] | None = None
    msgs = False
    plist: list[int] | None = None
    for k, v in upstream.items():
        if k in req and _same_json(req[k], v):
            keys.append([k, "r"])
            continue
        if prompt_ids is not None and v is prompt_ids:  # tito's body holds the recorded ``Ids`` itself
            keys.append([k, "p"])
            continue
        if prompt_ids is not None and isinstance(v, list) and v:
            if len(v) == len(prompt_ids) and hasattr(prompt_ids, "array"):  # a ``delta.Ids``: memcmp
                pa = _int_array(prompt_ids)
                if pa is not None and pa == _int_array(v):
                    keys.append([k, "p"])
                    continue
            if plist is None:
                plist = prompt_ids if isinstance(prompt_ids, list) else list(prompt_ids)
            if len(v) == len(plist) and v == plist:
                keys.append([k, "p"])
                continue
            t = _collapsed_by(v, plist)
            if t is not None:
                keys.append([k, "c", t])
                continue
        if k == "messages" and isinstance(v, list) and not msgs:
            msgs = True
            texts = (texts or []) + [orjson.dumps(m).decode() for m in v]
            keys.append([k, "m"])
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v) and _holds_images(v):
            texts = (texts or []) + [orjson.dumps(x).decode() for x in v]
            keys.append([k, "b", len(v)])
        else:
            keys.append([k, "v", v])
    return {"k": keys}, texts


def _same_json(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same JSON (``False == 0`` and ``1 == 1.0`` in Python, not in JSON):
    the same object, or equal values whose encodings are equal too."""
    if a is b:
        return True
    if type(a) is not type(b) or a != b:
        return False
    if type(a) is str:
        return True
    try:
        return orjson.dumps(a) == orjson.dumps(b)
    except orjson.JSONEncodeError:  # not JSON (a record built in Python): equal is all we can say
        return True


def _collapsed_by(v: list[Any], prompt: list[int]) -> int | None:
    """The token whose runs ``prompt`` has where ``v`` has one (``v == collapse_runs(prompt, t)``), or None."""
    if len(v) >= len(prompt):
        return None
    n = 0  # the first difference, by chunks: usually the first image, near the start
    while n < len(v) and v[n : n + 512] == prompt[n : n + 512]:
        n += 512
    n += common_prefix(v[n : n + 512], prompt[n : n + 512])
    if n == 0 or n >= len(v) or prompt[n] != v[n - 1]:
        return None
    t = prompt[n]
    if not isinstance(t, int) or isinstance(t, bool):
        return None
    return t if collapse_runs(prompt, t) == v else None


def _holds_images(v: list[Any]) -> bool:
    found: list[tuple[str, str | None]] = []
    _image_payloads(v, found)
    return any(len(p) >= IMAGE_MIN for p, _ in found)


def upstream_of(
    recipe: Any, request: Any, prompt_ids: Sequence[int] | None, messages: Sequence[str] | None
) -> Any:
    """``derive_upstream`` undone; ``messages``: its ``texts``."""
    if recipe is None:
        return None
    if "v" in recipe:
        return recipe["v"]
    texts = messages or ()
    # a message list takes the texts the image lists do not (recipes before "b" hold messages only)
    in_lists = sum(e[2] for e in recipe["k"] if e[1] == "b")
    at = 0
    out: dict[str, Any] = {}
    for entry in recipe["k"]:
        k, how = entry[0], entry[1]
        if how == "r":
            out[k] = request[k]
        elif how == "p":
            out[k] = None if prompt_ids is None else list(prompt_ids)
        elif how == "c":
            out[k] = None if prompt_ids is None else collapse_runs(prompt_ids, entry[2])
        elif how in ("m", "b"):
            n = entry[2] if how == "b" else len(texts) - in_lists
            out[k] = [orjson.loads(m) for m in texts[at : at + n]]
            at += n
        else:
            out[k] = entry[2]
    return out


# -- responses and events ------------------------------------------------------------------------


def injected(dialect: str, request: Any, upstream: Any) -> tuple[bool, bool]:
    """Which of (ids, logprobs) token mode added to what a native client asked for (the dialect's
    ``injected``, as ``proxy.token.plan_for`` decided); nothing for translated calls (they record
    what the client received already)."""
    wire = dialects.get(dialect)
    return wire.injected(request, upstream) if wire is not None else (False, False)


def _strip(obj: Any, ids: bool, lp: bool) -> Any:
    """What the proxy sent the client for this upstream object: the injected fields null (``Plan._strip``)."""
    if not isinstance(obj, dict) or not (ids or lp):
        return obj
    out = dict(obj)
    if ids and out.get("prompt_token_ids") is not None:
        out["prompt_token_ids"] = None
    choices = out.get("choices")
    if isinstance(choices, list):
        new = []
        for c in choices:
            if isinstance(c, dict):
                c = dict(c)
                if ids:
                    for k in ("token_ids", "prompt_token_ids"):
                        if c.get(k) is not None:
                            c[k] = None
                if lp and c.get("logprobs") is not None:
                    c["logprobs"] = None
            new.append(c)
        out["choices"] = new
    return out


def events_json(events: list[Any], ids: bool, lp: bool) -> bytes:
    """``orjson.dumps`` of ``events`` as ``client_view`` gives them (each ``[name, data]``'s data
    through ``_strip``), without their copies: the injected fields are set to null in the objects
    themselves for the dump and put back after. So the objects must be the caller's alone
    meanwhile (the database writer process's records: no other thread sees them), and no object
    an event strips may be another's (a parsed stream's events share none)."""
    if not (ids or lp):
        return orjson.dumps(events)
    undo: list[tuple[dict[str, Any], str, Any]] = []
    keys = (
        (("token_ids", "prompt_token_ids", "logprobs") if lp else ("token_ids", "prompt_token_ids"))
        if ids
        else ("logprobs",)
    )
    for e in events:
        if not (isinstance(e, list) and len(e) == 2):
            continue
        obj = e[1]
        if not isinstance(obj, dict):
            continue
        if ids:
            v = obj.get("prompt_token_ids")
            if v is not None:
                undo.append((obj, "prompt_token_ids", v))
                obj["prompt_token_ids"] = None
        choices = obj.get("choices")
        if isinstance(choices, list):
            for c in choices:
                if isinstance(c, dict):
                    for k in keys:
                        v = c.get(k)
                        if v is not None:
                            undo.append((c, k, v))
                            c[k] = None
    try:
        return orjson.dumps(events)
    finally:
        for obj, k, v in reversed(undo):
            obj[k] = v


def client_view(
    dialect: str,
    response: Any,
    events: list[Any] | None,
    request: Any,
    upstream: Any,
    prompt_ids: Sequence[int] | None,
    completion_ids: Sequence[int] | None,
    injected_: tuple[bool, bool] | None = None,
) -> tuple[Any, list[Any] | None, list[Any]]:
    """``(response, events, restore)``: as the client received them, and without the ids the
    id columns hold (``restore`` lists where to put them back: ``[path, "prompt"|"completion"]``).
    ``injected_``: ``injected(dialect, request, upstream)`` when the caller has it."""
    ids, lp = injected(dialect, request, upstream) if injected_ is None else injected_
    fresh = False  # ``response`` is a copy made here (its choices list and each choice too): changed in place
    if ids or lp:
        fresh = isinstance(response, dict)
        response = _strip(response, ids, lp)
        if events is not None:
            events = [
                [e[0], _strip(e[1], ids, lp)] if isinstance(e, list) and len(e) == 2 else e for e in events
            ]
    restore: list[Any] = []
    if isinstance(response, dict) and (prompt_ids is not None or completion_ids is not None):
        if not fresh:
            response = dict(response)
        if _same_ids(response.get("prompt_token_ids"), prompt_ids):
            response["prompt_token_ids"] = None
            restore.append([["prompt_token_ids"], "prompt"])
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            c0 = choices[0] if fresh else dict(choices[0])
            for k, which, want in (
                ("prompt_token_ids", "prompt", prompt_ids),
                ("token_ids", "completion", completion_ids),
            ):
                if _same_ids(c0.get(k), want):
                    c0[k] = None
                    restore.append([["choices", 0, k], which])
            if not fresh:
                response["choices"] = [c0, *choices[1:]]
    return response, events, restore


def _same_ids(v: Any, ids: Sequence[int] | None) -> bool:
    """Whether an answer's array ``v`` is ``ids`` (without building a list unless it may be)."""
    if ids is None:
        return False
    if v is ids:  # the proxy's ``delta.Ids``, in the answer as it is
        return True
    return isinstance(v, list) and len(v) == len(ids) and v == list(ids)


def restore_ids(
    response: Any,
    restore: Sequence[Any],
    prompt_ids: Sequence[int] | None,
    completion_ids: Sequence[int] | None,
) -> Any:
    for path, which in restore:
        ids = prompt_ids if which == "prompt" else completion_ids
        node = response
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = None if ids is None else list(ids)
    return response


def collapse_runs(ids: Sequence[int], token: int) -> list[int]:
    """``ids`` with each run of ``token`` made one (a server-expanded image run back to the one
    placeholder tito sent, as ``proxy.tito.collapse_images``)."""
    out: list[int] = []
    i, n = 0, len(ids)
    seq = ids if isinstance(ids, list) else list(ids)
    while i < n:
        try:
            j = seq.index(token, i)
        except ValueError:
            out.extend(seq[i:])
            break
        out.extend(seq[i : j + 1])
        j += 1
        while j < n and seq[j] == token:
            j += 1
        i = j
    return out
