"""The recorder: hands finished calls from the event loop to the writer threads.

``submit`` is a synchronous ``put_nowait`` that cannot be interrupted by a client
disconnect or a cancellation, so a call is queued even when its handler is being torn
down. A writer thread drains the queue in batches and turns each ``Capture`` into a
``CallRecord`` there, so SSE parsing and reassembly never run on the response path.

Durability (``--durability``, what a call survives; README "Durability" has the table):
- ``process`` (the default): the handler holds the client's last byte until the call's spool line
  is written (``write(2)``): the death of the proxy's process loses nothing. A small call's line is
  written right there on the event loop (``_write_inline``: microseconds, no thread hand-off); a
  large one (``inline_bytes``), or any while the spool thread has calls queued, by the spool thread
  as under ``machine``, without the fsync. A background thread (``_sync_run``) fsyncs every write
  within ``fsync_interval``, so a machine crash loses at most that. The database thread lingers
  ``db_linger_s`` after a batch's first call (up to ``db_linger_max_s`` while batches come full:
  ``DatabaseThread._next_linger``) so calls handed over one by one are stored in batches.
- ``machine`` (was ``wal``): the handler holds the client's last byte until the call is appended
  to the local spool and fsync'd (``await durable(cap)``).
Under both, what is appended is a
  *capture line* (``capline``): the call's raw material, with what it repeats of its session's
  earlier calls written as references, so the work on the client's wait is O(what is new in
  the call), not O(context); no record is built there. Group commit (``machine``): the spool thread takes
  every call queued while its previous fsync ran and covers them all with one fsync; the
  records are built and written to the database meanwhile (a pipeline: neither the record's
  cost nor the database's latency is on the response path), and acknowledged in the spool,
  which deletes only what the database has acknowledged. Where (``writer``): in the database
  thread itself, from the ``Capture`` objects still in memory (``to_record``; the default), or
  (``writer="process"``) in a child process (``proxy.dbproc``) that the database thread hands
  each batch's spool lines to (it decodes them as a replay does, so its records equal the
  thread's), keeping that Python work off this process's GIL; batches go in-thread while it starts. A replay decodes the lines back into
  ``Capture`` objects and builds the records the same way, so they equal the live ones. A failed database write
  leaves its batch in the spool, and every later batch behind it, until a replay stores them
  all (the spool is the truth until then). Guarantee: every call whose response the client
  fully received is in the database or the spool, even after ``kill -9``.
- ``async`` (opt-out): the record is written after the response; a database failure sends
  the batch to the spool (fsync'd) as record lines (the records are built already, and no
  client waits for them), replayed when the database is back. SIGTERM drains
  everything; ``kill -9`` loses the calls still queued (milliseconds' worth).
The spool is replayed at start-up, and retried every ``retry_s`` while the database is down.

Memory: ``queued_bytes`` counts the request and response bytes of calls submitted but not
yet in the database (or, once the database is down, in the spool), the parsed request as twice
its bytes; the proxy answers 429 beyond ``--max-queue-bytes``. A writer batch stops at
``batch_bytes`` as well as at ``batch_size`` calls.

Pacing (``--pace-queue-bytes``, default 32 MiB): above this lower mark a new call waits
(``admit``) before its body is read, until the writer brings the queue back under the mark,
instead of adding to it. The client sees a slower answer, not a 429: with calls arriving faster
than the writer records them (150k-token contexts back to back, an instant upstream), the queue
stays near the mark instead of filling to ``--max-queue-bytes`` and answering 429. A call that
waits longer than ``pace_timeout`` gets 429. The waiters are woken from the writer threads
(``_release``) through the event loop, only when some wait.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchard_rec.errors import one_line
from orchard_rec.proxy import capline
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.dbproc import WriterProcess
from orchard_rec.proxy.dbthread import STOP as _STOP
from orchard_rec.proxy.dbthread import DatabaseThread
from orchard_rec.proxy.handoff import Handoff, Inline
from orchard_rec.proxy.idcut import IdParser
from orchard_rec.records import CallRecord
from orchard_rec.settings import Settings, current
from orchard_rec.storage.spool import Spool, SpoolFormatError, record_to_json
from orchard_rec.storage.store import Store

__all__ = ["DURABILITIES", "Recorder", "default_spool", "durability_name"]

log = logging.getLogger("orchard_rec.recorder")
Ack = Callable[[], None]

DURABILITIES = ("process", "machine", "async")
"""``process`` (the default): the last byte after the call's spool line is written (``write(2)``),
fsync'd in the background within ``fsync_interval``; ``machine``: after it is fsync'd (group
commit); ``async``: recorded after the response."""
_ALIASES = {"wal": "machine"}
"""Earlier names: ``wal`` was the fsync'd spool, now ``machine``."""


