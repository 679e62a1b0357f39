"""Log lines of ``orchard-rec serve``: text or JSON on stderr, and the access log (one line per
call, when its record is stored). No HTTP here: the database writer process logs through it too."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard_rec.records import CallRecord

__all__ = ["JsonFormatter", "LoggedStore", "access_fields", "configure_logging"]

access_log = logging.getLogger("orchard_rec.access")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        d.update(getattr(record, "fields", None) or {})
        return json.dumps(d, default=str)


_TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
_TEXT_DATES = "%H:%M:%S"


class _ServeHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """The handler ``configure_logging`` installs: the access log writes a batch's lines to it in
    one piece (``LoggedStore``) when nothing else (a filter, another handler) would see them."""

    json = False


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Log lines on stderr for the ``orchard_rec`` loggers: text (``HH:MM:SS level message``)
    or one JSON object per line; ``info`` includes the access log."""
    handler = _ServeHandler(sys.stderr)
    handler.json = fmt == "json"
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT, _TEXT_DATES))
    root = logging.getLogger("orchard_rec")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


def _count(ids: Any, usage: Any, keys: tuple[str, str]) -> int | None:
    if ids is not None:
        return len(ids)
    if usage:
        for k in keys:
            v = usage.get(k)
            if isinstance(v, int):
                return int(v)
    return None


_IN = ("prompt_tokens", "input_tokens")
_OUT = ("completion_tokens", "output_tokens")


def access_fields(r: CallRecord) -> dict[str, Any]:
    """What the access log says about one call."""
    return {
        "method": r.method,
        "path": r.path,
        "session": r.session_id,
        "seq": r.seq,
        "status": r.status_code,
        "outcome": r.outcome.value,
        "tokens_in": _count(r.prompt_ids, r.usage, _IN),
        "tokens_out": _count(r.completion_ids, r.usage, _OUT),
        "latency_ms": round((r.done_at - r.received_at) * 1000, 1),
    }


_ACCESS_MSG = "%s %s session=%s status=%s outcome=%s tokens=%s/%s %.1fms"


class LoggedStore:
    """The recorder's store, logging one access line per call it stores (from the writer thread,
    or the writer process, which wraps its own store so when the proxy's is: nothing is added to
    the response path, and a line means the call is recorded)."""

    logs_access = True

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write_batch(self, records: Any, **kw: Any) -> int:
        n = int(self._store.write_batch(records, **kw))
        if access_log.isEnabledFor(logging.INFO):
            handler = _only_handler()
            if handler is not None:
                _write_lines(handler, records)
            else:
                _log_each(records, self.write_batch.__code__)
        return n


def _only_handler() -> _ServeHandler | None:
    """``serve``'s own handler when it alone would see an access line, unfiltered, else None."""
    if access_log.handlers or access_log.filters or not access_log.propagate:
        return None
    root = access_log.parent
    if root is None or root.name != "orchard_rec" or root.filters or root.propagate:
        return None
    hs = root.handlers
    if len(hs) != 1 or type(hs[0]) is not _ServeHandler or hs[0].filters or hs[0].level > logging.INFO:
        return None
    h = hs[0]
    fmt = h.formatter
    if h.json:
        return h if type(fmt) is JsonFormatter else None
    if type(fmt) is not logging.Formatter or fmt._fmt != _TEXT_FORMAT or fmt.datefmt != _TEXT_DATES:
        return None
    return h


_clock: list[Any] = [-1, ""]
"""The last second an access line was stamped with, and its ``HH:MM:SS`` (local time, as
``logging.Formatter.formatTime`` would write it)."""


def _hms(created: float) -> str:
    sec = int(created)
    if sec != _clock[0]:
        _clock[0], _clock[1] = sec, time.strftime(_TEXT_DATES, time.localtime(created))
    return str(_clock[1])


def _args(f: dict[str, Any]) -> tuple[Any, ...]:
    return (
        f["method"],
        f["path"],
        f["session"] or "-",
        f["status"],
        f["outcome"],
        "-" if f["tokens_in"] is None else f["tokens_in"],
        "-" if f["tokens_out"] is None else f["tokens_out"],
        f["latency_ms"],
    )


def _write_lines(handler: _ServeHandler, records: Any) -> None:
    """A batch's access lines, as the handler's formatter would write them, in one write and one
    flush (a ``LogRecord``, a format and a flush per line cost ~20 us per call on the writer thread)."""
    out = []
    if handler.json:
        for r in records:
            f = access_fields(r)
            created = time.time()
            d: dict[str, Any] = {
                "ts": round(created, 3),
                "level": "info",
                "logger": access_log.name,
                "msg": _ACCESS_MSG % _args(f),
            }
            d.update(f)
            out.append(json.dumps(d, default=str))
    else:  # the text line straight from the record: ``_args(access_fields(r))`` without the dict
        for r in records:
            created = time.time()
            tin = _count(r.prompt_ids, r.usage, _IN)
            tout = _count(r.completion_ids, r.usage, _OUT)
            msg = _ACCESS_MSG % (
                r.method,
                r.path,
                r.session_id or "-",
                r.status_code,
                r.outcome.value,
                "-" if tin is None else tin,
                "-" if tout is None else tout,
                round((r.done_at - r.received_at) * 1000, 1),
            )
            out.append(f"{_hms(created)} INFO {msg}")
    if not out:
        return
    text = "\n".join(out) + handler.terminator
    handler.acquire()
    try:
        handler.stream.write(text)
        handler.flush()
    except Exception:  # as ``StreamHandler.emit``: a broken stderr must not take the writer down
        handler.handleError(logging.makeLogRecord({"msg": text}))
    finally:
        handler.release()


def _log_each(records: Any, code: Any) -> None:
    """Through ``logging`` line by line: what another handler or a filter sees as before. The
    records are made here rather than by ``access_log.info``, which would look up its caller's
    frame for every line (``findCaller``); what a handler receives is the same."""
    for r in records:
        f = access_fields(r)
        record = access_log.makeRecord(
            access_log.name,
            logging.INFO,
            code.co_filename,
            code.co_firstlineno,
            _ACCESS_MSG,
            _args(f),
            None,
            code.co_name,
            {"fields": f},
        )
        access_log.handle(record)
