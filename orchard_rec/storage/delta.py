"""Encoding a call against what its session holds (writer side), and decoding it back (reads).

``Encoder`` lives in the ``Store`` and keeps, per session, a bounded cache of the last
call's ids, request split and blob digests, so a write compares the new call with what
it already has in memory and stores only the difference: no database read per call (a
session it has not seen, e.g. after a restart, is loaded once). The cache is updated only
after the batch commits, so a base is always a committed call.

Blobs: ``Encoder.encode`` returns the new blobs' whole texts; ``Encoder.blob_rows`` turns
them into what is stored (``parts``): a growing value as its new text on the previous
call's piece (``base``, ``base_len``), images cut out into the shared ``images`` table
(``images``: holes). ``Encoder(parts=False)`` writes whole texts only (the 0004 schema).

``Reader`` decodes rows of one database connection: delta chains are followed through the
bases (usually the call just decoded, kept in a small cache), blobs are fetched per
session once, each with its base and images.
"""

from __future__ import annotations

import threading
from array import array
from base64 import b64encode
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
from sqlalchemy import bindparam, select

from orchard_rec.dialects.images import ImageRef, image_ref
from orchard_rec.errors import cache_stats
from orchard_rec.records import CallRecord
from orchard_rec.storage import layout
from orchard_rec.storage.ids import Ids
from orchard_rec.storage.models import Blob, Call, Image

_IDS_OF = select(Call.prompt_ids, Call.completion_ids).where(Call.id == bindparam("id"))
"""A call's stored id columns (built once: a delta chain may ask for many)."""

__all__ = ["BlobRow", "Encoder", "Ids", "Reader", "SessionState"]

BlobRow = tuple[bytes, bytes, bytes | None, int | None, bytes | None, str | None, int | None]
"""``(digest, data, base, base_len, images, base_call, base_style)`` of a ``blobs`` row (without the session)."""

_IMAGE_CACHE = 8
"""Images (base64 text + digest) a session's writer state remembers, most recent first."""


def _prefix(prompt: Sequence[int], st: SessionState) -> int:
    """Common prefix of ``prompt`` with the session's last prompt + completion."""
    old = st.tokens
    n = len(old)
    known = (
        prompt is old
        or (st.mark is not None and getattr(prompt, "base", None) is st.mark)
        or (isinstance(prompt, Ids) and isinstance(old, Ids) and prompt.starts_with(old))
    )
    if not (known and len(prompt) >= n):
        n = layout.common_prefix(prompt, old)  # not known: compared
        if n < len(old):
            return n
    comp = st.completion
    return n + layout.common_prefix(prompt[n : n + len(comp)], comp) if comp else n