def default_spool(db_url: str) -> Path:
    """Beside a SQLite file (``orchard.db.spool``); else ``.orchard-spool/<hash of url>.jsonl`` here."""
    if db_url.startswith("sqlite:///") and not db_url.endswith(":memory:"):
        return Path(db_url[len("sqlite:///") :] + ".spool")
    return Path(".orchard-spool") / (hashlib.sha256(db_url.encode()).hexdigest()[:16] + ".jsonl")


def durability_name(name: str) -> str:
    """The current name of a durability mode (an earlier name mapped to it); ValueError if unknown."""
    name = _ALIASES.get(name, name)
    if name not in DURABILITIES:
        raise ValueError(f"durability must be one of {', '.join(DURABILITIES)}, got {name!r}")
    return name


def _size(item: Capture | CallRecord) -> int:
    """The bytes a queued call holds, cheaply: its request and response as received, and the
    parsed request (about twice its JSON in Python objects: 545 kB for a 281 kB chat body)."""
    if isinstance(item, Capture):
        n = item.bytes_in * (3 if item.request is not None else 1)
        n += len(item.body) if item.body is not None else 0
        for c in item.chunks:
            n += len(c)
        return n
    return item.bytes_in + item.bytes_out


class Recorder(DatabaseThread, Inline):
    def __init__(
        self,
        store: Store,
        *,
        spool: Path | None = None,
        durability: str = "async",
        batch_size: int = 256,
        batch_bytes: int = 32 << 20,
        retry_s: float = 1.0,
        linger_s: float | None = None,
        writer: str = "thread",
        fsync_interval: float = 0.1,
    ) -> None:
        durability = durability_name(durability)
        knobs = self.knobs = current()
        if writer not in ("thread", "process"):
            raise ValueError("writer must be thread or process")
        if durability != "async" and spool is None:
            raise ValueError(f"{durability} durability needs a spool path")
        if fsync_interval <= 0:
            raise ValueError("fsync_interval must be > 0")
        self.store = store
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        """A batch also stops at this many bytes of calls (``_size``): the records of a batch are all
        built before it is written, and at a 150k-token context each holds megabytes of ids and
        parsed request (256 of them were ~1 GB of RSS beyond the queue's byte bound)."""
        self.retry_s = retry_s
        self.durability = durability
        if linger_s is None:
            linger_s = knobs.writer_linger_s if durability == "async" else 0.0
        self.linger_s = linger_s
        """How long the writer lets a batch gather after its first call (async durability; env
        ``ORCHARD_WRITER_LINGER_S``, default 5 ms): one transaction and one wake-up per several calls
        instead of per call, at low concurrency too (SQLite, CPU per call: 88 us in batches of 8,
        42 us of 32, 33 us of 128; 20 ms measured no better than 5 ms end to end). Under wal the
        client waits for the batch, so there it is 0: group commit gathers what queued meanwhile."""
        self.db_delay_s = knobs.wal_db_delay_s
        """machine: how long the database thread waits before building a spooled batch's records when
        it has nothing else queued (``ORCHARD_WAL_DB_DELAY_S``, default 2 ms; not when a client waits
        for the commit): the batch's clients are being answered at that moment, and the records'
        Python work would take the GIL from the event loop doing it."""
        self.writer = writer if durability != "async" else "thread"
        """wal: where the spooled batches' records are built and written: ``thread``, this process's
        database thread, or ``process``, a child process (``proxy.dbproc``: that work off this
        process's GIL, so the event loop never waits for it). Replays are this process's always."""
        self.proc: WriterProcess | None = None
        self.spool_path = spool
        self.spool: Spool | None = None
        self._q: queue.Queue[Any] = queue.Queue()
        self._dbq = Handoff()
        """wal: spooled batches on their way to the database (the second stage of the pipeline)."""
        self._dbq_calls = 0
        self._count_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._db_thread: threading.Thread | None = None
        self.written = 0
        self.write_errors = 0
        self.last_error: str | None = None
        self.spool_pending = False
        """The database failed a write: the spool holds records it has not committed, and every
        later batch goes behind them until a replay stores them all."""
        self._closing = False
        self.inflight = 0
        """Calls whose handler has started but not yet submitted (event-loop thread only)."""
        self._bytes_in = 0
        """Bytes submitted (event-loop thread only)."""
        self._bytes_out = 0
        """Bytes released by the writer (writer threads, under ``_count_lock``)."""
        self._init_process(fsync_interval)
        self._init_writer(knobs)

    def _init_writer(self, knobs: Settings) -> None:
        """The writer thread's settings and the counters of the spool and of pacing."""
        self.nice = knobs.writer_nice
        """The writer thread's OS niceness (``ORCHARD_WRITER_NICE``, default 0: the process's own).
        A positive value makes the scheduler run the event loop (and the model server, the harness)
        first and the writer in the gaps, which buys short calls some throughput on a saturated box
        (c=32 ~10 % in ``bench/run.py``, within its noise) but starves the writer there: with 150k-token
        calls back to back the queue grew to its byte bound and callers got 429 (niceness 10: queue
        84-194 calls, 19-84 answered 429 in 10 s; 0: queue 12-26, none), and a niced thread that holds
        the GIL when the scheduler parks it stalls the event loop. Under wal only the database thread
        is niced (or the writer process, which then holds no lock of this process): the spool
        thread's fsync is what clients wait for."""
        self.ids = IdParser(knobs.ids_cache_bytes)
        """Parses answers' token-id arrays on the writer thread, keeping each session's last prompt
        ids (``ORCHARD_IDS_CACHE_MB``, default 512: ~300 sessions at a 150k-token context) so a call
        parses only the ids new to it."""
        self.fault_write_delay = knobs.fault_write_delay_s
        """Fault injection for benchmarks and tests: sleep this long before every database write."""
        self.lines = capline.Encoder(knobs.spool_bases_bytes)
        """process / machine: writes each call's capture line (the spool thread's, or the event loop's
        for a small call written inline: never both at once)."""
        self._encoding = threading.Lock()
        """process / machine: held while lines are written and appended (and handed on, in their
        order); the database thread takes it to make ``lines`` forget its bases (a call whose record
        cannot be built)."""
        self.spooled_bytes = 0
        """Bytes appended to the spool so far (lines and newlines)."""
        self.spooled_calls = 0
        self.paced = 0
        """Calls that waited in ``admit`` for the queue to come back under the pacing mark."""
        self.paced_s = 0.0
        """Seconds those calls waited, in all."""
        self._pace_waiters = 0
        self._pace_event: asyncio.Event | None = None
        self._pace_loop: asyncio.AbstractEventLoop | None = None

    def _init_process(self, fsync_interval: float) -> None:
        """The settings and state of ``process`` durability."""
        self.db_linger_s = self.knobs.db_linger_s
        """process: how long the database thread lets calls gather after the first of a batch
        (``ORCHARD_DB_LINGER_S``, default 10 ms; not when a client waits for the commit): the calls
        come one by one from the event loop, and records cost less CPU in larger batches (SQLite, per
        call: 88 us in batches of 8, 42 us of 32), and the loop answers the clients meanwhile."""
        self._dbq.poll = self.db_linger_s if self.durability == "process" else 0.0
        self.fsync_interval = fsync_interval
        """``process`` durability: the background fsync covers every write at most this long after it
        (it starts one a quarter of the interval after the oldest unsynced write, sooner when recent fsyncs were slow)."""
        self.inline_bytes = self.knobs.spool_inline_bytes
        """``process`` durability: a call smaller than this (``_size``) has its line written on the
        event loop (``write(2)`` of a few kB: microseconds, no thread hand-off); a larger one, or any
        while the spool thread has calls queued (lines keep their order), by the spool thread, which
        the handler waits for: a multi-MB ``write(2)`` takes milliseconds (4 MB ~1.1 ms, 16 MB ~10 ms
        on this box's disk), and the spool thread's leaves the interpreter lock to the loop."""
        self.max_sync_late = 0.0
        """``process``: the longest the fsync thread ran late (woken after its fsync was due)."""
        self._by_line: capline.Decoder | None = None  # ``_record_of``'s
        self._sync_stop = threading.Event()
        self._sync_thread: threading.Thread | None = None

    @property
    def fsyncs(self) -> int:
        """The spool's fsyncs so far (``machine``: one per batch, so calls per fsync shows group commit
        at work; ``process``: the background fsync's)."""
        return self.spool.fsyncs if self.spool is not None else 0

    def sync_stats(self) -> dict[str, float]:
        """The spool's fsync state: ``fsyncs``, ``unsynced_age_s`` (how long the oldest write not yet
        fsync'd has waited, 0 when none), ``max_unsynced_age_s`` (the longest any write waited for its
        fsync so far), ``fsync_interval_s`` (``process``: the bound those keep under) and, of the last
        64 background fsyncs, ``max_sync_lag_s`` (the oldest write's age when one started) and
        ``slowest_fsync_s`` (the device's part), and ``max_sync_late_s``, the longest the fsync thread
        was woken late (the machine's scheduler's part)."""
        sp = self.spool
        log = sp.sync_log if sp is not None else []
        return {
            "fsyncs": sp.fsyncs if sp is not None else 0,
            "unsynced_age_s": round(sp.unsynced_age, 6) if sp is not None else 0.0,
            "max_unsynced_age_s": round(sp.max_unsynced_age, 6) if sp is not None else 0.0,
            "fsync_interval_s": self.fsync_interval if self.durability == "process" else 0.0,
            "max_sync_lag_s": round(max((lag for lag, _ in log), default=0.0), 6),
            "slowest_fsync_s": round(max((took for _, took in log), default=0.0), 6),
            "max_sync_late_s": round(self.max_sync_late, 6),
        }

    @property
    def depth(self) -> int:
        """Calls submitted but not yet committed (or, with the database down, spooled)."""
        return self._q.unfinished_tasks + self._dbq_calls

    @property
    def queued_bytes(self) -> int:
        """Request and response bytes of the calls in ``depth`` (what back-pressure bounds)."""
        return self._bytes_in - self._bytes_out

    @property
    def spool_depth(self) -> int:
        """Records in the spool the database has not acknowledged."""
        return self.spool.depth if self.spool is not None else 0

    @property
    def spool_rejected(self) -> int:
        """Spool lines that could not be decoded, moved to ``spool.rejected_path``."""
        return self.spool.rejected if self.spool is not None else 0

    @property
    def writer_state(self) -> str:
        """Where records are built and written: ``thread``; ``process`` (the writer process takes
        the batches); ``starting`` (it is not ready yet, or is starting again after it died: the
        batches are written in-thread meanwhile)."""
        if self.writer != "process":
            return "thread"
        proc = self.proc
        return "process" if proc is not None and proc.is_ready else "starting"

    def caches(self) -> dict[str, dict[str, int]]:
        """The recording side's per-session caches (``stats()`` of each: entries, bytes, max_bytes,
        hits, misses): ``ids`` (answers' prompt ids), ``state`` (the database writer's), and under
        ``wal`` ``spool_bases`` (capture lines). With the writer process, ``ids`` and ``state`` are
        its own, as of its last batch, and ``writer_requests`` is its request cache (it decodes the lines)."""
        out: dict[str, dict[str, int]] = {}
        proc = self.proc if self.writer == "process" else None
        child = proc.caches if proc is not None else None
        if child:
            out.update(child)
        else:
            out["ids"] = self.ids.stats()
            enc = getattr(self.store, "encoder", None)
            if enc is not None:
                out["state"] = enc.stats()
        if self.durability != "async":
            out["spool_bases"] = self.lines.stats()
        return out

    @property
    def healthy(self) -> bool:
        return self.last_error is None and not self.spool_pending

    def start(self) -> None:
        if self.spool_path is not None:
            # process: no zeros kept ahead (they spared each append's fsync a size change; the
            # background fsync journals it once per interval), so a write only ever extends the file
            pre = (
                {"preallocate": 0, "keep_bytes": self.knobs.spool_keep_bytes}
                if self.durability == "process"
                else {}
            )
            self.spool = Spool(self.spool_path, **pre)
            self.spool_pending = self.spool.depth > 0
        self._thread = threading.Thread(target=self._run, name="orchard-writer", daemon=True)
        self._thread.start()
        if self.durability != "async":
            self._db_thread = threading.Thread(target=self._db_run, name="orchard-db-writer", daemon=True)
            self._db_thread.start()
        if self.durability == "process":
            self._sync_thread = threading.Thread(
                target=self._sync_run, name="orchard-spool-sync", daemon=True
            )
            self._sync_thread.start()

    def begin(self) -> None:
        """A handler started a call; ``submit`` ends it."""
        self.inflight += 1

    def submit(self, item: Capture | CallRecord, ack: Ack | None = None, *, committed: bool = False) -> None:
        """Queue a finished call. ``ack`` runs on a writer thread once the record is durable: in
        the spool (wal), or with ``committed`` in the database (or the spool, while it is down)."""
        size = _size(item)
        self._bytes_in += size
        self._q.put_nowait((item, ack, committed, size))
        if isinstance(item, Capture):
            self.inflight -= 1

    async def durable(self, cap: Capture, *, committed: bool = False) -> None:
        """Submit ``cap`` and return once its line is in the spool: written (``process``) or fsync'd
        (``machine``); with ``committed`` once the database has it (so another replica can read it)."""
        if self.durability == "process" and not committed and self._thread is not None:
            size = _size(cap)
            if size < self.inline_bytes and not self._q.unfinished_tasks:  # else behind the spool
                self._write_inline(cap, size)  # thread's calls, in their order
                return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not fut.done():
                fut.set_result(None)

        def ack() -> None:
            loop.call_soon_threadsafe(settle)

        cap.submitted = True
        self.submit(cap, ack, committed=committed)
        await fut  # not through asyncio.shield: two loop steps fewer on the client's wait; a
        # cancelled handler cancels only this future (``settle`` skips it), never the append

    async def admit(self, limit: int, timeout: float) -> bool:
        """Wait while more than ``limit`` bytes are queued (pacing; 0: never). False when the queue
        is still above it after ``timeout`` seconds (the caller answers 429). Event-loop thread."""
        if not limit or self.queued_bytes <= limit:
            return True
        loop = asyncio.get_running_loop()
        if self._pace_event is None or self._pace_loop is not loop:
            self._pace_event = asyncio.Event()
            self._pace_loop = loop
        event = self._pace_event
        self.paced += 1
        start = time.monotonic()
        deadline = start + timeout
        self._pace_waiters += 1
        try:
            while self.queued_bytes > limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                event.clear()
                try:
                    await asyncio.wait_for(event.wait(), left)
                except TimeoutError:
                    return self.queued_bytes <= limit
            return True
        finally:
            self._pace_waiters -= 1
            self.paced_s += time.monotonic() - start

    def _wake_paced(self) -> None:
        if self._pace_event is not None:
            self._pace_event.set()

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until every call started so far is committed or spooled (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self.inflight or self.depth:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    def close(self, timeout: float = 60.0) -> None:
        if self._thread is None:
            return
        self._closing = True
        self._q.put_nowait((_STOP, None, False, 0))
        self._thread.join(timeout)
        self._thread = None
        if self._db_thread is not None:
            self._db_thread.join(timeout)
            self._db_thread = None
        if self._sync_thread is not None:
            self._sync_stop.set()
            self._sync_thread.join(timeout)
            self._sync_thread = None
        if self.spool is not None:
            try:
                self.spool.sync()  # what the database has not taken stays, fsync'd
            except OSError:
                log.exception("spool %s: the last fsync failed", self.spool.path)
            self.spool.close()

    def _release(self, nbytes: int, ncalls: int = 0) -> None:
        with self._count_lock:
            self._bytes_out += nbytes
            self._dbq_calls -= ncalls
        if self._pace_waiters and self._pace_loop is not None:  # calls wait in ``admit``
            try:
                self._pace_loop.call_soon_threadsafe(self._wake_paced)
            except RuntimeError:  # the loop is closed (shutdown)
                pass

    # -- the spool / async writer thread -------------------------------------------------------

    def _sync_run(self) -> None:
        """``process``: fsync what was written, each write within ``fsync_interval`` of it: the fsync
        starts a quarter of the interval after the oldest unsynced write (sooner when recent fsyncs were slow,
        so that one ends in time), covering everything written by then."""
        sp = self.spool
        assert sp is not None
        interval = self.fsync_interval
        slow = 0.0
        """The slowest recent fsync (decaying), seconds."""
        done = 0.0
        while not self._sync_stop.is_set():
            since = sp.unsynced_since
            if since is None:
                self._sync_stop.wait(interval / 4)
                continue
            due = since + min(interval / 4, max(0.0, interval - 2 * slow))
            wait = due - time.monotonic()
            if wait > 0:
                self._sync_stop.wait(wait)
                continue
            t = time.monotonic()
            # how much later than due (or than the last fsync's return) this thread got to run: the
            # machine's scheduler and the interpreter lock, not the schedule above
            self.max_sync_late = max(self.max_sync_late, t - max(due, done))
            try:
                sp.sync()
            except Exception as exc:  # EIO, disk full: said, and tried again
                self.last_error = f"spool fsync failed: {type(exc).__name__}: {exc}"[:500]
                log.error("%s", self.last_error)
                self._sync_stop.wait(interval)
            done = time.monotonic()
            slow = max(done - t, slow * 0.9)

    def _run(self) -> None:
        wal = self.durability != "async"
        if not wal:  # under wal this thread is on the response path (clients wait for its fsync)
            self._lower_priority()
        if self.spool_pending and not wal:
            self._replay()
        stop = False
        while not stop:
            try:
                first = self._q.get(timeout=self.retry_s if (self.spool_pending and not wal) else None)
            except queue.Empty:
                self._replay()
                continue
            if self.linger_s and not self._closing and first[0] is not _STOP:
                time.sleep(self.linger_s)  # sleeping releases the GIL; producers' puts wake no one meanwhile
            items = [first]
            held = first[3]
            while len(items) < self.batch_size and held < self.batch_bytes:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
                held += items[-1][3]
            batch: list[Any] = []
            acks: list[Ack] = []
            db_acks: list[Ack] = []
            nbytes = 0
            for it, ack, committed, size in items:
                if it is _STOP:
                    stop = True
                    continue
                nbytes += size
                if wal:
                    batch.append(capline.snapshot(it) if isinstance(it, Capture) else it)
                else:
                    try:
                        batch.append(it.to_record(self.ids) if isinstance(it, Capture) else it)
                    except Exception:  # a record we cannot build must not take the writer down
                        log.exception("could not build record for call %s", getattr(it, "call_id", "?"))
                if ack is not None:
                    (db_acks if committed else acks).append(ack)
            try:
                if wal:
                    self._spool_batch(batch, acks, db_acks, nbytes)
                else:
                    self._write_async(batch, acks + db_acks, nbytes)
            except Exception as exc:  # a bug here must not stop the writer: every later call would wait
                self.last_error = f"writer: {type(exc).__name__}: {exc}"[:500]
                log.exception("writer: a batch of %d calls failed", len(batch))
            finally:
                for _ in items:
                    self._q.task_done()
        if wal:
            self._dbq.put_nowait(_STOP)
        elif self.spool_pending:
            self._replay()

    def _lower_priority(self) -> None:
        if self.nice:
            try:  # Linux: a thread is a task with its own niceness
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):  # pragma: no cover - not Linux, or not permitted
                pass

    def _line(self, item: Capture | CallRecord) -> bytes | None:
        """The spool line of a call: a capture line, or a record line for a record submitted as one."""
        if isinstance(item, CallRecord):
            return self._record_line(item)
        try:
            return self.lines.encode(item)
        except Exception:  # never leave a call unspooled for a bug here: its whole record instead
            return self._unencodable(item)

    def _unencodable(self, cap: Capture) -> bytes | None:
        """The line of a call whose capture line could not be written: its record's (logged)."""
        log.exception("could not write the capture line of call %s; spooling its record", cap.call_id)
        self.lines.reset()  # it may have become a base, and a record line offers none
        try:
            record = cap.to_record()
        except Exception:
            log.exception("could not build the record of call %s either", cap.call_id)
            return None
        return self._record_line(record)

    def _record_line(self, record: CallRecord) -> bytes | None:
        """A record's spool line; None for one that cannot be serialized (orjson refuses an integer
        past 64 bits, a lone surrogate): that record is set aside (``spool.rejected_path``, written
        by the standard library's ``json``, which takes both) and logged, the rest of its batch goes on."""
        try:
            return record_to_json(record)
        except Exception as exc:
            reason = f"could not write the record of call {record.call_id} to the spool: {type(exc).__name__}: {exc}"
            log.exception("%s; set aside", reason)
            if self.spool is not None:
                try:
                    d = {f: getattr(record, f) for f in record.__dataclass_fields__}
                    d["headers"] = dict(record.headers)
                    aside = json.dumps(d, default=repr).encode()
                except Exception:
                    aside = json.dumps({"call_id": record.call_id, "error": reason}).encode()
                try:
                    self.spool._reject([aside], reason)
                except OSError:
                    log.exception("could not set the record of call %s aside either", record.call_id)
            return None

    def _spool_batch(
        self,
        batch: list[Capture | CallRecord],
        acks: list[Ack],
        db_acks: list[Ack],
        nbytes: int,
    ) -> None:
        """process / machine: one append for the whole batch (``machine``: and its fsync, group
        commit), release the clients, hand the batch (``Capture`` snapshots: their records are built
        there) to the database thread, in the spool's order (one call of the event loop's: ``_spool_one``)."""
        assert self.spool is not None
        end: int | None
        with self._encoding:
            start = self.spool.end
            lines = [line for line in map(self._line, batch) if line is not None]
            try:
                # on disk (machine) or in the kernel's hands (process) before a client gets its last byte
                end = self.spool.append_lines(lines, sync=self.durability == "machine")
                self.spooled_calls += len(lines)
                self.spooled_bytes += sum(map(len, lines)) + len(lines)
            except Exception as exc:  # disk full, I/O error: keep serving, the database may still take it
                self.last_error = f"spool append failed: {type(exc).__name__}: {exc}"[:500]
                log.error("%s (%d calls go to the database unspooled)", self.last_error, len(batch))
                self.lines.reset()  # what they were written against may not be on disk
                end = None
            for ack in acks:
                ack()
            with self._count_lock:
                self._dbq_calls += len(batch)
            # a call without a line (set aside) goes to the database from this process, as in-thread
            self._dbq.put_nowait(
                (
                    batch,
                    start,
                    end,
                    db_acks,
                    nbytes,
                    lines if len(lines) == len(batch) else None,
                    time.monotonic(),
                )
            )

    def _write_async(self, batch: list[CallRecord], acks: list[Ack], nbytes: int) -> None:
        try:
            if self.spool_pending and self.spool is not None:
                self._spool_records(batch)  # keep order behind what is already waiting
                return
            if not self._store(batch, first=True) and self.spool is not None:
                if self._spool_records(batch):
                    self.spool_pending = True
            elif self.last_error is not None and self.spool is None:
                self._retry_in_memory(batch)
        finally:
            for ack in acks:
                ack()
            self._release(nbytes)

    def _spool_records(self, batch: list[CallRecord]) -> bool:
        """async: append ``batch`` to the spool as record lines (one that cannot be serialized set
        aside); if the spool cannot take them, hold them in memory until the database does."""
        assert self.spool is not None
        try:
            self.spool.append_lines([line for line in map(self._record_line, batch) if line is not None])
        except Exception as exc:  # disk full, I/O error: the database is all that is left
            self.last_error = f"spool append failed: {type(exc).__name__}: {exc}"[:500]
            log.error("%s (%d calls held in memory for the database)", self.last_error, len(batch))
            self._retry_in_memory(batch)
            return False
        return True

    # -- shared ------------------------------------------------------------------------------------

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
            self.last_error = one_line(exc)[:500]
            log.warning("database write failed (%d calls), spooling: %s", len(batch), self.last_error)
            return False
        self.written += len(batch)
        self.last_error = None
        return True

    def _retry_in_memory(self, batch: list[CallRecord]) -> None:
        # one the spool cannot serialize the database refuses too (the same JSON encoder): never retried
        batch = [r for r in batch if self._record_line(r) is not None]
        delay = 0.05
        while not self._store(batch):
            if self._closing and self.write_errors > 50:
                log.error("giving up on %d calls at shutdown (no spool configured)", len(batch))
                return
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _replay(self) -> None:
        """``_replay_pass``; one that fails (reading the spool, moving a line aside) is retried
        ``retry_s`` later, never the end of the thread that replays."""
        try:
            self._replay_pass()
        except Exception as exc:
            self.last_error = f"spool replay: {type(exc).__name__}: {exc}"[:500]
            log.exception("spool replay failed; retrying in %.1f s", self.retry_s)
            self.spool_pending = True

    def _replay_pass(self) -> None:
        """Store everything the spool holds that the database has not acknowledged, acknowledging
        it as it goes (in batches); on a failure the rest stays, and the next replay starts over
        from what was not acknowledged (idempotent writes: each call is stored once). Capture
        lines become ``Capture`` objects again and their records are built as live calls' are."""
        if self.spool is None:
            return
        lines, end = self.spool.lines()
        dec = capline.Decoder(self.store)
        batch: list[CallRecord] = []
        held = done = 0
        aside = False
        for idx, line in lines:
            try:
                rec = self._decode(dec, line)
            except SpoolFormatError as exc:
                self.spool.set_aside(idx, line, str(exc))
                aside = True  # later lines may be written against it: no ack past it before the end
                continue
            except Exception as exc:  # the database failed while a base was read: retry later
                self.write_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("spool replay paused (reading a base from the database): %s", self.last_error)
                self.spool_pending = True
                return
            batch.append(rec)
            held += rec.bytes_in + rec.bytes_out
            if len(batch) >= 500 or held >= self.batch_bytes:
                if not self._store(batch):
                    self.spool_pending = True
                    return
                if not aside:  # else a failure later in the pass would restart past it, its bases gone
                    self.spool.ack(idx + 1)
                    dec.prune()
                done += len(batch)
                batch, held = [], 0
        if not self._store(batch):
            self.spool_pending = True
            return
        done += len(batch)
        self.spool.ack(end)
        self.spool_pending = False
        self.last_error = None
        if done:
            log.info("replayed %d spooled calls into the database (%d bases read from it)", done, dec.from_db)

    def _record_of(self, line: bytes) -> CallRecord:
        """A ``Spooled`` call's record (the writer process was gone for its batch): its line decoded as
        a replay does, in spool order, the bases kept (``prune``: each session's latest, bounded)."""
        dec = self._by_line
        if dec is None:
            dec = self._by_line = capline.Decoder(self.store, max_bytes=self.knobs.spool_bases_bytes)
        try:
            return self._decode(dec, line)
        finally:
            dec.prune()

    def _decode(self, dec: capline.Decoder, line: bytes) -> CallRecord:
        """A spool line's record: a capture line's built by ``to_record`` as a live call's is."""
        return capline.record_of_line(dec, line, self.ids)
