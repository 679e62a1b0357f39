"""The recorder's database thread under ``process`` and ``machine`` durability (``Recorder`` mixes
it in): it takes the spooled batches off ``Recorder._dbq`` in the spool's order, gathers the
batches that follow one another into one (``process`` hands calls over one by one), builds their
records and stores them (here, or in the writer process, ``proxy.dbproc``), and acknowledges them
in the spool; a failure leaves them there for a replay (``Recorder._replay``)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from orchard_rec.proxy import capline
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.dbproc import Result, WriterDied, WriterProcess
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.records import CallRecord
from orchard_rec.settings import Settings
from orchard_rec.storage.spool import Spool
from orchard_rec.storage.store import Store

if TYPE_CHECKING:
    from orchard_rec.proxy.handoff import Handoff  # (it imports ``STOP`` from here)

__all__ = ["STOP", "DatabaseThread"]

log = logging.getLogger("orchard_rec.recorder")
STOP = object()
"""Ends the writer threads' queues."""


class DatabaseThread:
    """``Recorder``'s database-thread methods; the attributes are the recorder's own."""

    spool: Spool | None
    proc: WriterProcess | None
    store: Store
    writer: str
    durability: str
    spool_pending: bool
    retry_s: float
    db_delay_s: float
    db_linger_s: float
    knobs: Settings
    batch_size: int
    batch_bytes: int
    written: int
    write_errors: int
    last_error: str | None
    lines: capline.Encoder
    ids: IdParser
    _closing: bool
    _dbq: Handoff
    _encoding: threading.Lock

    if TYPE_CHECKING:

        def _replay(self) -> None: ...
        def _store(self, batch: list[CallRecord], *, first: bool = False) -> bool: ...
        def _retry_in_memory(self, batch: list[CallRecord]) -> None: ...
        def _release(self, nbytes: int, ncalls: int = 0) -> None: ...
        def _lower_priority(self) -> None: ...

    def _db_run(self) -> None:
        if self.writer == "process":
            self.proc = WriterProcess(
                self.store.url, access_log=bool(getattr(self.store, "logs_access", False))
            )
            self.proc.start()  # from this thread: the child dies with it (``PR_SET_PDEATHSIG``); if it
            # cannot start, batches are written in-thread and ``ready`` tries again now and then
        else:
            self._lower_priority()
        try:
            self._db_loop()
        finally:
            if self.proc is not None:
                self.proc.close()

    def _db_loop(self) -> None:
        assert self.spool is not None
        if self.spool_pending:
            self._replay()
        # the next replay's time while the spool holds what the database has not taken, checked
        # between batches too: a steady stream of calls must not put it off
        due = time.monotonic() + self.retry_s
        carry: Any = None
        """An item taken while gathering a batch that could not join it: the next one."""
        linger_s = self.db_linger_s
        """How long the next batch lingers (``process``): ``_next_linger``."""
        self._linger_max_s = max(self.knobs.db_linger_max_s, self.db_linger_s)
        while True:
            if self.spool_pending and time.monotonic() >= due:
                self._replay()
                due = time.monotonic() + self.retry_s
            timeout = max(0.0, due - time.monotonic()) if self.spool_pending else None
            if self.proc is not None and not self.proc.is_ready:  # ask it again soon
                timeout = 0.05 if timeout is None else min(timeout, 0.05)
            if carry is not None:
                item, carry = carry, None
            else:
                try:
                    item = self._dbq.get(timeout=timeout)
                except queue.Empty:
                    if self.proc is not None and not self.proc.is_ready:
                        self.proc.ready()
                    continue
            if item is STOP:
                break
            if not item[3] and not self._closing:
                if self.durability == "process":
                    linger = linger_s - (time.monotonic() - item[6])
                    if linger > 0:  # more calls join the batch meanwhile; one a client waits on ends it
                        self._dbq.linger(linger)
                elif self.db_delay_s and self.proc is None and self._dbq.empty():
                    # the clients of this batch are being answered on the event loop right now: let it
                    # finish before this thread takes the GIL for the records (sleeping releases it)
                    time.sleep(self.db_delay_s)
            item, carry = self._gather(item)
            batch, start, end, db_acks, nbytes, lines, _ = item
            linger_s = self._next_linger(linger_s, len(batch), nbytes)
            was_pending = self.spool_pending
            try:
                if end is None:  # not in the spool: the database is its only way
                    records = self._records(batch)
                    if not self._store(records, first=True):
                        self._retry_in_memory(records)
                elif end <= self.spool.acked or self.spool_pending:
                    pass  # stored by a replay already, or the next replay carries it from the spool
                else:
                    built, ok = self._build_and_store(batch, lines, first=start >= self.spool.acked)
                    if built < len(batch):
                        # a call whose record cannot be built: its line may be a base of later lines,
                        # so the spool keeps it (a replay sets it aside, decoding those against it),
                        # and no line written from now on uses it as a base
                        with self._encoding:
                            self.lines.reset()
                        self.spool_pending = True
                    elif ok:
                        self.spool.ack(end)
                    else:
                        self.spool_pending = True  # the spool keeps it, and everything after it
            except Exception as exc:  # e.g. ``ack`` failed: the spool keeps the batch, a replay stores it
                self.last_error = f"database thread: {type(exc).__name__}: {exc}"[:500]
                log.exception("database thread: a batch of %d calls failed", len(batch))
                self.spool_pending = self.spool_pending or end is not None
            finally:
                for ack in db_acks:
                    ack()
                self._release(nbytes, len(batch))
            if self.spool_pending and not was_pending:
                due = time.monotonic() + self.retry_s  # the first retry: a full interval after a failure
        if self.spool_pending:
            self._replay()

    _linger_max_s = 0.0
    """``ORCHARD_DB_LINGER_MAX_S`` (not below ``db_linger_s``)."""
    _FULL_BATCH = 16
    """Calls in a batch at which the next one lingers longer (``_next_linger``)."""

    def _next_linger(self, linger_s: float, ncalls: int, nbytes: int = 0) -> float:
        """The next batch's linger (``process``) after one of ``ncalls`` calls (``nbytes``) that
        lingered ``linger_s``: twice as long (up to ``ORCHARD_DB_LINGER_MAX_S``) while calls keep
        coming (the batch held ``_FULL_BATCH`` calls or more, and less than a quarter of
        ``batch_bytes``: what waits in the queue stays well below the pacing bound), else back to
        ``db_linger_s``. The writer process spends ~235 us of fixed cost per batch (the pipe round
        trip, the transaction, per-batch Python): under load bigger batches amortize it (``bench/PROFILE.md`` round 12); a trickle of calls
        is stored as soon as before. Records are durable in the spool meanwhile; a call a client
        waits on (acks: ``committed`` token-in/token-out calls) does not linger; an outcome for a
        session not in the database yet (``Recorder.flush``) waits up to the linger."""
        if ncalls >= self._FULL_BATCH and nbytes < self.batch_bytes // 4:
            return min(max(linger_s, self.db_linger_s) * 2, self._linger_max_s)
        return self.db_linger_s

    def _gather(self, item: Any) -> tuple[Any, Any]:
        """``(item, the next item if one was taken that could not join)``:
        ``item`` joined by the queued items that follow it in the spool (``process`` hands the calls
        written on the event loop over one by one), up to ``batch_size`` calls and ``batch_bytes``.
        (The queue is the recorder's ``Handoff``, a ``SimpleQueue``: nothing to peek at, so an item
        that cannot join is carried to the next round.)"""
        batch, start, end, db_acks, nbytes, lines, _ = item
        if end is None:
            return item, None
        get = self._dbq.get_nowait
        while len(batch) < self.batch_size and nbytes < self.batch_bytes:
            try:
                nxt = get()
            except queue.Empty:
                break
            if nxt is STOP or nxt[2] is None or nxt[1] != end:
                return (batch, start, end, db_acks, nbytes, lines, 0.0), nxt
            if batch is item[0]:
                batch, db_acks = list(batch), list(db_acks)
                lines = None if lines is None else list(lines)
            batch.extend(nxt[0])
            db_acks.extend(nxt[3])
            nbytes += nxt[4]
            if lines is not None:  # (a copy of the first item's, made above)
                if nxt[5] is None:
                    lines = None
                else:
                    lines.extend(nxt[5])
            end = nxt[2]
        return (batch, start, end, db_acks, nbytes, lines, 0.0), None

    def _build_and_store(
        self, batch: list[Capture | CallRecord], lines: list[bytes] | None, *, first: bool
    ) -> tuple[int, bool]:
        """wal: build and store a spooled batch's records, in the writer process when it is ready
        (from the batch's spool lines) or here: ``(records built, the database took them)``."""
        if self.proc is None or not lines or not self.proc.ready():
            records = self._records(batch)
            return len(records), self._store(records, first=first)
        try:
            got = self.proc.write(lines, first=first)
        except WriterDied as exc:
            got = Result(len(lines), False, str(exc))
        if got.ok:
            self.written += got.built
            self.last_error = None
        else:
            self.write_errors += 1
            self.last_error = (got.error or "the database writer process failed")[:500]
            log.warning("database write failed (%d calls), spooling: %s", len(lines), self.last_error)
        return got.built, got.ok

    def _records(self, batch: list[Capture | CallRecord]) -> list[CallRecord]:
        out: list[CallRecord] = []
        for it in batch:
            try:
                out.append(it.to_record(self.ids) if isinstance(it, Capture) else it)
            except Exception:  # a record we cannot build must not take the writer down
                log.exception("could not build record for call %s", it.call_id)
        return out