class SessionState:
    """What the writer remembers of one session: enough to encode its next call as a delta."""

    __slots__ = (
        "bases",
        "completion",
        "cont",
        "conts",
        "images",
        "known",
        "mark",
        "refs",
        "refs_id",
        "size",
        "skel",
        "split",
        "tokens",
        "tokens_id",
        "up_refs",
        "up_refs_id",
        "up_texts",
    )

    def __init__(self) -> None:
        self.tokens: Sequence[int] = ()
        """The prompt of ``tokens_id``, the last call with ids (as recorded: no copy)."""
        self.completion: tuple[int, ...] = ()
        """Its completion: a next prompt is based on the prompt + completion."""
        self.mark: object | None = None
        """``tokens.mark`` when ``tokens`` is ``Ids``: a prompt whose ``base`` it is extends it."""
        self.tokens_id: str | None = None
        self.refs: list[bytes] = []
        self.refs_id: str | None = None
        self.split: layout.Split | None = None
        self.skel: bytes | None = None
        """``split``'s literals compressed (the request's stored skeleton): a request the same as
        the previous one reuses it."""
        self.up_refs: list[bytes] = []
        self.up_refs_id: str | None = None
        self.up_texts: list[str] = []
        """The texts of ``up_refs``: the next call's translated messages are compared with them."""
        self.known: set[bytes] = set()
        """Blob digests the database holds for the session."""
        self.bases: dict[bytes, tuple[bytes, int]] = {}
        """The last ``encode``'s new blobs that continue an earlier piece (``layout.Split.bases``)."""
        self.conts: dict[bytes, tuple[str, int, int]] = {}
        """Of those, the ones that go on with a call's completion: (call id, style, its length)."""
        self.cont: tuple[str, str | None, tuple[int, ...] | None, str, bytes] | None = None
        """The last completions call with a prompt piece: (call id, completion text, completion ids,
        the piece's text, its digest)."""
        self.images: OrderedDict[tuple[int, str, str], tuple[str, int, bytes]] = OrderedDict()
        """Images the session's recent blobs held: (length, head, tail) -> (the blob text holding the
        base64, where it starts, SHA-256). The text is the split's own piece (no copy)."""
        self.size = 0

    def copy(self) -> SessionState:
        s = SessionState()
        s.tokens, s.tokens_id, s.completion, s.mark = self.tokens, self.tokens_id, self.completion, self.mark
        s.refs, s.refs_id, s.split, s.skel = self.refs, self.refs_id, self.split, self.skel
        s.up_refs, s.up_refs_id, s.up_texts = self.up_refs, self.up_refs_id, self.up_texts
        s.known = set(self.known)
        s.images = OrderedDict(self.images)
        s.cont = self.cont
        return s

    def measure(self) -> int:
        tokens = self.tokens
        n = (  # ids: an ``Ids`` buffer (shared with the id parser's cache), or a tuple's slots and ints
            (tokens.nbytes if isinstance(tokens, Ids) else 40 * len(tokens))
            + 40 * len(self.completion)
            + 64 * len(self.known)
            + 32 * (len(self.refs) + len(self.up_refs))
        )
        n += sum(len(t) + 80 for t in self.up_texts)
        held = {id(t) for t in self.up_texts}
        if self.split is not None and self.split.text is not None:
            # its text and its pieces (copies of parts of it), without a pass over 600 pieces; the
            # images' texts below may be pieces counted twice (at most ``_IMAGE_CACHE``)
            n += 2 * len(self.split.text) + 80 * len(self.split.refs)
        elif self.split is not None:
            n += sum(len(p) + 80 for pieces in self.split.pieces.values() for p, _ in pieces)
            held.update(id(p) for pieces in self.split.pieces.values() for p, _ in pieces)
        n += sum(120 + (0 if id(t) in held else len(t)) for t, _, _ in self.images.values())
        self.size = n
        return n


def _json(v: Any) -> Any:
    # SQLite hands back JSON text where the ORM type is bypassed; orjson for both
    return orjson.loads(v) if isinstance(v, (str, bytes, bytearray, memoryview)) else v


def _key(session_id: str | None) -> str:
    return session_id or ""


