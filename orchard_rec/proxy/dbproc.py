"""The database writer in a process of its own (``--db-writer process``, under ``process`` and ``machine``).

Why: building a 150k-token call's record and writing it is ~1-2 ms of Python per call. In the
proxy's process that work holds the interpreter's lock (GIL) against the event loop (a GIL trace
with calls flowing as fast as two cores take them: held 76 % of the time, 59 % of that by the
database thread). Here the proxy's database thread hands each spooled batch's lines, the bytes
it has just fsync'd, to a child process that decodes them (``capline.Decoder``, as a replay
does), builds the records (``Capture.to_record``) and writes them (``Store.write_batch``); the
proxy's process keeps only the response path and the spool (the GIL then held ~35 % of the
time). The price: the child's own caches (memory: 64 sessions of 158k tokens interleaved ran in
1.45 GB against 0.64 GB in-thread) and the decoding (~25 % more CPU per long call). Measured on 2
cores saturated by 150k-token calls, ``/healthz`` p50 halved (1.8 -> 1.2 ms) but p99 did not move
out of the box's own noise (4.8-6.1 ms either way, a do-nothing server 2.6-4.3 ms beside it):
not the default; worth it where the proxy's one core is the limit.

Protocol (the child's stdin and stdout, one batch at a time, the parent waits for each answer):
- parent -> child: ``!I`` length, then ``op`` (1 byte: ``W`` write, ``S`` stop), ``first`` (1
  byte, ``Store.write_batch``'s ``known_new``), then the batch's spool lines joined by ``\\n``
  (a spool line never holds a newline);
- child -> parent: ``!I`` length, then a JSON object ``{"built": n, "ok": bool, "error": str|null}``:
  how many lines became records, whether the database took them (one transaction).

What stays with the proxy: the spool (it is the truth until the database has acknowledged a
batch), replays after a failure or at start-up, and the decision what a failure means (the same as
with the writer thread: the spool keeps the batch, a replay stores it). A child that dies (killed,
out of memory) is a failed batch: the proxy logs it, keeps the spool, replays, and starts another.
The child dies with the proxy (``PR_SET_PDEATHSIG`` on Linux; elsewhere at its stdin's end).

The child's caches are its own: ``ORCHARD_IDS_CACHE_MB``, ``ORCHARD_STATE_CACHE_MB``,
``ORCHARD_REQUEST_CACHE_MB`` and ``ORCHARD_SPOOL_BASES_MB`` bound them as they bound the proxy's.
``ORCHARD_WRITER_NICE`` (default 0) sets its niceness.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, cast

import orjson

from orchard_rec.errors import one_line
from orchard_rec.settings import Settings

__all__ = ["Result", "WriterProcess", "main"]

log = logging.getLogger("orchard_rec.recorder")
_LEN = struct.Struct("!I")
WRITE = b"W"
STOP = b"S"


@dataclass(frozen=True)
class Result:
    built: int
    """Lines that became records (the rest could not be decoded or built: logged by the child)."""
    ok: bool
    """The database took the records (they are committed)."""
    error: str | None = None


class WriterDied(RuntimeError):
    """The child process is gone (or its pipe broke): the batch it had is not known to be stored."""


def _read_exact(f: IO[bytes], n: int) -> bytes | None:
    got = f.read(n)  # a buffered reader: all ``n`` at once, unless the pipe ends first
    if len(got) == n:
        return got
    if not got:
        return None
    buf = bytearray(got)
    while len(buf) < n:
        got = f.read(n - len(buf))
        if not got:
            return None
        buf += got
    return bytes(buf)


def _read_msg(f: IO[bytes]) -> bytes | None:
    head = _read_exact(f, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    return _read_exact(f, n)


def _write_msg(f: IO[bytes], *parts: bytes) -> None:
    f.write(b"".join([_LEN.pack(sum(map(len, parts))), *parts]))  # one write(2) where the pipe has room
    f.flush()


def _widen(pipe: IO[bytes] | None) -> None:
    """Linux: the pipe to the child holds 1 MiB (the default 64 KiB took a batch of ~30 small calls'
    lines in two or three writes, each waiting for the child to read)."""
    try:
        import fcntl

        if pipe is not None and hasattr(fcntl, "F_SETPIPE_SZ"):
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError:  # over /proc/sys/fs/pipe-max-size, or not permitted: the default then
        pass


class WriterProcess:
    """The proxy's side: starts the child, hands it batches, reads its answers (the recorder's
    database thread; ``ready`` may be asked from any thread).

    A child takes ~0.3 s to start (imports, the database's engine); it says so on its pipe when it
    can take batches. Until then (at the proxy's start, after a child died) ``ready`` is False and
    the recorder writes in its own thread, so no batch waits for a start-up."""

    def __init__(self, url: str, *, access_log: bool = False) -> None:
        self.url = url
        self.access_log = access_log
        """The child logs an access line per call it stores (``serve``'s store does, ``LoggedStore``)."""
        self._p: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._used = False
        """The current child was handed a batch (else closing it can stop it at once: it has nothing
        to finish, and may still be starting)."""
        self._lock = threading.Lock()
        self._owner: int | None = None
        """The thread that starts children (the first to): they die with it (``PR_SET_PDEATHSIG``)."""
        self._not_before = 0.0
        """A child that died before it was ready is started again no sooner than this (monotonic)."""
        self.started = 0
        """Children started so far (more than one: some died)."""
        self.caches: dict[str, dict[str, int]] | None = None
        """The child's caches as its last answer reported them (``_Child.caches``)."""

    @property
    def is_ready(self) -> bool:
        """What ``ready`` last found (without asking the child)."""
        return self._ready

    @property
    def pid(self) -> int | None:
        p = self._p
        return None if p is None else p.pid

    def start(self) -> None:
        """Start a child; one that cannot be started is logged: the batches then stay in-thread, and
        ``ready`` tries again later."""
        try:
            self._start()
        except OSError as exc:  # no such interpreter, no processes left, no memory
            log.error("cannot start the database writer process (%s); writing in-thread meanwhile", exc)
            with self._lock:
                self._not_before = time.monotonic() + 5.0

    def _start(self) -> None:
        from orchard_rec.proxy.logs import JsonFormatter

        root = logging.getLogger("orchard_rec")
        fmt = "json" if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers) else "text"
        level = logging.getLevelName(root.getEffectiveLevel()).lower()
        access = "access" if self.access_log else "-"
        with self._lock:
            if self._owner is None:
                self._owner = threading.get_ident()
            self._ready = self._used = False
            self._p = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from orchard_rec.proxy.dbproc import main; main()",
                    level,
                    fmt,
                    access,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # the database's URL not on the command line (``ps``): it may hold a password
                env={**os.environ, "ORCHARD_DB_WRITER_URL": self.url},
            )
            self.started += 1
        _widen(self._p.stdin)

    def ready(self) -> bool:
        """Whether the child can take a batch now (it has said so). A child that is gone is started
        again (and is not ready yet), from the thread that started the first one."""
        with self._lock:
            if self._ready:
                return True
            p = self._p
            if p is None or p.poll() is not None:
                restart = True
                if p is not None:
                    self._reap()
                    self._not_before = time.monotonic() + 5.0
            else:
                restart = False
                assert p.stdout is not None
                if select.select([p.stdout], [], [], 0)[0]:
                    try:
                        hello = _read_msg(p.stdout)
                    except (OSError, ValueError):
                        hello = None
                    if hello is not None and orjson.loads(hello).get("ready"):
                        self._ready = True
                    else:  # it died starting (its stderr says why): another, in a while
                        self._reap()
                        restart = True
                        self._not_before = time.monotonic() + 5.0
        if restart and threading.get_ident() == self._owner and time.monotonic() >= self._not_before:
            self.start()
        return self._ready

    def write(self, lines: list[bytes], *, first: bool) -> Result:
        """Decode, build and store ``lines`` in the child (once ``ready``); raises ``WriterDied``
        if it is gone, and the next child is started."""
        with self._lock:
            p = self._p
            assert self._ready and p is not None and p.stdin is not None and p.stdout is not None
            self._used = True
            try:
                _write_msg(p.stdin, WRITE, b"1" if first else b"0", b"\n".join(lines))
                answer = _read_msg(p.stdout)
            except (OSError, ValueError) as exc:  # a broken pipe, a closed file
                self._reap()
                answer, why = None, f"failed: {type(exc).__name__}: {exc}"
            else:
                why = "" if answer is not None else f"exited (code {self._reap()}) with a batch unanswered"
        if answer is None:
            self.start()
            raise WriterDied(f"the database writer process {why}")
        d = orjson.loads(answer)
        if isinstance(d.get("caches"), dict):
            self.caches = d["caches"]
        return Result(int(d["built"]), bool(d["ok"]), d.get("error"))

    def close(self, timeout: float = 30.0) -> None:
        with self._lock:
            p = self._p
            if p is None:
                return
            if not self._used:  # nothing to finish: no need to wait for its start-up
                p.kill()
            try:
                if p.poll() is None and p.stdin is not None:
                    _write_msg(p.stdin, STOP)
                    p.stdin.close()
                p.wait(timeout)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                p.kill()
                p.wait()
            self._reap()

    def _reap(self) -> int | None:
        """Forget the current child (the lock held): its pipes closed, its exit code."""
        p, self._p = self._p, None
        self._ready = False
        if p is None:
            return None
        for f in (p.stdin, p.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            return p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()


# -- the child ---------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (the proxy's database
    thread, which ends only with the proxy or after closing it). Else the stdin's end ends it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _fast_binds() -> None:
    """This process's ``sqlite3`` binds ``None`` and ``bytes`` parameters through a registered
    adapter that returns them as they are: bound the same (NULL, a blob), without the protocol
    look-ups the driver makes for a type it has no adapter for (a call row has ~8 NULLs and ~5
    blobs: ~1.5 us a row, bench/PROFILE.md round 8). Process-wide, so only in the writer process,
    which runs nothing else; ``int``, ``float`` and ``str`` keep the driver's own fast path (an
    adapter for them would turn it off)."""
    import sqlite3

    none: Any = {}.get  # None -> None, at C speed
    sqlite3.register_adapter(type(None), none)
    sqlite3.register_adapter(bytes, cast(Any, bytes))  # a bytes object -> itself (no copy)


class _Child:
    def __init__(self, url: str, access_log: bool) -> None:
        from orchard_rec.settings import current

        knobs = current()
        from orchard_rec.proxy import capline
        from orchard_rec.proxy.idcut import IdParser
        from orchard_rec.proxy.reqparse import RequestCache
        from orchard_rec.storage.store import Store

        if url.startswith("sqlite"):
            _fast_binds()
        self.store: Any = Store(url)
        if access_log:
            from orchard_rec.proxy.logs import LoggedStore

            self.store = LoggedStore(self.store)
        self.ids = IdParser(knobs.ids_cache_bytes)
        self.requests = RequestCache(knobs.request_cache_bytes)
        self.decoder = capline.Decoder(self.store, requests=self.requests, max_bytes=knobs.spool_bases_bytes)
        self.store.encoder.owned = True  # this process's records are its own (``delta.Encoder.owned``)
        self.delay = knobs.fault_write_delay_s
        self.record_of_line = capline.record_of_line

    def write(self, lines: list[bytes], first: bool) -> dict[str, Any]:
        """Decode, build and store a batch, without automatic collections of the garbage
        collector meanwhile: a batch's records are alive until it is stored, and a big batch of
        streamed calls (~400 containers a call: the events) went over the young generation's
        threshold, each collection walking every record built so far (~2.4 ms per 50k objects,
        ~16 us a streamed call in batches of 140, bench/PROFILE.md round 13) to free none of them.
        The counts go on: what the batch leaves behind is collected as before, at the next
        allocation once the batch is gone (``_write`` returned, its records freed)."""
        was = gc.isenabled()
        gc.disable()
        try:
            return self._write(lines, first)
        finally:
            if was:
                gc.enable()

    def _write(self, lines: list[bytes], first: bool) -> dict[str, Any]:
        records = []
        for line in lines:
            try:
                records.append(self.record_of_line(self.decoder, line, self.ids))
            except Exception:  # the proxy keeps the line in the spool; its replay sets it aside
                log.exception("database writer: a spooled line cannot become a record")
        try:
            if self.delay:
                time.sleep(self.delay)
            if records:
                self.store.write_batch(records, known_new=first)
        except Exception as exc:
            log.warning("database write failed (%d calls): %s", len(records), one_line(exc))
            return {"built": len(records), "ok": False, "error": one_line(exc)[:500]}
        self.decoder.prune()
        return {"built": len(records), "ok": True, "error": None, "caches": self.caches()}

    def caches(self) -> dict[str, dict[str, int]]:
        """This process's caches (``Recorder.caches`` reports them as of the last batch)."""
        return {
            "ids": self.ids.stats(),
            "state": self.store.encoder.stats(),
            "writer_requests": self.requests.stats(),
        }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent()
    # the protocol's pipe is this process's stdout as it was started; anything printed goes to stderr
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    inp = sys.stdin.buffer
    from orchard_rec.proxy.logs import configure_logging

    configure_logging(argv[0] if argv else "info", argv[1] if len(argv) > 1 else "text")
    nice = Settings.one("writer_nice")
    if nice:
        try:
            os.nice(nice)
        except OSError:  # pragma: no cover - not permitted
            pass
    child = _Child(os.environ["ORCHARD_DB_WRITER_URL"], access_log=len(argv) > 2 and argv[2] == "access")
    # the collector tuned as ``serve`` tunes its own process (``server.tune_interpreter``): what
    # lives now (modules, the store) frozen out of collection, the young generation collected every
    # 50k allocations instead of 700 (this process builds and stores records only: 10-15 % of its
    # time went to collections, bench/PROFILE.md round 6)
    gc.collect()
    gc.freeze()
    gc.set_threshold(*Settings.one("gc_threshold"))
    _write_msg(out, orjson.dumps({"ready": True}))
    while True:
        msg = _read_msg(inp)
        if msg is None or msg[:1] == STOP:
            break
        first = msg[1:2] == b"1"
        lines = msg.split(b"\n") if len(msg) > 2 else []  # (not ``msg[2:]``: a copy of the batch)
        if lines:
            lines[0] = lines[0][2:]
        _write_msg(out, orjson.dumps(child.write(lines, first)))
    child.store.close()
    logging.shutdown()
    os._exit(0)  # nothing else to clean up: skip the interpreter's own tear-down
