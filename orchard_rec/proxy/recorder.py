"""The recorder: hands finished calls from the event loop to a writer thread.

``submit`` is a synchronous ``put_nowait`` that cannot be interrupted by a client
disconnect or a cancellation, so a call is queued even when its handler is being torn
down. One writer thread drains the queue in batches (one transaction per batch) and
turns each ``Capture`` into a ``CallRecord`` there, so SSE parsing and reassembly never
run on the response path. A failed write is retried with backoff; ``close`` drains
the queue before returning, which is what makes SIGTERM lose nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from orchard_rec.proxy.capture import Capture
from orchard_rec.records import CallRecord
from orchard_rec.storage.store import Store

__all__ = ["Recorder"]

log = logging.getLogger("orchard_rec.recorder")
_STOP = object()


class Recorder:
    def __init__(self, store: Store, *, batch_size: int = 256) -> None:
        self.store = store
        self.batch_size = batch_size
        self._q: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.written = 0
        self.write_errors = 0
        self.last_error: str | None = None
        self._closing = False
        self.inflight = 0
        """Calls whose handler has started but not yet submitted (event-loop thread only)."""

    @property
    def depth(self) -> int:
        """Calls submitted but not yet committed."""
        return self._q.unfinished_tasks

    @property
    def healthy(self) -> bool:
        return self.last_error is None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="orchard-writer", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        """A handler started a call; ``submit`` ends it."""
        self.inflight += 1

    def submit(self, item: Capture | CallRecord) -> None:
        self._q.put_nowait(item)
        if isinstance(item, Capture):
            self.inflight -= 1

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until every call started so far is committed (tests, shutdown)."""
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
        self._q.put_nowait(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        stop = False
        while not stop:
            items = [self._q.get()]
            while len(items) < self.batch_size:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            batch: list[CallRecord] = []
            for it in items:
                if it is _STOP:
                    stop = True
                    continue
                try:
                    batch.append(it.to_record() if isinstance(it, Capture) else it)
                except Exception:  # a record we cannot build must not take the writer down
                    log.exception("could not build record for call %s", getattr(it, "call_id", "?"))
            self._write(batch)
            for _ in items:
                self._q.task_done()

    def _write(self, batch: list[CallRecord]) -> None:
        delay = 0.05
        while batch:
            try:
                self.store.write_batch(batch)
                self.written += len(batch)
                self.last_error = None
                return
            except Exception as exc:  # keep serving; retry until the database is back
                self.write_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("database write failed (%d calls waiting), retrying in %.2fs: %s", len(batch), delay, self.last_error)
                if self._closing and self.write_errors > 50:
                    log.error("giving up on %d calls at shutdown", len(batch))
                    return
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
