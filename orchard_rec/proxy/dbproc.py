"""The database writer in a process of its own (``--db-writer process``, the default under ``wal``).

Why: building a 150k-token call's record and writing it is ~1-2 ms of Python per call. In the
proxy's process that work holds the interpreter's lock (GIL) against the event loop: with calls
flowing as fast as two cores take them, ``/healthz`` waited 6-14 ms at p99 behind it (a GIL trace:
held 76 % of the time, 59 % of that by the database thread). Here the proxy's database thread
hands each spooled batch's lines, the bytes it has just fsync'd, to a child process that decodes
them (``capline.Decoder``, as a replay does), builds the records (``Capture.to_record``) and writes
them (``Store.write_batch``); the proxy's process keeps only the response path and the spool.

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
import logging
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

import orjson

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
    buf = bytearray()
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
    f.write(_LEN.pack(sum(map(len, parts))))
    for p in parts:
        f.write(p)
    f.flush()


class WriterProcess:
    """The proxy's side: starts the child, hands it batches, reads its answers (one thread uses it:
    the recorder's database thread)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._p: subprocess.Popen[bytes] | None = None
        self.started = 0
        """Children started so far (more than one: some died)."""

    @property
    def pid(self) -> int | None:
        return None if self._p is None else self._p.pid

    def start(self) -> None:
        root = logging.getLogger("orchard_rec")
        fmt = "json" if any(type(h.formatter).__name__ == "_JsonFormatter" for h in root.handlers) else "text"
        level = logging.getLevelName(root.getEffectiveLevel()).lower()
        self._p = subprocess.Popen(
            [sys.executable, "-c", "from orchard_rec.proxy.dbproc import main; main()", level, fmt],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "ORCHARD_DB_WRITER_URL": self.url},  # not on the command line: it may hold a password
        )
        self.started += 1

    def write(self, lines: list[bytes], *, first: bool) -> Result:
        """Decode, build and store ``lines`` in the child; raises ``WriterDied`` if it is gone."""
        if self._p is None or self._p.poll() is not None:
            self._reap()
            self.start()
        p = self._p
        assert p is not None and p.stdin is not None and p.stdout is not None
        try:
            _write_msg(p.stdin, WRITE, b"1" if first else b"0", b"\n".join(lines))
            answer = _read_msg(p.stdout)
        except (BrokenPipeError, ConnectionError, OSError, ValueError) as exc:
            self._reap()
            raise WriterDied(f"the database writer process failed: {type(exc).__name__}: {exc}") from None
        if answer is None:
            code = self._reap()
            raise WriterDied(f"the database writer process exited (code {code}) with a batch unanswered")
        d = orjson.loads(answer)
        return Result(int(d["built"]), bool(d["ok"]), d.get("error"))

    def close(self, timeout: float = 30.0) -> None:
        p = self._p
        if p is None:
            return
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
        p, self._p = self._p, None
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


class _Child:
    def __init__(self, url: str) -> None:
        from orchard_rec.errors import env_megabytes
        from orchard_rec.proxy import capline
        from orchard_rec.proxy.idcut import IdParser
        from orchard_rec.proxy.reqparse import RequestCache
        from orchard_rec.storage.store import Store

        self.store = Store(url)
        self.ids = IdParser(env_megabytes("ORCHARD_IDS_CACHE_MB", 512))
        self.requests = RequestCache(env_megabytes("ORCHARD_REQUEST_CACHE_MB", 256))
        self.decoder = capline.Decoder(
            self.store, requests=self.requests, max_bytes=env_megabytes("ORCHARD_SPOOL_BASES_MB", 256)
        )
        self.delay = float(os.environ.get("ORCHARD_FAULT_WRITE_DELAY_S", "0") or 0)

    def write(self, lines: list[bytes], first: bool) -> dict[str, Any]:
        from orchard_rec.proxy.capline import record_of_line

        records = []
        for line in lines:
            try:
                records.append(record_of_line(self.decoder, line, self.ids))
            except Exception:  # the proxy keeps the line in the spool; its replay sets it aside
                log.exception("database writer: a spooled line cannot become a record")
        try:
            if self.delay:
                time.sleep(self.delay)
            if records:
                self.store.write_batch(records, known_new=first)
        except Exception as exc:
            log.warning("database write failed (%d calls): %s: %s", len(records), type(exc).__name__, exc)
            return {"built": len(records), "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        self.decoder.prune()
        return {"built": len(records), "ok": True, "error": None}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent()
    # the protocol's pipe is this process's stdout as it was started; anything printed goes to stderr
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    inp = sys.stdin.buffer
    from orchard_rec.proxy.server import configure_logging

    configure_logging(argv[0] if argv else "info", argv[1] if len(argv) > 1 else "text")
    nice = int(os.environ.get("ORCHARD_WRITER_NICE", "0") or 0)
    if nice:
        try:
            os.nice(nice)
        except OSError:  # pragma: no cover - not permitted
            pass
    child = _Child(os.environ["ORCHARD_DB_WRITER_URL"])
    while True:
        msg = _read_msg(inp)
        if msg is None or msg[:1] == STOP:
            break
        first = msg[1:2] == b"1"
        lines = msg[2:].split(b"\n") if len(msg) > 2 else []
        _write_msg(out, orjson.dumps(child.write(lines, first)))
    child.store.close()
    return 0


