"""Encoding a call against what its session holds (writer side), and decoding it back (reads).

``Encoder`` lives in the ``Store`` and keeps, per session, a bounded cache of the last
call's ids, request split and blob digests, so a write compares the new call with what
it already has in memory and stores only the difference: no database read per call (a
session it has not seen, e.g. after a restart, is loaded once). The cache is updated only
after the batch commits, so a base is always a committed call.

``Reader`` decodes rows of one database connection: delta chains are followed through the
bases (usually the call just decoded, kept in a small cache), blobs are fetched per
session once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy import select

from orchard_rec.records import CallRecord
from orchard_rec.storage import layout
from orchard_rec.storage.models import Blob, Call

__all__ = ["Encoder", "Reader", "SessionState"]


class SessionState:
    """What the writer remembers of one session: enough to encode its next call as a delta."""

    __slots__ = ("known", "refs", "refs_id", "size", "split", "tokens", "tokens_id", "up_refs", "up_refs_id")

    def __init__(self) -> None:
        self.tokens: tuple[int, ...] = ()
        """Prompt + completion of ``tokens_id``, the last call with ids."""
        self.tokens_id: str | None = None
        self.refs: list[bytes] = []
        self.refs_id: str | None = None
        self.split: layout.Split | None = None
        self.up_refs: list[bytes] = []
        self.up_refs_id: str | None = None
        self.known: set[bytes] = set()
        """Blob digests the database holds for the session."""
        self.size = 0

    def copy(self) -> SessionState:
        s = SessionState()
        s.tokens, s.tokens_id = self.tokens, self.tokens_id
        s.refs, s.refs_id, s.split = self.refs, self.refs_id, self.split
        s.up_refs, s.up_refs_id = self.up_refs, self.up_refs_id
        s.known = set(self.known)
        return s

    def measure(self) -> int:
        n = 64 * len(self.tokens) + 64 * len(self.known) + 32 * (len(self.refs) + len(self.up_refs))
        if self.split is not None:
            n += sum(len(p) + 80 for pieces in self.split.pieces.values() for p, _ in pieces)
        self.size = n
        return n


def _key(session_id: str | None) -> str:
    return session_id or ""


class Encoder:
    """Turns records into rows + new blobs; holds the per-session cache (bounded in bytes)."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

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
        # token ids: a prefix of the previous call's prompt + completion, then the new ids
        prompt = r.prompt_ids
        prompt_col = None
        if prompt is not None:
            n = layout.common_prefix(prompt, st.tokens) if st.tokens_id else 0
            prompt_col = layout.pack_delta(st.tokens_id if n else None, n, layout.pack_ints(prompt[n:]))
            st.tokens = tuple(prompt) + tuple(r.completion_ids or ())
            st.tokens_id = r.call_id
        # the request: literal text around blobs (messages, tools), refs as a delta on the previous call's
        text = r.request_text
        if text is None and r.request is not None:
            text = orjson.dumps(r.request).decode()
        skel = refs_col = None
        if text is not None:
            split = layout.split_request(text, st.split)
            for h, piece in split.blobs.items():
                if h not in st.known:
                    new_blobs[h] = piece
            n = layout.common_prefix(split.refs, st.refs) if st.refs_id else 0
            refs_col = layout.pack_delta(st.refs_id if n else None, n, b"".join(split.refs[n:]))
            skel = layout.compress(split.literals)
            st.refs, st.refs_id, st.split = split.refs, r.call_id, split
        # the upstream request: a recipe on the request; its own message list as blobs
        recipe, msgs = layout.derive_upstream(r.upstream_request, r.request, prompt)
        recipe = None if r.upstream_request is None else recipe
        up_refs_col = None
        if msgs is not None:
            digests = []
            for m in msgs:
                h = layout.digest(m.encode())
                digests.append(h)
                if h not in st.known:
                    new_blobs[h] = m
            n = layout.common_prefix(digests, st.up_refs) if st.up_refs_id else 0
            up_refs_col = layout.pack_delta(st.up_refs_id if n else None, n, b"".join(digests[n:]))
            st.up_refs, st.up_refs_id = digests, r.call_id
        st.known.update(new_blobs)
        response, events, restore = layout.client_view(
            r.dialect.value, r.response, r.events, r.request, r.upstream_request, prompt, r.completion_ids
        )
        fields = {
            "request_skel": skel,
            "request_refs": refs_col,
            "upstream": recipe,
            "upstream_refs": up_refs_col,
            "response": response,
            "response_ids": restore or None,
            "events": None if events is None else layout.compress(events),
            "prompt_ids": prompt_col,
            "completion_ids": None if r.completion_ids is None else layout.pack_ints(r.completion_ids),
            "completion_logprobs": None
            if r.completion_logprobs is None
            else layout.pack_floats(r.completion_logprobs),
        }
        return fields, new_blobs


