"""The ``ORCHARD_*`` environment knobs, read and checked in one place.

``Settings.from_env(os.environ)`` reads every knob once and raises a one-line ``UsageError``
naming the variable for a value it cannot use; the objects that need a knob (the recorder, the
caches, the store's encoder, the proxy's app, the writer child) take it from a ``Settings`` when
they are built, never as a module is imported. The command line's own options with an
``envvar=`` (``ORCHARD_UPSTREAM``, ``ORCHARD_DB``, ``ORCHARD_WORKERS``, ``ORCHARD_DB_WRITER``,
``ORCHARD_API_KEYS``, ``ORCHARD_ADMIN_KEYS``) are the CLI's and are not here.

Each field below: its environment variable, default, unit and what it bounds. ``KNOBS`` lists
them in that order (the README's table is checked against it, tests/test_settings.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from orchard_rec.errors import UsageError

__all__ = ["KNOBS", "Knob", "Settings", "current", "readme_table"]

_MB = 1 << 20


def _megabytes(name: str, raw: str, default: Any) -> int:
    if not raw.strip():
        return int(default * _MB)
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not 0 <= mb < 1 << 40:
        raise UsageError(f"{name} must be a number of megabytes (0 or more), got {raw.strip()[:40]!r}")
    return int(mb * _MB)


def _seconds(name: str, raw: str, default: Any) -> float:
    if not raw.strip():
        return float(default)
    try:
        s = float(raw)
    except ValueError:
        s = -1.0
    if not 0 <= s < 1 << 40:
        raise UsageError(f"{name} must be a number of seconds (0 or more), got {raw.strip()[:40]!r}")
    return s


def _integer(name: str, raw: str, default: Any) -> int:
    if not raw.strip():
        return int(default)
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{name} must be a whole number, got {raw.strip()[:40]!r}") from None


def _gc(name: str, raw: str, default: Any) -> tuple[int, int, int]:
    try:
        t = tuple(int(x) for x in raw.split(","))
    except ValueError:
        t = ()
    return (t[0], t[1], t[2]) if len(t) == 3 else default  # lenient, as it always was


def _text(name: str, raw: str, default: Any) -> str:
    return raw or default


@dataclass(frozen=True)
class Knob:
    """One environment variable: its field, default (as its unit says), unit, parser and what it bounds."""

    field: str
    env: str
    default: Any
    unit: str
    parse: Callable[[str, str, Any], Any]
    bounds: str
    empty: Any = None
    """What an empty (set but blank) value means when not the default (``or 0`` knobs)."""


KNOBS: tuple[Knob, ...] = (
    Knob("ids_cache_bytes", "ORCHARD_IDS_CACHE_MB", 512, "MB", _megabytes,
         "the recorder's (and writer child's) per-session cache of parsed token ids"),
    Knob("request_cache_bytes", "ORCHARD_REQUEST_CACHE_MB", 256, "MB", _megabytes,
         "the parsed-request cache and the Responses/Messages-to-chat translation states (0: no reuse)"),
    Knob("state_cache_bytes", "ORCHARD_STATE_CACHE_MB", 1024, "MB", _megabytes,
         "the store's encoder states (delta encoding of each session's last call)"),
    Knob("tito_cache_bytes", "ORCHARD_TITO_CACHE_MB", 1024, "MB", _megabytes,
         "token-in/token-out sessions held between calls"),
    Knob("spool_bases_bytes", "ORCHARD_SPOOL_BASES_MB", 256, "MB", _megabytes,
         "the earlier calls a spool line is delta-encoded against"),
    Knob("spool_inline_bytes", "ORCHARD_SPOOL_INLINE_MB", 1, "MB", _megabytes,
         "process durability: a call smaller than this has its spool line written on the event loop"),
    Knob("spool_keep_bytes", "ORCHARD_SPOOL_KEEP_MB", 4, "MB", _megabytes,
         "spool lines kept after the database acknowledged them, instead of truncating per batch"),
    Knob("writer_linger_s", "ORCHARD_WRITER_LINGER_S", 0.005, "s", _seconds,
         "how long the async writer waits to batch calls into one transaction"),
    Knob("wal_db_delay_s", "ORCHARD_WAL_DB_DELAY_S", 0.002, "s", _seconds,
         "the write-ahead spool's wait before writing the database when idle", empty=0.0),
    Knob("db_linger_s", "ORCHARD_DB_LINGER_S", 0.01, "s", _seconds,
         "how long the database writer waits to batch calls", empty=0.0),
    Knob("db_linger_max_s", "ORCHARD_DB_LINGER_MAX_S", 0.05, "s", _seconds,
         "process durability: the database writer's longest wait while calls keep coming", empty=0.0),
    Knob("writer_nice", "ORCHARD_WRITER_NICE", 0, "niceness", _integer,
         "the writer thread's / writer child's OS niceness (0: the process's own)", empty=0),
    Knob("fault_write_delay_s", "ORCHARD_FAULT_WRITE_DELAY_S", 0, "s", _seconds,
         "a delay added to each database write (fault injection for tests)", empty=0.0),
    Knob("upstream_check_s", "ORCHARD_UPSTREAM_CHECK_S", 10, "s", _seconds,
         "seconds between active upstream health checks (an upstreams file's own interval wins)"),
    Knob("policy_tracking", "ORCHARD_POLICY_TRACKING", "on", "on/off", _text,
         "policy-version fences and polling (off: none)"),
    Knob("tito_render", "ORCHARD_TITO_RENDER", "", "whole/empty", _text,
         "token-in/token-out prompt rendering (whole: render the whole conversation each call)"),
    Knob("front", "ORCHARD_FRONT", "lean", "lean/aiohttp", _text,
         "the proxy's HTTP server for its calls (aiohttp: aiohttp's web server for every request)"),
    Knob("gc_threshold", "ORCHARD_GC_THRESHOLD", (50_000, 20, 100), "a,b,c", _gc,
         "the proxy's (and its writer process's) garbage-collector thresholds"),
    Knob("debug", "ORCHARD_DEBUG", "", "0/1", _text, "the CLI shows tracebacks (like --debug)"),
    Knob("harness_cache", "ORCHARD_HARNESS_CACHE", "", "path", _text,
         "where harness CLIs are installed (default ~/.cache/orchard-rec/harnesses)"),
    Knob("mitm_cache", "ORCHARD_MITM_CACHE", "", "path", _text,
         "the intercept runtime's folder (default ~/.cache/orchard-rec/mitm)"),
    Knob("mitm_python", "ORCHARD_MITM_PYTHON", "", "path", _text,
         "the Python >= 3.12 the intercept runtime uses (default: one found on the machine)"),
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """Every ``ORCHARD_*`` knob, checked (``KNOBS`` documents each: variable, default, unit, bound)."""

    ids_cache_bytes: int = 512 * _MB
    request_cache_bytes: int = 256 * _MB
    state_cache_bytes: int = 1024 * _MB
    tito_cache_bytes: int = 1024 * _MB
    spool_bases_bytes: int = 256 * _MB
    spool_inline_bytes: int = 1 * _MB
    spool_keep_bytes: int = 4 * _MB
    writer_linger_s: float = 0.005
    wal_db_delay_s: float = 0.002
    db_linger_s: float = 0.01
    db_linger_max_s: float = 0.05
    writer_nice: int = 0
    fault_write_delay_s: float = 0.0
    upstream_check_s: float = 10.0
    policy_tracking: str = "on"
    tito_render: str = ""
    front: str = "lean"
    gc_threshold: tuple[int, int, int] = (50_000, 20, 100)
    debug: str = ""
    harness_cache: str = ""
    mitm_cache: str = ""
    mitm_python: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Every knob from ``environ`` (default ``os.environ``); a ``UsageError`` naming the first bad one."""
        env = os.environ if environ is None else environ
        return cls(**{k.field: _read(k, env) for k in KNOBS})

    @staticmethod
    def one(field: str, environ: Mapping[str, str] | None = None) -> Any:
        """Just the knob ``field`` (what the CLI reads before a command runs, checking no other)."""
        env = os.environ if environ is None else environ
        return _read(next(k for k in KNOBS if k.field == field), env)

    @property
    def tracks_policy(self) -> bool:
        return self.policy_tracking.strip().lower() != "off"

    @property
    def tito_renders_whole(self) -> bool:
        return self.tito_render.strip().lower() == "whole"

    @property
    def lean_front(self) -> bool:
        return self.front.strip().lower() != "aiohttp"

    @property
    def debugging(self) -> bool:
        return self.debug not in ("", "0")


def _read(k: Knob, env: Mapping[str, str]) -> Any:
    raw = env.get(k.env)
    if raw is None:
        return k.parse(k.env, "", k.default)
    if raw == "" and k.empty is not None:
        return k.empty
    return k.parse(k.env, raw, k.default)


def readme_table() -> str:
    """The README's table of knobs (tests/test_settings.py checks the README holds exactly this)."""
    rows = ["| variable | default | unit | what it bounds |", "|---|---|---|---|"]
    for k in KNOBS:
        default = ",".join(map(str, k.default)) if isinstance(k.default, tuple) else str(k.default)
        rows.append(f"| `{k.env}` | {f'`{default}`' if default else '(unset)'} | {k.unit} | {k.bounds} |")
    return "\n".join(rows) + "\n"


def current() -> Settings:
    """The knobs as the process's environment says now (built when an object that needs one is)."""
    return Settings.from_env(os.environ)


assert [k.field for k in KNOBS] == [f.name for f in fields(Settings)]
