"""The recorder: hands finished calls from the event loop to a writer thread.

``submit`` is a synchronous ``put_nowait`` that cannot be interrupted by a client
disconnect or a cancellation, so a call is queued even when its handler is being torn
down. One writer thread drains the queue in batches (one transaction per batch) and
turns each ``Capture`` into a ``CallRecord`` there, so SSE parsing and reassembly never
run on the response path.

Durability (``--durability``):
- ``async`` (default): the record is written after the response; a database failure
  sends the batch to the local spool (fsync'd), replayed when the database is back.
  SIGTERM drains everything; ``kill -9`` loses the calls still queued (milliseconds' worth).
- ``wal``: the handler holds the client's last byte until the writer has appended the
  record to the spool and fsync'd it (``await durable(cap)``); the spool is cleared once
  the database commits. Guarantee: every call whose response the client fully received is
  in the database or the spool, even after ``kill -9``; cost: one fsync per batch on the
  response path.
The spool is replayed at start-up, and retried every ``retry_s`` while the database is down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from orchard_rec.proxy.capture import Capture
from orchard_rec.records import CallRecord
from orchard_rec.storage.spool import Spool
from orchard_rec.storage.store import Store

__all__ = ["Recorder"]

log = logging.getLogger("orchard_rec.recorder")
_STOP = object()


class Recorder:
    def __init__(
        self,
        store: Store,
        *,
        spool: Path | None = None,
        durability: str = "async",
        batch_size: int = 256,
        retry_s: float = 1.0,
        linger_s: float | None = None,
    ) -> None:
        if durability not in ("async", "wal"):
            raise ValueError("durability must be async or wal")
        if durability == "wal" and spool is None:
            raise ValueError("wal durability needs a spool path")
        self.store = store
        self.batch_size = batch_size
        self.retry_s = retry_s
        self.durability = durability
        if linger_s is None:
            linger_s = (
                float(os.environ.get("ORCHARD_WRITER_LINGER_S", "0.005")) if durability == "async" else 0.0
            )
        self.linger_s = linger_s
        """How long the writer lets a batch gather after its first call (async durability; env
        ``ORCHARD_WRITER_LINGER_S``, default 5 ms): one transaction and one wake-up per several calls
        instead of per call, at low concurrency too (SQLite, CPU per call: 88 us in batches of 8,
        42 us of 32, 33 us of 128; 20 ms measured no better than 5 ms end to end). Under wal the
        client waits for the batch, so there it is 0."""
        self.spool_path = spool
        self.spool: Spool | None = None
        self._q: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.write_errors = 0
        self.last_error: str | None = None
        self.spool_pending = False
        """The spool holds records the database has not committed."""
        self._closing = False
        self.inflight = 0
        """Calls whose handler has started but not yet submitted (event-loop thread only)."""
        self.nice = int(os.environ.get("ORCHARD_WRITER_NICE", "10") or 0)
        """The writer thread's OS niceness: when the cores are busy, the scheduler runs the event
        loop (and the model server, the harness) first and the writer in the gaps; the bounded
        queue absorbs the delay. 0 leaves it at the process's priority."""
        self.fault_write_delay = float(os.environ.get("ORCHARD_FAULT_WRITE_DELAY_S", "0") or 0)
        """Fault injection for benchmarks and tests: sleep this long before every database write."""

    @property
    def depth(self) -> int:
        """Calls submitted but not yet committed or spooled."""
        return self._q.unfinished_tasks

    @property
    def spool_depth(self) -> int:
        return self.spool.depth if self.spool is not None else 0

    @property
    def healthy(self) -> bool:
        return self.last_error is None and not self.spool_pending

    def start(self) -> None:
        if self.spool_path is not None:
            self.spool = Spool(self.spool_path)
            self.spool_pending = self.spool.depth > 0
        self._thread = threading.Thread(target=self._run, name="orchard-writer", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """A handler started a call; ``submit`` ends it."""
        self.inflight += 1

    def submit(self, item: Capture | CallRecord, ack: Any = None) -> None:
        self._q.put_nowait((item, ack))
        if isinstance(item, Capture):
            self.inflight -= 1

    async def durable(self, cap: Capture) -> None:
        """Submit ``cap`` and return once its record is fsync'd in the spool (wal durability)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def ack() -> None:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

        cap.submitted = True
        self.submit(cap, ack)
        await asyncio.shield(fut)

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until every call started so far is committed or spooled (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self.inflight or self._q.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def close(self, timeout: float = 60.0) -> None:
        if self._thread is None:
            return
        self._closing = True
        self._q.put_nowait((_STOP, None))
        self._thread.join(timeout)
        self._thread = None
        if self.spool is not None:
            self.spool.close()

    # -- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        if self.nice:
            try:  # Linux: a thread is a task with its own niceness
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):  # pragma: no cover - not Linux, or not permitted
                pass
        if self.spool_pending:
            self._replay()
        stop = False
        while not stop:
            try:
                first = self._q.get(timeout=self.retry_s if self.spool_pending else None)
            except queue.Empty:
                self._replay()
                continue
            if self.linger_s and not self._closing and first[0] is not _STOP:
                time.sleep(self.linger_s)  # sleeping releases the GIL; producers' puts wake no one meanwhile
            items = [first]
            while len(items) < self.batch_size:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            batch: list[CallRecord] = []
            acks = []
            for it, ack in items:
                if it is _STOP:
                    stop = True
                    continue
                try:
                    batch.append(it.to_record() if isinstance(it, Capture) else it)
                except Exception:  # a record we cannot build must not take the writer down
                    log.exception("could not build record for call %s", getattr(it, "call_id", "?"))
                if ack is not None:
                    acks.append(ack)
            try:
                self._write(batch, acks)
            finally:
                for _ in items:
                    self._q.task_done()
        if self.spool_pending:
            self._replay()

    def _write(self, batch: list[CallRecord], acks: list[Any]) -> None:
        if self.durability == "wal" and self.spool is not None:
            self.spool.append(batch)  # durable before any client gets its last byte
            for ack in acks:
                ack()
            if self.spool_pending:
                return  # the database is down: the replay loop will carry these
            if self._store(batch, first=True):
                self.spool.clear()
            return
        for ack in acks:
            ack()
        if self.spool_pending and self.spool is not None:
            self.spool.append(batch)  # keep order behind what is already waiting
            return
        if not self._store(batch, first=True) and self.spool is not None:
            self.spool.append(batch)
            self.spool_pending = True
        elif self.last_error is not None and self.spool is None:
            self._retry_in_memory(batch)

    def _store(self, batch: list[CallRecord], *, first: bool = False) -> bool:
        """``first``: this batch's first attempt, so none of it can be stored yet (skip the lookup);
        retries and replays check, so a write whose commit went through but failed to report
        stores each call once."""
        if not batch:
            return True
        try:
            if self.fault_write_delay:
                time.sleep(self.fault_write_delay)
            self.store.write_batch(batch, known_new=first)
        except Exception as exc:  # keep serving; the spool or a retry carries the records
            self.write_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("database write failed (%d calls), spooling: %s", len(batch), self.last_error)
            return False
        self.written += len(batch)
        self.last_error = None
        return True

    def _retry_in_memory(self, batch: list[CallRecord]) -> None:
        delay = 0.05
        while not self._store(batch):
            if self._closing and self.write_errors > 50:
                log.error("giving up on %d calls at shutdown (no spool configured)", len(batch))
                return
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _replay(self) -> None:
        if self.spool is None:
            return
        records = self.spool.records()
        for k in range(0, len(records), 500):
            if not self._store(records[k : k + 500]):
                self.spool_pending = True
                return
        self.spool.clear()
        self.spool_pending = False
        if records:
            log.info("replayed %d spooled calls into the database", len(records))