class Encoder:
    """Turns records into rows + new blobs; holds the per-session cache (bounded in bytes)."""

    def __init__(self, max_bytes: int = 256 << 20, *, parts: bool = True) -> None:
        """``parts``: growing values as deltas (a completions prompt also on the previous call's
        completion) and images cut out (``blob_rows``); False writes whole blob texts only, as
        the 0004 schema stores them."""
        self.max_bytes = max_bytes
        self.parts = parts
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        """Session calls encoded on the session's state held here (``Store.write_batch`` counts)."""
        self.misses = 0
        """Session calls whose session had to be read back from the database first."""
        self.owned = False
        """The records ``encode`` is given are the caller's alone while it runs (the database
        writer process's: no other thread holds them), so a stream's events are written as the
        client received them by nulling the injected fields in place for their dump
        (``layout.events_json``), not from copies of every event."""

    def stats(self) -> dict[str, int]:
        return cache_stats(len(self._states), self._bytes, self.max_bytes, self.hits, self.misses)

    def state(self, session_id: str | None) -> SessionState | None:
        with self._lock:
            st = self._states.get(_key(session_id))
            if st is not None:
                self._states.move_to_end(_key(session_id))
            return st

    def commit(self, states: dict[str, SessionState]) -> None:
        """After the batch committed: its sessions' new states become the cache."""
        with self._lock:
            for k, st in states.items():
                old = self._states.pop(k, None)
                if old is not None:
                    self._bytes -= old.size
                if not k:
                    continue  # untagged calls share no history
                self._bytes += st.measure()
                self._states[k] = st
            while self._bytes > self.max_bytes and self._states:
                _, old = self._states.popitem(last=False)
                self._bytes -= old.size

    def encode(self, r: CallRecord, st: SessionState) -> tuple[dict[str, Any], dict[bytes, str]]:
        """The stored fields of ``r`` (updating ``st`` to include it) and the blobs it adds."""
        new_blobs: dict[bytes, str] = {}
        st.bases, st.conts = {}, {}
        # token ids: a prefix of the previous call's prompt + completion, then the new ids
        prompt = r.prompt_ids
        prompt_col = None
        if prompt is not None:
            n = _prefix(prompt, st) if st.tokens_id else 0
            prompt_col = layout.pack_delta(st.tokens_id if n else None, n, layout.pack_ints(prompt[n:]))
            st.tokens, st.completion = prompt, tuple(r.completion_ids or ())
            st.tokens_id, st.mark = r.call_id, getattr(prompt, "mark", None)
        # the request: literal text around blobs (messages, tools), refs as a delta on the previous call's
        text = r.request_text
        if text is None and r.request is not None:
            text = orjson.dumps(r.request).decode()
        skel = refs_col = None
        if text is not None:
            split = layout.split_request(text, st.split, deltas=self.parts)
            for h, piece in split.blobs.items():
                if h not in st.known:
                    new_blobs[h] = piece
                    base = split.bases.get(h)
                    if base is not None and base[0] in st.known:
                        st.bases[h] = base
            if self.parts and r.dialect == "completions":
                self._continue(r, st, split, new_blobs)
            n = layout.common_prefix(split.refs, st.refs) if st.refs_id else 0
            refs_col = layout.pack_delta(st.refs_id if n else None, n, b"".join(split.refs[n:]))
            prev = st.split
            if prev is not None and st.skel is not None and split.literals is prev.literals:
                skel = st.skel  # the same text again (``layout.split_request``): the same skeleton
            else:
                skel = layout.compress(split.literals)
            st.refs, st.refs_id, st.split, st.skel = split.refs, r.call_id, split, skel
        # the upstream request: a recipe on the request; its own message list as blobs
        recipe, msgs = layout.derive_upstream(r.upstream_request, r.request, prompt)
        recipe = None if r.upstream_request is None else recipe
        up_refs_col = None
        if msgs is not None:
            digests = []
            was, was_refs = st.up_texts, st.up_refs
            for j, m in enumerate(msgs):
                if j < len(was) and was[j] == m:  # the previous call's message: compared, not hashed
                    h = was_refs[j]
                else:
                    h = layout.digest(m.encode())
                digests.append(h)
                if h not in st.known:
                    new_blobs[h] = m
            n = layout.common_prefix(digests, st.up_refs) if st.up_refs_id else 0
            up_refs_col = layout.pack_delta(st.up_refs_id if n else None, n, b"".join(digests[n:]))
            st.up_refs, st.up_refs_id, st.up_texts = digests, r.call_id, msgs
        st.known.update(new_blobs)
        dialect = r.dialect.value
        inj = layout.injected(dialect, r.request, r.upstream_request)
        own = r.events if self.owned else None  # the events' JSON then without their copies
        response, events, restore = layout.client_view(
            dialect,
            r.response,
            r.events if own is None else None,
            r.request,
            r.upstream_request,
            prompt,
            r.completion_ids,
            inj,
        )
        events_col: bytes | None
        if own is not None:
            events_col = layout.compress_json(layout.events_json(own, *inj))
        else:
            events_col = None if events is None else layout.compress(events)
        fields = {
            "request_skel": skel,
            "request_refs": refs_col,
            "upstream": recipe,
            "upstream_refs": up_refs_col,
            "response": response,
            "response_ids": restore or None,
            "events": events_col,
            "prompt_ids": prompt_col,
            "completion_ids": None if r.completion_ids is None else layout.pack_ints(r.completion_ids),
            "completion_logprobs": None
            if r.completion_logprobs is None
            else layout.pack_floats(r.completion_logprobs),
        }
        return fields, new_blobs

    @staticmethod
    def _continue(r: CallRecord, st: SessionState, split: layout.Split, new_blobs: dict[bytes, str]) -> None:
        """A completions prompt that is the previous one + its completion + new text: noted as
        such (``st.conts``), so the completion is not stored again; ``st.cont`` becomes this call."""
        pieces = split.pieces.get("prompt")
        if not pieces or len(pieces) != 1:
            return
        piece, h = pieces[0]
        cont = st.cont
        if cont is not None and h in new_blobs and cont[4] in st.known:
            cid, ctext, cids, prev, prev_h = cont
            n0 = len(prev) - 1
            if n0 > 0 and piece.startswith(prev[:n0]):
                for style in range(layout.CONTINUATIONS):
                    c = layout.continuation(style, ctext, cids)
                    if c and piece.startswith(c, n0):
                        st.bases[h] = (prev_h, n0)
                        st.conts[h] = (cid, style, len(c))
                        break
        resp = r.response
        text = None
        if isinstance(resp, dict) and isinstance(resp.get("choices"), list) and resp["choices"]:
            c0 = resp["choices"][0]
            if isinstance(c0, dict) and isinstance(c0.get("text"), str):
                text = c0["text"]
        st.cont = (r.call_id, text, None if r.completion_ids is None else tuple(r.completion_ids), piece, h)

    def blob_rows(
        self, st: SessionState, new_blobs: dict[bytes, str]
    ) -> tuple[list[BlobRow], dict[str, ImageRef]]:
        """The stored form of the blobs ``encode`` just returned, and the images they hold.

        Images are decoded and hashed only when the session's recent images do not hold the same
        base64 text (compared, not hashed). The images returned may already be stored (by
        another session): ``Store`` inserts them if absent.
        """
        rows: list[BlobRow] = []
        images: dict[str, ImageRef] = {}
        for h, text in new_blobs.items():
            base, n = st.bases.get(h, (None, 0))
            cont = st.conts.get(h)
            skip = n + (cont[2] if cont is not None else 0)  # the base's characters, then the completion's
            own = text[skip:] if base is not None else text
            spans: list[tuple[int, int, bytes]] = []
            for start, end, mime in layout.image_spans(text) if base is None or "base64" in own else ():
                if start < skip:
                    continue  # in the base's text
                payload = text[start:end]
                key = (len(payload), payload[:64], payload[-64:])
                hit = st.images.get(key)
                if hit is not None and hit[0].startswith(payload, hit[1]):
                    st.images.move_to_end(key)
                    sha = hit[2]
                else:
                    data = layout.b64_exact(payload)
                    if data is None:
                        continue  # stays literal
                    ref = image_ref(data, mime)
                    sha = bytes.fromhex(ref.digest)
                    images[ref.digest] = ref
                    st.images[key] = (text, start, sha)
                    while len(st.images) > _IMAGE_CACHE:
                        st.images.popitem(last=False)
                spans.append((start - skip, end - skip, sha))
            holes = None
            if spans:
                own, where = layout.cut(own, spans)
                holes = layout.pack_holes(where)
            rows.append(
                (
                    h,
                    own.encode(),
                    base,
                    n if base is not None else None,
                    holes,
                    None if cont is None else cont[0],
                    None if cont is None else cont[1],
                )
            )
        return rows, images


