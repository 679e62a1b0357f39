"""The local spool: an append-only log of calls, fsync'd per batch or in the background.

It holds what the database has not (yet) acknowledged: in ``async`` durability, the
batches a failed write could not store (record lines); in ``process`` (the default) and
``machine`` durability, every batch, written before any of its clients gets its last byte
(capture lines, below): ``machine`` fsyncs each append (``append_lines``), ``process`` only
writes it (``sync=False``: it survives the process's death, the kernel has it) and a background
thread calls ``sync`` (``unsynced_since`` / ``unsynced_age``: how long the oldest write not yet
on disk has waited; ``max_unsynced_age``: the longest any did).
Records are replayed with ``Store.write_batch``, which is idempotent by call id, so a replay
that is interrupted and repeated stores each call exactly once. One process owns a spool (an exclusive ``flock``
on its file); the files survive ``kill -9`` and are replayed at the next start.

Layout and rules:
- Each appended record gets an index (0, 1, 2, ... for this process's lifetime). The
  database side acknowledges a prefix (``ack(upto)``: every record below ``upto`` is in the
  database). Nothing is deleted before it is acknowledged: the spool is the truth until
  then. When everything appended is acknowledged the files are truncated (no fsync needed:
  a truncation lost to a crash only replays stored records, which the idempotent write skips).
- Records live in segments: the spool file itself (``PATH``), then ``PATH.1``, ``PATH.2``...
  A segment that grows past ``segment_bytes`` while unacknowledged records remain is closed
  and a new one started, so a database that is always a batch behind (a pipeline) never makes
  the spool grow without limit: closed segments are deleted once acknowledged.
- The segment being written keeps ``preallocate`` bytes of zeros ahead of its last line, written
  once and then overwritten in place, so the ``fdatasync`` of an append flushes the data alone
  instead of also journaling a size change (``bench/spool_latency.py``). Zeros are the end: a
  spool line never holds a NUL byte (JSON escapes it), so nothing from the first NUL on is read
  as a line; a torn append (a crash before its fdatasync returned) leaves non-zero bytes there,
  set aside like any torn tail. Once everything is acknowledged, the next append zeroes the
  lines before it and starts again at the front (one fdatasync covers both; a crash before it
  only replays stored records, as a lost truncation does). A clean ``close`` trims the zeros, so
  the files stay what earlier builds read.
- A failed append (a write cut short, a failed fsync) leaves the file and the counts as they
  were: what it wrote is cut off again, so the next append's lines get the indexes it returns.
- Every line is one JSON object with a format version ``"_v"`` (``FORMAT``). Lines written
  before versioning (no ``"_v"``) are read as version 0 (the same fields). Version 2 holds each
  token id array once: an id array of the response (or of an event) equal to the record's
  ``prompt_ids`` / ``completion_ids`` is written as ``null`` and listed in ``"_ids"``
  (``[event index or -1, path, "p"|"c"]``), put back as a list when read (a 150k-token answer's
  line: ~1 MB less). Version 3 adds *capture lines* (``"_k": "cap"``), what ``wal`` durability
  writes: a call's raw material with what it repeats of earlier calls of its session written as
  references to them (``proxy.capline``; at a 150k-token context tens of kB instead of ~1.8 MB).
  This module stores and hands back lines; capture lines are decoded by the caller's ``decode``
  (``pending(decode)``: storage does not import the proxy), record lines by ``record_from_json``
  (version 3 record lines are version 2's). A build older than version 3 meets a version 3 line
  as "written by a newer version" and sets it aside (below), as it always did. A line that
  cannot be decoded (corrupt, torn by a crash, written by a newer version, a field this
  version does not know, a capture line whose base is in neither the spool nor the database)
  is never dropped: it is moved to ``PATH.rejected`` (fsync'd), counted in ``rejected``, and
  logged; only then may the records around it be cleared.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from orchard_rec.records import CallOutcome, CallRecord, Dialect

__all__ = [
    "CAPTURE",
    "FORMAT",
    "Spool",
    "SpoolFormatError",
    "json_default",
    "load_line",
    "record_from_dict",
    "record_from_json",
    "record_to_json",
]

log = logging.getLogger("orchard_rec.spool")

FORMAT = 3
"""The spool line format written by this version (``"_v"`` in every line)."""
CAPTURE = "cap"
"""``"_k"`` of a capture line."""


class SpoolFormatError(ValueError):
    """A spool line this version cannot turn into a ``CallRecord``."""


def record_to_json(r: CallRecord) -> bytes:
    d: dict[str, Any] = {"_v": FORMAT}
    d.update({f: getattr(r, f) for f in r.__dataclass_fields__})
    d["dialect"] = r.dialect.value
    d["outcome"] = r.outcome.value
    d["headers"] = dict(r.headers)
    for k in ("prompt_ids", "completion_ids"):
        v = d[k]
        if v is not None and type(v) is not tuple:  # ``delta.Ids``: orjson takes exact tuples only
            d[k] = tuple(v)
    if r.prompt_ids is not None or r.completion_ids is not None:
        shed: list[Any] = []
        d["response"] = _shed(r.response, -1, r.prompt_ids, r.completion_ids, shed)
        if r.events:
            d["events"] = [
                [e[0], _shed(e[1], k, r.prompt_ids, r.completion_ids, shed)]
                if isinstance(e, list) and len(e) == 2
                else e
                for k, e in enumerate(r.events)
            ]
        if shed:
            d["_ids"] = shed
    return orjson.dumps(d, default=json_default)


_ID_PATHS: tuple[tuple[tuple[Any, ...], str], ...] = (
    (("prompt_token_ids",), "p"),
    (("choices", 0, "prompt_token_ids"), "p"),
    (("choices", 0, "token_ids"), "c"),
)


def _shed(obj: Any, where: int, prompt: Any, completion: Any, out: list[Any]) -> Any:
    """``obj`` with the id arrays (vLLM's places) that equal the record's ids set to None
    (copied where changed, never mutated), each noted in ``out``."""
    if not isinstance(obj, dict):
        return obj
    for path, which in _ID_PATHS:
        ids = prompt if which == "p" else completion
        if ids is None:
            continue
        node: Any = obj
        for step in path[:-1]:
            if isinstance(step, int):
                node = node[step] if isinstance(node, list) and len(node) > step else None
            else:
                node = node.get(step) if isinstance(node, dict) else None
        v = node.get(path[-1]) if isinstance(node, dict) else None
        if not (v is ids or (isinstance(v, list) and len(v) == len(ids) and v == list(ids))):
            continue
        if obj is not None and len(path) == 1:
            obj = {**obj, path[0]: None}
        else:
            choices = list(obj["choices"])
            choices[0] = {**choices[0], path[-1]: None}
            obj = {**obj, "choices": choices}
        out.append([where, list(path), which])
    return obj


def _unshed(d: dict[str, Any], shed: Any) -> None:
    """Undo ``_shed`` on a decoded line (``prompt_ids`` etc. still lists)."""
    if not isinstance(shed, list):
        raise SpoolFormatError("_ids is not a list")
    for where, path, which in shed:
        ids = d.get("prompt_ids" if which == "p" else "completion_ids")
        node = d["response"] if where == -1 else d["events"][where][1]
        for step in path[:-1]:
            node = node[step]
        if ids is None or node.get(path[-1], 0) is not None:
            raise SpoolFormatError(f"_ids names {path} of {where}, which holds no shed ids")
        node[path[-1]] = list(ids)


def json_default(v: Any) -> Any:
    """``default`` for ``orjson.dumps`` of records and capture lines."""
    if isinstance(v, tuple):  # a tuple subclass: orjson takes exact tuples only
        return list(v)
    tolist = getattr(v, "tolist", None)  # a ``delta.Ids`` (tito's prompt in an upstream body)
    if tolist is not None:
        return tolist()
    raise TypeError(f"Type is not JSON serializable: {type(v).__name__}")


def load_line(line: bytes) -> dict[str, Any]:
    """A spool line's JSON object, its version checked; raises ``SpoolFormatError``."""
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise SpoolFormatError(f"not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise SpoolFormatError("not a JSON object")
    version = d.get("_v", 0)
    if version not in (0, 1, 2, FORMAT):
        raise SpoolFormatError(f"spool format version {version!r}; this version reads 0 to {FORMAT}")
    return d


def record_from_json(line: bytes) -> CallRecord:
    """Decode one spool record line; raises ``SpoolFormatError`` for anything it cannot read
    faithfully (a capture line too: ``proxy.capline`` decodes those)."""
    return record_from_dict(load_line(line))


def record_from_dict(d: dict[str, Any]) -> CallRecord:
    """``record_from_json`` of a line ``load_line`` read already (changes ``d``)."""
    version = d.pop("_v", 0)
    if d.get("_k") == CAPTURE:
        raise SpoolFormatError("a capture line: only the proxy's replay decodes it (proxy.capline)")
    shed = d.pop("_ids", None) if version >= 2 else None
    unknown = set(d) - set(CallRecord.__dataclass_fields__)
    if unknown:  # a renamed or new field: decoding would drop data silently
        raise SpoolFormatError(f"unknown fields {sorted(unknown)}")
    try:
        if shed is not None:
            _unshed(d, shed)
        d["dialect"] = Dialect(d["dialect"])
        d["outcome"] = CallOutcome(d["outcome"])
        for k in ("prompt_ids", "completion_ids", "completion_logprobs"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return CallRecord(**d)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise SpoolFormatError(f"{type(exc).__name__}: {exc}") from None


@dataclass
class _Segment:
    path: Path
    f: IO[bytes]
    start: int
    """Index of its first record."""
    count: int = 0
    size: int = 0
    """Bytes of its lines (the first ``count`` lines, each ending in a newline)."""
    room: int = 0
    """The file's length: ``[size, room)`` holds zeros."""
    stale: bool = False
    """``[0, size)`` holds acknowledged lines the next append zeroes (``count`` is 0)."""


def _open(path: Path) -> IO[bytes]:
    """A segment file, read-write, created if missing; not ``O_APPEND`` (``pwrite`` at offsets)."""
    return os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o666), "rb+")


def _pwrite_all(fd: int, data: bytes, pos: int) -> None:
    n = os.pwrite(fd, data, pos)
    if n == len(data):  # all of it, as a regular file takes a write but for a full disk or a signal
        return
    view = memoryview(data)[n:]
    pos += n
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


def _sync(fd: int) -> None:
    """``fdatasync`` where there is one (Linux): an append's data and the file's length, not its times."""
    getattr(os, "fdatasync", os.fsync)(fd)


class Spool:
    def __init__(
        self,
        path: Path,
        *,
        segment_bytes: int = 64 * 1024 * 1024,
        preallocate: int = 1 << 20,
        keep_bytes: int = 0,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rejected_path = self.path.with_name(self.path.name + ".rejected")
        self.segment_bytes = segment_bytes
        self.preallocate = preallocate
        """Bytes of zeros kept ahead of the last line of the segment being written (0: plain
        appends, each growing the file)."""
        self.keep_bytes = keep_bytes
        """With no zeros ahead: a single segment of at most this many bytes is not cut when everything
        in it is acknowledged; appends go on after its lines, and it is cut once it holds more (a
        truncation per call cost the database thread a journaled ``ftruncate``, and held the file's
        lock against the event loop's next ``write``). A crash then replays those acknowledged lines,
        which the idempotent write skips, as it does after a truncation a crash lost."""
        self._lock = threading.Lock()
        lock_f = _open(self.path)  # held for the spool's lifetime
        try:
            fcntl.flock(lock_f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_f.close()
            raise RuntimeError(
                f"spool {self.path} is in use by another proxy process; give each replica its own --spool"
            ) from None
        self.rejected = 0
        """Lines moved aside to ``rejected_path`` by this process."""
        self.last_rejection: str | None = None
        self._segments: list[_Segment] = [_Segment(self.path, lock_f, 0)]
        stem = len(self.path.name) + 1  # ``PATH.1`` is a segment; ``PATH.w0.1`` is another spool's
        extra = sorted(
            (int(p.name[stem:]), p)
            for p in self.path.parent.glob(self.path.name + ".*")
            if p.name[stem:].isdigit()
        )
        for _, p in extra:
            self._segments.append(_Segment(p, _open(p), 0))
        start = 0
        for seg in self._segments:
            seg.start = start
            self._scan(seg)
            start += seg.count
        self.end = start
        """Index one past the last record appended."""
        self.acked = 0
        """Every record below this index is in the database."""
        self._aside: set[int] = set()
        """Indexes of the lines moved aside by this process (a replay pass meets them again)."""
        self.synced = self.end
        """Every record below this index has been fsync'd (what a power loss cannot take)."""
        self.fsyncs = 0
        """``fdatasync`` calls of appends and of ``sync`` so far."""
        self.unsynced_since: float | None = None
        """``time.monotonic()`` of the oldest append no fsync has started to cover (None: none)."""
        self._syncing_since: float | None = None
        """``unsynced_since`` as the running ``sync`` took it over (None: none runs): its appends
        are not on disk before that fsync returns."""
        self.sync_log: list[tuple[float, float]] = []
        """The last 64 fsyncs of ``sync``: ``(how long its oldest write had waited when it started,
        how long it took)``, seconds: what the caller's schedule controls, and what the device adds."""
        self.max_unsynced_age = 0.0
        """The longest an append has waited for the fsync that covered it so far (seconds)."""
        self._dirty: list[_Segment] = []
        """Segments written since their last fsync."""
        self._dir_dirty = False
        """A segment was created since the folder's last fsync (its name must survive a crash)."""

    def _scan(self, seg: _Segment) -> None:
        """Count a segment's complete lines, up to its zeros (if any); a torn tail (a crash
        mid-append, never acknowledged) is moved aside and cut off, so the next append does not
        glue a record onto it."""
        seg.f.seek(0)
        data = seg.f.read()
        zero = data.find(b"\0")
        cut = data.rfind(b"\n", 0, len(data) if zero < 0 else zero) + 1
        torn = data[cut:].strip(b"\0")
        if torn:
            self._reject([torn], f"torn line at the end of {seg.path.name} (a crash mid-append)")
            seg.f.truncate(cut)
            seg.f.flush()
            os.fsync(seg.f.fileno())
        seg.count = data.count(b"\n", 0, cut)
        seg.size = cut
        seg.room = cut if torn else len(data)

    @property
    def depth(self) -> int:
        """Records in the spool the database has not acknowledged."""
        return self.end - self.acked

    def append(self, records: Sequence[CallRecord]) -> int:
        """Append and fsync: when this returns, the records survive a crash. Returns ``end``:
        the index one past the last of them (what ``ack`` takes once the database has them)."""
        return self.append_lines([record_to_json(r) for r in records])

    def append_lines(self, lines: Sequence[bytes], *, sync: bool = True) -> int:
        """``append`` of lines encoded already (each one JSON object, no newline). When it raises,
        nothing of them stays in the spool. ``sync=False``: written (``pwrite``) but not fsync'd:
        they survive the death of this process (the kernel has them), not a machine crash, until
        ``sync`` covers them (``unsynced_since`` says since when they wait)."""
        if not lines:
            return self.end
        data = lines[0] + b"\n" if len(lines) == 1 else b"\n".join(lines) + b"\n"
        with self._lock:
            seg = self._segments[-1]
            if self.acked == self.end and (seg.size > self._keep(seg) or len(self._segments) > 1):
                self._truncate_all()
                seg = self._segments[-1]
            elif seg.size > self.segment_bytes:
                seg = self._rotate()
            fd = seg.f.fileno()
            pos, n = (0 if seg.stale else seg.size), len(data)
            try:
                if seg.stale:  # acknowledged lines there: zeroed, durable with this append
                    _pwrite_all(fd, data + bytes(max(0, seg.size - n)), 0)
                else:
                    _pwrite_all(fd, data, pos)
                if self.preallocate and pos + n > seg.room:
                    _pwrite_all(fd, bytes(self.preallocate), pos + n)
                    seg.room = pos + n + self.preallocate
                if sync:
                    self._sync_dir()
                    for other in self._open_dirty():
                        if other is not seg:
                            _sync(other.f.fileno())
                    _sync(fd)
            except BaseException:
                self._cut(seg, pos)
                raise
            seg.room = max(seg.room, pos + n)
            seg.stale = False
            seg.count += len(lines)
            seg.size = pos + n
            self.end += len(lines)
            if sync:
                self.fsyncs += 1
                self._synced_upto(self.end, time.monotonic())
            else:
                if self.unsynced_since is None:
                    self.unsynced_since = time.monotonic()
                if seg not in self._dirty:
                    self._dirty.append(seg)
            return self.end

    def append_line(self, line: bytes) -> int:
        """``append_lines([line], sync=False)`` (the event loop's write of one call, ``process``
        durability) without the list's work: one ``pwrite`` at the end of the segment being written.
        Anything else to do first (truncate what is acknowledged, rotate, zero stale lines, zeros kept
        ahead) goes the general way."""
        data = line + b"\n"
        with self._lock:
            seg = self._segments[-1]
            pos = seg.size
            if not (
                seg.stale
                or self.preallocate
                or pos > self.segment_bytes
                or (self.acked == self.end and (pos > self._keep(seg) or len(self._segments) > 1))
            ):
                n = pos + len(data)
                try:
                    fd = seg.f.fileno()
                    if os.pwrite(fd, data, pos) != len(data):  # a full disk, a signal: the rest, or its error
                        _pwrite_all(fd, data, pos)
                except BaseException:
                    self._cut(seg, pos)
                    raise
                if seg.room < n:
                    seg.room = n
                seg.count += 1
                seg.size = n
                self.end += 1
                if self.unsynced_since is None:
                    self.unsynced_since = time.monotonic()
                if seg not in self._dirty:
                    self._dirty.append(seg)
                return self.end
        return self.append_lines((line,), sync=False)

    def _synced_upto(self, end: int, now: float) -> None:
        """Everything below ``end`` is fsync'd (the lock held); so is all written, when ``end`` is ``self.end``."""
        self.synced = max(self.synced, end)
        if self.unsynced_since is not None and end == self.end:
            self.max_unsynced_age = max(self.max_unsynced_age, now - self.unsynced_since)
            self.unsynced_since = None
            self._dirty.clear()

    def _open_dirty(self) -> list[_Segment]:
        """The dirty segments still open (an acknowledged one may have been closed since)."""
        return [d for d in self._dirty if any(d is x for x in self._segments)]

    @property
    def unsynced_age(self) -> float:
        """Seconds the oldest append not yet fsync'd has waited (0: everything is)."""
        since = self._syncing_since
        if since is None:
            since = self.unsynced_since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    def sync(self) -> bool:
        """fsync whatever ``append_lines(sync=False)`` wrote so far (the background fsync); appends
        go on meanwhile (the lock is not held during the flush). False when there was nothing to do."""
        with self._lock:
            since = self.unsynced_since
            if since is None and not self._dir_dirty:
                return False
            end = self.end
            fds = [os.dup(seg.f.fileno()) for seg in self._open_dirty()]  # valid if it is closed meanwhile
            self._dirty = []
            self._syncing_since, self.unsynced_since = since, None
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        t = time.monotonic()
        try:
            if dir_dirty:
                self._fsync_dir()
            for fd in fds:
                _sync(fd)
        except BaseException:
            with self._lock:  # not covered: the next sync tries again
                self._syncing_since = None
                self._dir_dirty = self._dir_dirty or dir_dirty
                if since is not None:
                    self.unsynced_since = min(since, self.unsynced_since or since)
                    self._dirty = list(self._segments)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        now = time.monotonic()
        with self._lock:
            self._syncing_since = None
            self.sync_log = [*self.sync_log[-63:], (0.0 if since is None else t - since, now - t)]
            self.fsyncs += 1
            self.synced = max(self.synced, end)
            if since is not None:
                self.max_unsynced_age = max(self.max_unsynced_age, now - since)
        return True

    def _keep(self, seg: _Segment) -> int:
        """Bytes of acknowledged lines ``seg`` may keep rather than be cut (``keep_bytes``)."""
        return self.keep_bytes if seg.room <= seg.size else 0

    def _cut(self, seg: _Segment, pos: int) -> None:
        """After an append at ``pos`` failed: the file ends at ``pos`` again (the append may have
        written anything from nothing to all of its lines and zeros)."""
        try:
            os.ftruncate(seg.f.fileno(), pos)
        except OSError:  # pragma: no cover - the next append at pos overwrites it
            log.exception("spool %s: could not cut a failed append off", seg.path)
        seg.room = pos
        if seg.stale:  # the acknowledged lines are cut off too
            seg.stale = False
            seg.size = 0

    def _rotate(self) -> _Segment:
        last = self._segments[-1]
        n = int(last.path.name.rsplit(".", 1)[1]) + 1 if last.path != self.path else 1
        p = self.path.with_name(f"{self.path.name}.{n}")
        seg = _Segment(p, _open(p), self.end)
        self._segments.append(seg)
        self._dir_dirty = True  # the new file's name must survive a crash along with its records
        return seg

    def _sync_dir(self) -> None:
        if self._dir_dirty:
            self._fsync_dir()
            self._dir_dirty = False

    def _fsync_dir(self) -> None:
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _truncate_all(self) -> None:
        """Everything is acknowledged: drop the lines. A single segment with zeros ahead keeps its
        file (the next append zeroes the lines and writes at the front); else files are cut."""
        first = self._segments[0]
        if len(self._segments) == 1 and first.room > first.size:
            first.start, first.count, first.stale = self.end, 0, first.size > 0
            return
        for seg in self._segments[1:]:
            seg.f.close()
            seg.path.unlink(missing_ok=True)
        first.f.truncate(0)
        first.f.flush()
        first.start, first.count, first.size, first.room, first.stale = self.end, 0, 0, 0, False
        del self._segments[1:]

    def ack(self, upto: int) -> None:
        """The database holds every record below index ``upto``."""
        with self._lock:
            if upto <= self.acked:
                return
            self.acked = min(upto, self.end)
            if self.acked == self.end:
                if len(self._segments) > 1 or self._segments[0].size > self._keep(self._segments[0]):
                    self._truncate_all()
                return
            for seg in list(self._segments[:-1]):  # closed segments wholly acknowledged go
                if seg.count == 0 or seg.start + seg.count > self.acked:
                    continue
                if seg.path == self.path:  # the lock file stays, emptied
                    seg.f.truncate(0)
                    seg.f.flush()
                    seg.count = seg.size = seg.room = 0
                    seg.stale = False
                else:
                    seg.f.close()
                    seg.path.unlink(missing_ok=True)
                    self._segments.remove(seg)

    def lines(self) -> tuple[list[tuple[int, bytes]], int]:
        """``(lines not yet acknowledged, end)``: ``(index, line)`` from ``acked`` up to ``end``, in
        order, undecoded (the caller decodes them without holding up appends)."""
        with self._lock:
            end = self.end
            lines: list[tuple[int, bytes]] = []
            for seg in self._segments:
                if seg.start + seg.count <= self.acked or seg.count == 0:
                    continue
                data = os.pread(seg.f.fileno(), seg.size, 0)  # its lines; not the zeros after
                for k, line in enumerate(data.split(b"\n")[:-1]):
                    idx = seg.start + k
                    if idx >= end:
                        break
                    if idx >= self.acked:
                        lines.append((idx, line + b"\n"))
            return lines, end

    def set_aside(self, idx: int, line: bytes, reason: str) -> None:
        """Line ``idx`` cannot be decoded: move it to ``rejected_path`` (once; a later pass that
        meets it again only skips it), so that acknowledging past it loses nothing."""
        if idx in self._aside:
            return
        self._aside.add(idx)
        self._reject([line], reason)

    def pending(
        self, decode: Callable[[bytes], CallRecord] = record_from_json
    ) -> tuple[list[CallRecord], int]:
        """``(records not yet acknowledged, end)``: decodable records from ``acked`` up to
        ``end``, in order; ``ack(end)`` once the database has them. Lines that cannot be decoded
        are moved to ``rejected_path`` first (so acknowledging past them loses nothing)."""
        lines, end = self.lines()
        out: list[CallRecord] = []
        for idx, line in lines:
            try:
                out.append(decode(line))
            except SpoolFormatError as exc:
                self.set_aside(idx, line, str(exc))
        return out, end

    def _reject(self, lines: list[bytes], reason: str) -> None:
        with open(self.rejected_path, "ab") as f:
            for line in lines:
                f.write(line if line.endswith(b"\n") else line + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self.rejected += len(lines)
        self.last_rejection = reason
        log.error(
            "spool %s: %d line(s) could not be decoded (%s); moved to %s, not replayed",
            self.path,
            len(lines),
            reason,
            self.rejected_path,
        )

    def records(self) -> list[CallRecord]:
        """The decodable records not yet acknowledged (tests, tools)."""
        return self.pending()[0]

    def clear(self) -> None:
        """Acknowledge everything appended so far (the database has it all)."""
        self.ack(self.end)

    def close(self) -> None:
        """Release the files: what is acknowledged is cut off, and the zeros after the last line
        (the files earlier builds wrote)."""
        with self._lock:
            last = self._segments[-1]
            try:
                if self.acked == self.end and len(self._segments) == 1:
                    last.f.truncate(0)
                elif last.room > last.size:
                    last.f.truncate(last.size)
            except OSError:  # pragma: no cover - zeros read as the end anyway
                log.exception("spool %s: could not trim it at close", last.path)
            for seg in self._segments[1:]:
                seg.f.close()
            first = self._segments[0].f
            try:
                fcntl.flock(first.fileno(), fcntl.LOCK_UN)
            finally:
                first.close()
