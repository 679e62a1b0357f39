"""What the event loop hands the recorder's database thread under ``process`` durability.

``Handoff`` is the thread's queue (``Recorder._dbq``), ``Spooled`` a call it is handed as its spool
line alone (the writer process builds the record from the line). Both exist to cut the event
loop's CPU per call (``bench/recpath.py``, ``bench/PROFILE.md`` round 9)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.dbthread import STOP as _STOP
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.records import CallRecord

__all__ = ["Handoff", "Spooled"]


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

    def put_nowait(self, item: Any) -> None:
        super().put_nowait(item)
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
