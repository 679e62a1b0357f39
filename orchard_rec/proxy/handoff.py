"""What the event loop hands the recorder's database thread under ``process`` durability.

``Inline`` writes a small call's spool line on the event loop (``Recorder`` mixes it in),
``Handoff`` is the thread's queue (``Recorder._dbq``), ``Spooled`` a call it is handed as its spool
line alone (the writer process builds the record from the line). They exist to cut the event
loop's CPU per call (``bench/recpath.py``, ``bench/PROFILE.md`` rounds 9 and 14)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from orchard_rec.proxy import capline
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.dbthread import STOP as _STOP
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.records import CallRecord

if TYPE_CHECKING:
    from orchard_rec.proxy.dbproc import WriterProcess
    from orchard_rec.storage.spool import Spool

__all__ = ["Handoff", "Inline", "Spooled"]

log = logging.getLogger("orchard_rec.recorder")


class Inline:
    """``Recorder``'s part on the event loop under ``process`` durability; the attributes are the
    recorder's own."""

    spool: Spool | None
    proc: WriterProcess | None
    lines: capline.Encoder
    last_error: str | None
    inflight: int
    spooled_calls: int
    spooled_bytes: int
    _bytes_in: int
    _dbq_calls: int
    _dbq: Handoff
    _encoding: threading.Lock
    _count_lock: threading.Lock

    if TYPE_CHECKING:

        def _unencodable(self, cap: Capture) -> bytes | None: ...
        def _spool_batch(
            self, batch: list[Capture | CallRecord], acks: list[Any], db_acks: list[Any], nbytes: int
        ) -> None: ...

    def _write_inline(self, cap: Capture, size: int) -> None:
        """``process``: write a small call's line here, on the event loop (what the spool thread would
        do, without the two thread hand-offs on the client's wait); the database thread takes it on.
        With the writer process ready, the database thread gets the line alone (``Spooled``), not a copy."""
        cap.submitted = True
        self._bytes_in += size
        self.inflight -= 1
        proc = self.proc
        if proc is None or not proc.is_ready:
            self._spool_batch([capline.snapshot(cap)], [], [], size)
            return
        done = cap.done_at
        if done is None:  # as ``snapshot`` has it: the line's call ended now
            cap.done_at = time.time()
        try:
            self._spool_one(cap, size)
        finally:
            cap.done_at = done

    def _spool_one(self, cap: Capture, size: int) -> None:
        """``_spool_batch`` of one call whose line the writer process will take (``_write_inline``): its
        line appended (written, not fsync'd), handed on as that line alone (``Spooled``), or as a copy
        where it has none (set aside) or the spool refused it. The same lines and items, without the
        batch's lists."""
        spool = self.spool
        assert spool is not None
        with self._encoding:
            start = spool.end
            try:
                line: bytes | None = self.lines.encode(cap)  # ``_line``, one call less
            except Exception:  # never leave a call unspooled for a bug here: its whole record instead
                line = self._unencodable(cap)
            end: int | None = start
            if line is not None:
                try:
                    end = spool.append_line(line)  # in the kernel's hands before the client's last byte
                    self.spooled_calls += 1
                    self.spooled_bytes += len(line) + 1
                except Exception as exc:  # disk full, I/O error: keep serving, the database may still take it
                    self.last_error = f"spool append failed: {type(exc).__name__}: {exc}"[:500]
                    log.error("%s (%d calls go to the database unspooled)", self.last_error, 1)
                    self.lines.reset()  # what they were written against may not be on disk
                    end = None
            # not in the spool: a copy (its record needs no base from the database)
            item = (
                Spooled(cap.call_id, line, self)
                if line is not None and end is not None
                else capline.snapshot(cap)
            )
            with self._count_lock:
                self._dbq_calls += 1
            self._dbq.put_nowait(
                ([item], start, end, [], size, None if line is None else [line], time.monotonic())
            )


class Handoff(queue.SimpleQueue[Any]):
    """The database thread's queue (``Recorder._dbq``): ``queue.SimpleQueue`` (C, one lock; ~0.1 us
    a ``put`` from the event loop instead of ``queue.Queue``'s ~1.5); ``task_done`` is a no-op kept
    for ``queue.Queue``'s callers (nobody joins it; ``Recorder.depth`` counts the calls in it itself).

    ``poll`` (``process`` durability: ``db_linger_s``): a ``put`` does not wake the database thread;
    it looks for calls every ``poll`` seconds instead, which costs a batch no time (it lingers that
    long after its first call anyway, counted from the call's ``put``), and spares the event loop
    the wake-up (a futex call, and on a busy machine the woken thread taking its core while it
    holds the interpreter lock). After ``_IDLE_POLLS`` empty looks it sleeps until woken (an idle
    proxy does not wake 100 times a second); a ``put`` then wakes it, as does one that a client
    waits on (``committed``: its acks) or the end (``STOP``). 0: every ``put`` wakes it."""

    _IDLE_POLLS = 50

    def __init__(self) -> None:
        super().__init__()
        self.poll = 0.0
        self._asleep = True
        """The database thread waits for a ``put`` to wake it (``_wake``), not for its next look."""
        self._wake = threading.Event()
        self._put = super().put_nowait
        """``SimpleQueue.put_nowait``, bound once (``super()`` is an object made per call)."""

    def put_nowait(self, item: Any) -> None:
        self._put(item)
        if self.poll and (self._asleep or item is _STOP or item[3]):
            self._wake.set()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not self.poll or not block:
            return super().get(block, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        empty = 0
        while True:
            try:
                item = self.get_nowait()
            except queue.Empty:
                pass
            else:
                self._asleep = False
                return item
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._asleep = False
                raise queue.Empty
            empty += 1
            if empty > self._IDLE_POLLS and not self._asleep:
                self._asleep = True
                continue  # look once more: a put before the flag was seen did not wake
            wait = left if self._asleep else self.poll if left is None else min(self.poll, left)
            self._wake.wait(wait)
            self._wake.clear()

    def linger(self, seconds: float) -> None:
        """The database thread's wait for more calls to join a batch (``DatabaseThread._db_loop``):
        ``seconds``, or less when a ``put`` that a client waits on (``committed``: its acks) or the
        end (``STOP``) comes meanwhile; those join the batch at once rather than after the wait."""
        self._wake.wait(seconds)
        self._wake.clear()

    def task_done(self) -> None:
        pass


class Spooled(Capture):
    """A call the database thread knows by its spool line alone (``Recorder._write_inline`` with the
    writer process ready, which builds the record from the line): the thread holds none of the
    call's objects (its parsed request, bodies, headers), so they are freed on the event loop when
    the handler is done with them, not by the database thread later. Should the writer process not
    be ready for the batch after all (it died meanwhile), ``to_record`` decodes the line, as a replay
    does (``Recorder._record_of``): the same record."""

    __slots__ = ("line", "recorder")

    def __init__(self, call_id: str, line: bytes, recorder: Any) -> None:
        self.call_id = call_id
        self.line = line
        self.recorder = recorder

    def to_record(self, ids: IdParser | None = None) -> CallRecord:
        return self.recorder._record_of(self.line)