class Reader:
    """Decodes stored calls over one connection; follows delta chains, caches the session's blobs."""

    def __init__(self, conn: Any, keep: int = 4) -> None:
        self.conn = conn
        self.keep = keep
        self._tokens: OrderedDict[str, tuple[tuple[int, ...], tuple[int, ...]]] = OrderedDict()
        """call id -> (prompt, completion), the last few decoded."""
        self._refs: dict[str, OrderedDict[str, list[bytes]]] = {
            "request_refs": OrderedDict(),
            "upstream_refs": OrderedDict(),
        }
        self._blobs: dict[bytes, str] = {}
        self._blob_session: str | None = None

    # -- token ids -------------------------------------------------------------------------------

    def tokens(
        self, call_id: str, prompt_col: bytes | None, completion_col: bytes | None
    ) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        completion = None if completion_col is None else tuple(layout.unpack_ints(bytes(completion_col)))
        if prompt_col is None:
            return None, completion
        prompt_col = bytes(prompt_col)
        chain: list[tuple[str, int, bytes, tuple[int, ...]]] = []
        cid, pcol, comp = call_id, prompt_col, completion or ()
        while True:
            base, n, payload = layout.unpack_delta(pcol)
            chain.append((cid, n, payload, comp))
            if base is None or base in self._tokens:
                break
            row = self.conn.execute(
                select(Call.prompt_ids, Call.completion_ids).where(Call.id == base)
            ).first()
            if row is None or row[0] is None:
                raise LookupError(f"call {cid} is stored on call {base}, which is missing")
            cid, pcol = base, bytes(row[0])
            comp = () if row[1] is None else tuple(layout.unpack_ints(bytes(row[1])))
        full: tuple[int, ...] = ()
        if base is not None:
            p, c = self._tokens[base]
            full = p + c
        prompt: tuple[int, ...] = ()
        for cid, n, payload, comp in reversed(chain):
            prompt = full[:n] + tuple(layout.unpack_ints(payload))
            self._remember(cid, prompt, comp)
            full = prompt + comp
        return prompt, completion

    def _remember(self, cid: str, prompt: tuple[int, ...], comp: tuple[int, ...]) -> None:
        self._tokens[cid] = (prompt, comp)
        self._tokens.move_to_end(cid)
        while len(self._tokens) > self.keep:
            self._tokens.popitem(last=False)

    # -- blob references -------------------------------------------------------------------------

    def refs(self, column: str, call_id: str, data: bytes) -> list[bytes]:
        cache = self._refs[column]
        chain: list[tuple[str, int, bytes]] = []
        cid, col = call_id, bytes(data)
        while True:
            base, n, payload = layout.unpack_delta(col)
            chain.append((cid, n, payload))
            if base is None or base in cache:
                break
            got = self.conn.execute(select(Call.__table__.c[column]).where(Call.id == base)).scalar()
            if got is None:
                raise LookupError(f"call {cid} is stored on call {base}, which is missing")
            cid, col = base, bytes(got)
        out: list[bytes] = [] if base is None else cache[base]
        for cid, n, payload in reversed(chain):
            size = layout.DIGEST
            out = out[:n] + [payload[i : i + size] for i in range(0, len(payload), size)]
            cache[cid] = out
            cache.move_to_end(cid)
            while len(cache) > 64:
                cache.popitem(last=False)
        return out

    def blobs(self, session_id: str | None, digests: Sequence[bytes]) -> dict[bytes, str]:
        key = _key(session_id)
        if key != self._blob_session:
            self._blobs, self._blob_session = {}, key
        missing = list({h for h in digests if h not in self._blobs})
        for i in range(0, len(missing), 500):
            rows = self.conn.execute(
                select(Blob.digest, Blob.data).where(
                    Blob.session_id == key, Blob.digest.in_(missing[i : i + 500])
                )
            )
            for h, data in rows:
                self._blobs[bytes(h)] = bytes(data).decode("utf-8")
        return self._blobs

    # -- a whole call ----------------------------------------------------------------------------

    def bodies(
        self, c: Any, prompt: tuple[int, ...] | None, completion: tuple[int, ...] | None
    ) -> dict[str, Any]:
        """``request_text``, ``request``, ``upstream_request``, ``response``, ``events`` of row ``c``."""
        text = request = None
        if c.request_skel is not None:
            literals = layout.decompress(bytes(c.request_skel))
            refs = self.refs("request_refs", c.id, c.request_refs) if c.request_refs is not None else []
            text = layout.join_request(literals, refs, self.blobs(c.session_id, refs) if refs else {})
            request = orjson.loads(text)
        msgs = None
        if c.upstream_refs is not None:
            digests = self.refs("upstream_refs", c.id, c.upstream_refs)
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