class _LRU:
    """Texts by digest, least recently used dropped first beyond ``max_chars`` (the last one always kept)."""

    __slots__ = ("_d", "max_chars", "size")

    def __init__(self, max_chars: int) -> None:
        self._d: OrderedDict[bytes, str] = OrderedDict()
        self.max_chars = max_chars
        self.size = 0

    def get(self, h: bytes) -> str | None:
        t = self._d.get(h)
        if t is not None:
            self._d.move_to_end(h)
        return t

    def put(self, h: bytes, text: str) -> str:
        old = self._d.pop(h, None)
        if old is not None:
            self.size -= len(old)
        self._d[h] = text
        self.size += len(text)
        while self.size > self.max_chars and len(self._d) > 1:
            _, gone = self._d.popitem(last=False)
            self.size -= len(gone)
        return text


class Reader:
    """Decodes stored calls over one connection; follows delta chains, caches the session's blobs."""

    def __init__(
        self,
        conn: Any,
        keep: int = 4,
        *,
        parts: bool = True,
        continuations: bool = True,
        max_bytes: int = 128 << 20,
    ) -> None:
        """``parts``: blobs have ``base``/``images`` columns (False: the 0004 schema);
        ``continuations``: and ``base_call``/``base_style`` (False: the 0006 schema).
        ``max_bytes``: about how much blob text (characters) the session cache keeps."""
        self.conn = conn
        self.keep = keep
        self.parts = parts
        self.continuations = continuations and parts
        self.max_bytes = max_bytes
        self._b64 = _LRU(max_bytes // 4)
        """The session's images as base64 text, by SHA-256."""
        self._tokens: OrderedDict[str, tuple[Ids, tuple[int, ...]]] = OrderedDict()
        """call id -> (prompt, completion), the last few decoded."""
        self._refs: dict[str, OrderedDict[str, list[bytes]]] = {
            "request_refs": OrderedDict(),
            "upstream_refs": OrderedDict(),
        }
        self._blobs = _LRU(max_bytes)
        self._blob_session: str | None = None

    # -- token ids -------------------------------------------------------------------------------

    def tokens(
        self,
        call_id: str,
        prompt_col: bytes | None,
        completion_col: bytes | None,
        session_id: str | None = None,
    ) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """The call's prompt and completion ids from its stored columns, following the chain of calls
        its prompt is a delta on back to one at hand (the last few decoded are kept).

        Linear in the ids, however long the chain: the prompt is built in one array (each link cuts it
        to its shared prefix and appends its own ids), not each link's prompt in turn; and with
        ``session_id`` a chain of more than one call missing reads the session's id columns in one
        query, not a query a link (a session's last call read back cold, 180 calls deep: ~80 ms -> a
        few, issue 16)."""
        prompt, completion = self.ids(call_id, prompt_col, completion_col, session_id)
        if prompt is None:
            return None, completion
        a = prompt.array()
        return tuple(prompt if a is None else a), completion

    def ids(
        self,
        call_id: str,
        prompt_col: bytes | None,
        completion_col: bytes | None,
        session_id: str | None = None,
    ) -> tuple[Ids | None, tuple[int, ...] | None]:
        """``tokens``, the prompt as an ``Ids`` over the array it was built in: no tuple of 150k
        ints, and compared with another ``Ids`` at memcmp speed (the writer's state holds it so)."""
        completion = None if completion_col is None else tuple(layout.unpack_ints(bytes(completion_col)))
        if prompt_col is None:
            return None, completion
        chain: list[tuple[int, bytes, bytes]] = []  # (shared prefix, own ids, completion), newest first
        pcol, ccol = bytes(prompt_col), b"" if completion_col is None else bytes(completion_col)
        cid = call_id
        rows: dict[str, tuple[bytes, ...]] | None = None
        while True:
            base, n, payload = layout.unpack_delta(pcol)
            chain.append((n, payload, ccol))
            if base is None or base in self._tokens:
                break
            if rows is None and session_id is not None and len(chain) > 1:
                rows = self._session_columns(session_id, Call.prompt_ids, Call.completion_ids)
            got = rows.get(base) if rows is not None else None
            if got is None:
                row = self.conn.execute(_IDS_OF, {"id": base}).first()
                if row is None or row[0] is None:
                    raise LookupError(f"call {cid} is stored on call {base}, which is missing")
                got = (bytes(row[0]), b"" if row[1] is None else bytes(row[1]))
            cid, (pcol, ccol) = base, got
        # bytes, not an array("i"): an array reallocates when a link cuts more than 16 ids (a
        # copy of the whole prompt per link, 1 ms of 180 links at 150k ids); a bytearray keeps its room
        work = bytearray()
        if base is not None:
            p, c = self._tokens[base]
            a = p.array()
            work += (array("i", p) if a is None else a).tobytes()
            work += array("i", c).tobytes()
        last = len(chain) - 1
        for i, (n, payload, ccol) in enumerate(reversed(chain)):
            del work[4 * n :]
            work += payload
            if i < last:  # the next link shares a prefix of this call's prompt + completion
                work += ccol
        buf = array("i")
        buf.frombytes(work)
        prompt = Ids.adopt(buf)
        self._remember(call_id, prompt, completion or ())
        return prompt, completion

    def _session_columns(self, session_id: str, *cols: Any) -> dict[str, tuple[bytes, ...]]:
        """Call id -> ``cols`` (bytes; b"" for NULL after the first) of the session's calls whose
        first column is set: a whole delta chain in one query."""
        t = Call.__table__
        q = select(t.c.id, *cols).where(t.c.session_id == session_id, cols[0].is_not(None))
        return {
            row[0]: tuple(b"" if v is None else bytes(v) for v in row[1:]) for row in self.conn.execute(q)
        }

    def _remember(self, cid: str, prompt: Ids, comp: tuple[int, ...]) -> None:
        self._tokens[cid] = (prompt, comp)
        self._tokens.move_to_end(cid)
        while len(self._tokens) > self.keep:
            self._tokens.popitem(last=False)

    # -- blob references -------------------------------------------------------------------------

    def refs(self, column: str, call_id: str, data: bytes, session_id: str | None = None) -> list[bytes]:
        """The digests a call's ``column`` lists, following its delta chain (as ``tokens`` does: with
        ``session_id``, one query for a chain of more than one call missing)."""
        cache = self._refs[column]
        chain: list[tuple[int, bytes]] = []  # (shared prefix, own digests), newest first
        cid, col = call_id, bytes(data)
        rows: dict[str, tuple[bytes, ...]] | None = None
        while True:
            base, n, payload = layout.unpack_delta(col)
            chain.append((n, payload))
            if base is None or base in cache:
                break
            if rows is None and session_id is not None and len(chain) > 1:
                rows = self._session_columns(session_id, Call.__table__.c[column])
            got = rows.get(base) if rows is not None else None
            if got is None:
                value = self.conn.execute(select(Call.__table__.c[column]).where(Call.id == base)).scalar()
                if value is None:
                    raise LookupError(f"call {cid} is stored on call {base}, which is missing")
                got = (bytes(value),)
            cid, (col,) = base, got
        size = layout.DIGEST
        out: list[bytes] = [] if base is None else list(cache[base])
        for n, payload in reversed(chain):
            del out[n:]
            out.extend(payload[i : i + size] for i in range(0, len(payload), size))
        cache[call_id] = out
        cache.move_to_end(call_id)
        while len(cache) > 64:
            cache.popitem(last=False)
        return out

    def blobs(self, session_id: str | None, digests: Sequence[bytes]) -> dict[bytes, str]:
        """The whole texts of ``digests``.

        Kept for the session's next calls in a cache bounded in bytes (least recently used
        first out): the conversation's messages stay, screenshots the harness stopped sending and
        prompts a later one continues leave, so reading a session holds about one call's text.
        """
        key = _key(session_id)
        if key != self._blob_session:
            self._blobs, self._b64, self._blob_session = _LRU(self.max_bytes), _LRU(self.max_bytes // 4), key
        cache = self._blobs
        out: dict[bytes, str] = {}
        wanted: dict[bytes, None] = {}  # in order, once each (a list's ``in`` was 600 x 600 compares)
        for h in digests:
            if h in out:
                continue
            t = cache.get(h)
            if t is None:
                wanted[h] = None
            else:
                out[h] = t
        missing = list(wanted)
        if not missing:
            return out
        if not self.parts:
            for h, data, *_ in self._fetch(key, missing):
                out[h] = cache.put(h, bytes(data).decode("utf-8"))
            return out
        rows: dict[bytes, tuple[str, bytes | None, int, list[tuple[int, bytes]], str | None, int]] = {}
        texts: dict[bytes, str] = {}  # resolved in this call (the cache may let them go)
        todo = missing
        while todo:  # the blobs, then the bases they continue that are not at hand
            for h, data, base, n, holes, *cont in self._fetch(key, todo):
                rows[h] = (
                    bytes(data).decode("utf-8"),
                    None if base is None else bytes(base),
                    n or 0,
                    [] if holes is None else layout.unpack_holes(bytes(holes)),
                    cont[0] if cont else None,
                    cont[1] if cont and cont[1] is not None else 0,
                )
            nxt: set[bytes] = set()
            for h in todo:
                b = rows[h][1] if h in rows else None
                if b is not None and b not in rows and b not in texts:
                    t = cache.get(b)
                    if t is None:
                        nxt.add(b)
                    else:
                        texts[b] = t
            todo = list(nxt)
        b64 = self._images([sha for r in rows.values() for _, sha in r[3]])
        for h in rows:
            stack = [h]
            while stack:
                top = stack[-1]
                if top in texts:
                    stack.pop()
                    continue
                if top not in rows:
                    raise LookupError(f"blob {top.hex()} of session {key!r} is missing")
                own, base, n, holes, call, style = rows[top]
                if base is not None and base not in texts:
                    stack.append(base)
                    continue
                text = layout.paste(own, holes, b64) if holes else own
                if call is not None:
                    text = self._completion(call, style) + text
                texts[top] = text if base is None else texts[base][:n] + text
                stack.pop()
        for h in missing:
            if h in texts:
                out[h] = cache.put(h, texts[h])
        return out

    def _fetch(self, key: str, digests: list[bytes]) -> Iterator[tuple[Any, ...]]:
        cols: list[Any] = [Blob.digest, Blob.data]
        if self.parts:
            cols += [Blob.base, Blob.base_len, Blob.images]
        if self.continuations:
            cols += [Blob.base_call, Blob.base_style]
        for i in range(0, len(digests), 500):
            for row in self.conn.execute(
                select(*cols).where(Blob.session_id == key, Blob.digest.in_(digests[i : i + 500]))
            ):
                yield (bytes(row[0]), *row[1:])

    def _completion(self, call_id: str, style: int) -> str:
        """Call ``call_id``'s completion as a continuation of its prompt (``layout.continuation``)."""
        row = self.conn.execute(select(Call.response, Call.completion_ids).where(Call.id == call_id)).first()
        if row is None:
            raise LookupError(f"a prompt continues call {call_id}, which is missing")
        resp = _json(row[0])
        text = None
        if isinstance(resp, dict) and isinstance(resp.get("choices"), list) and resp["choices"]:
            c0 = resp["choices"][0]
            text = c0.get("text") if isinstance(c0, dict) else None
        ids = None if row[1] is None else layout.unpack_ints(bytes(row[1]))
        c = layout.continuation(style, text, ids)
        if c is None:
            raise LookupError(f"call {call_id} has no completion a prompt continues")
        return c

    def _images(self, shas: Sequence[bytes]) -> dict[bytes, str]:
        """Base64 text of each image, by SHA-256."""
        out: dict[bytes, str] = {}
        for sha in shas:
            t = self._b64.get(sha)
            if t is not None:
                out[sha] = t
        missing = list({s.hex() for s in shas if s not in out})
        for i in range(0, len(missing), 100):
            for d, data in self.conn.execute(
                select(Image.digest, Image.data).where(Image.digest.in_(missing[i : i + 100]))
            ):
                sha = bytes.fromhex(d)
                out[sha] = self._b64.put(sha, b64encode(bytes(data)).decode("ascii"))
        for sha in shas:
            if sha not in out:
                raise LookupError(f"image {sha.hex()} is missing")
        return out

    # -- a whole call ----------------------------------------------------------------------------

    def bodies(
        self, c: Any, prompt: tuple[int, ...] | None, completion: tuple[int, ...] | None
    ) -> dict[str, Any]:
        """``request_text``, ``request``, ``upstream_request``, ``response``, ``events`` of row ``c``."""
        text = request = None
        if c.request_skel is not None:
            literals = layout.decompress(bytes(c.request_skel))
            refs = (
                self.refs("request_refs", c.id, c.request_refs, c.session_id)
                if c.request_refs is not None
                else []
            )
            text = layout.join_request(literals, refs, self.blobs(c.session_id, refs) if refs else {})
            request = orjson.loads(text)
        msgs = None
        if c.upstream_refs is not None:
            digests = self.refs("upstream_refs", c.id, c.upstream_refs, c.session_id)
            blobs = self.blobs(c.session_id, digests)
            msgs = [blobs[h] for h in digests]
        upstream = layout.upstream_of(c.upstream, request, prompt, msgs)
        response = c.response
        if c.response_ids:
            response = layout.restore_ids(response, c.response_ids, prompt, completion)
        events = None if c.events is None else layout.decompress(bytes(c.events))
        return {
            "request_text": text,
            "request": request,
            "upstream_request": upstream,
            "response": response,
            "events": events,
        }
