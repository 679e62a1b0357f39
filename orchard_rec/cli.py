"""The ``orchard-rec`` command line. Each command parses options and calls one library function.

Mistakes are reported in one or two lines saying what to do, never a traceback (``--debug``
or ``ORCHARD_DEBUG=1`` shows it). Exit codes: 0 success, 1 a runtime failure (the database,
the network, a file, an empty selection), 2 a usage mistake (an option, a value, a URL),
130 interrupted. Configuration is checked before anything is created or a "ready" line is
printed. Read commands (``sessions``, ``calls``, ``show``, ``export``) open the database
read-only: they never create, migrate or write it. Messages go to stderr; data to stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import click
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from orchard_rec.clihelp import teach
from orchard_rec.errors import OrchardError, UsageError
from orchard_rec.storage.store import default_db_url

if TYPE_CHECKING:
    from orchard_rec.proxy.config import ProxyConfig
    from orchard_rec.records import CallRecord
    from orchard_rec.storage.store import Store

__all__ = ["CliError", "CliUsageError", "app", "main"]

# -- errors ------------------------------------------------------------------------------------------

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(OrchardError):
    """A failure the user can act on (exit code 1): ``message`` (what), ``hint`` (what to do)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class CliUsageError(UsageError):
    """A mistake in the command line (exit code 2), with what to do instead."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def usage_error(message: str, hint: str | None = None) -> CliUsageError:
    return CliUsageError(message, hint)


_debug = False

# typer >= 0.20 vendors its own click (``typer._click``): catch both families.
_CLICK: list[Any] = [click.exceptions]
with contextlib.suppress(ImportError):
    from typer._click import exceptions as _typer_click

    _CLICK.append(_typer_click)
_USAGE = tuple({m.UsageError for m in _CLICK})
_NO_ARGS = tuple({m.NoArgsIsHelpError for m in _CLICK if hasattr(m, "NoArgsIsHelpError")})
_CLICK_ERROR = tuple({m.ClickException for m in _CLICK})
_EXIT = tuple({getattr(m, "Exit", typer.Exit) for m in _CLICK} | {typer.Exit})
_ABORT = tuple({getattr(m, "Abort", typer.Abort) for m in _CLICK} | {typer.Abort, KeyboardInterrupt})


def _report(message: str, hint: str | None = None) -> None:
    typer.echo(f"error: {message}", err=True)
    if hint:
        typer.echo(f"  {hint}", err=True)


def _explain(exc: BaseException) -> tuple[str, str | None, int]:
    """One exception → (message, hint, exit code)."""
    from sqlalchemy import exc as sa_exc

    if isinstance(exc, OrchardError):
        return exc.message, getattr(exc, "hint", None), exc.exit_code
    if isinstance(exc, sa_exc.SQLAlchemyError):
        err = _db_error(exc, None)
        return err.message, err.hint, err.exit_code
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        return (f"{what}: {exc.filename}" if exc.filename else what), None, EXIT_FAILURE
    return (
        f"{type(exc).__name__}: {exc}",
        "an unexpected error: run again with --debug for the traceback, and please report it",
        EXIT_FAILURE,
    )


class _Group(TyperGroup):
    """Every command's errors end here: one or two lines on stderr and an exit code. Every
    command's help gets its examples and metavars here too (``orchard_rec.clihelp``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        teach(self)

    def main(  # type: ignore[override]
        self,
        args: list[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        _check_arguments(self)
        if not standalone_mode:
            return super().main(
                args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra
            )
        global _debug
        argv = list(sys.argv[1:] if args is None else args)
        cut = argv.index("--") if "--" in argv else len(argv)
        _debug = os.environ.get("ORCHARD_DEBUG", "") not in ("", "0")
        if "--debug" in argv[:cut]:
            argv.remove("--debug")
            _debug = True
        try:
            rv = super().main(
                args=argv,
                prog_name=prog_name or "orchard-rec",
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except _NO_ARGS as exc:  # `orchard-rec`, `orchard-rec db`: the help, and success
            typer.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
            sys.exit(0)
        except _USAGE as exc:
            path = exc.ctx.command_path if exc.ctx is not None else "orchard-rec"
            _report(exc.format_message(), f"see: {path} --help")
            sys.exit(EXIT_USAGE)
        except _CLICK_ERROR as exc:
            _report(exc.format_message())
            sys.exit(exc.exit_code)
        except _EXIT as exc:
            sys.exit(exc.exit_code)
        except _ABORT:
            typer.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            if _debug:
                raise
            message, hint, code = _explain(exc)
            _report(message, hint)
            sys.exit(code)
        if rv == EXIT_INTERRUPTED:  # typer turns a KeyboardInterrupt into a silent 130
            typer.echo("interrupted", err=True)
        sys.exit(rv if isinstance(rv, int) else 0)


HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


def _check_arguments(group: Any) -> None:
    """Checks every command shares, run before its body: number options refuse ``nan`` and
    ``inf`` (click takes them), and session ids follow the one rule (``records.SESSION_ID_RULE``)."""
    import functools
    import math

    from orchard_rec.records import SESSION_ID_RULE, session_id_problem

    stack = [group]
    while stack:
        cmd = stack.pop()
        stack.extend(getattr(cmd, "commands", {}).values())
        callback = getattr(cmd, "callback", None)
        if callback is None or getattr(callback, "arguments_checked", False):
            continue
        options = {p.name: (p.opts or [p.name])[0] for p in cmd.params}

        @functools.wraps(callback)
        def checked(*args: Any, _callback: Any = callback, _options: Any = options, **kwargs: Any) -> Any:
            for name, value in kwargs.items():
                shown = _options.get(name, name)
                shown = "SESSION" if not shown.startswith("-") and name == "session" else shown
                for v in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(v, float) and not math.isfinite(v):
                        raise usage_error(f"{shown} {v}: not a finite number")
                    problem = session_id_problem(v) if name == "session" and isinstance(v, str) else None
                    if problem is not None:
                        raise usage_error(
                            f"{shown} {v[:60]!r} is not a session id: {problem}", SESSION_ID_RULE
                        )
            return _callback(*args, **kwargs)

        checked.arguments_checked = True  # type: ignore[attr-defined]
        cmd.callback = checked


def _typer(**kw: Any) -> typer.Typer:
    return typer.Typer(
        no_args_is_help=True, rich_markup_mode=None, add_completion=False, context_settings=HELP_OPTIONS, **kw
    )


app = _typer(cls=_Group, help="Record LLM calls of agent harnesses and turn them into training samples.")
db_app = _typer(help="Database schema (Alembic migrations shipped in the package).")
app.add_typer(db_app, name="db")
harness_app = _typer(help="Agent harnesses: configuration snippets and installs.")
app.add_typer(harness_app, name="harness")
train_app = _typer(help="Reference training loops (needs the train extra: torch).")
app.add_typer(train_app, name="train")
demo_app = typer.Typer(
    context_settings=HELP_OPTIONS,
    rich_markup_mode=None,
    add_completion=False,
    invoke_without_command=True,
    help="The bundled demo: the whole loop (default), or its model server alone (`demo upstream`).",
)
app.add_typer(demo_app, name="demo")

console = Console()
"""Data (tables, samples) on stdout."""
err = Console(stderr=True)
"""Messages, progress and warnings on stderr."""


def _warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


def _version(value: bool) -> None:
    if value:
        from orchard_rec import __version__

        typer.echo(f"orchard-rec {__version__}")
        raise typer.Exit()


@app.callback(cls=_Group)
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show the traceback of an error (also after a command, or ORCHARD_DEBUG=1)."
    ),
) -> None:
    """Record LLM calls of agent harnesses and turn them into training samples."""


DbOpt = typer.Option(
    default_db_url(),
    "--db",
    envvar="ORCHARD_DB",
    help="SQLAlchemy URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB.",
)

ProxyMode = Literal["token", "passthrough", "tito"]
OnMismatch = Literal["split", "realign"]
Credit = Literal["assistant", "last-turn", "turn-weights", "value", "critical-step"]

FORCE_HELP = "Replace an existing file that is not an earlier orchard-rec output (never a database)."
# the session selection every command that reads samples shares (export, teacher, reward ...)
SessionsOpt = typer.Option(None, "--session", help="Only these sessions (repeatable).")
SinceOpt = typer.Option(None, "--since", help="Only sessions active since (ISO date/time, UTC).")
HarnessOpt = typer.Option(None, "--harness", help="Only sessions of this harness.")
OnMismatchOpt = typer.Option(
    "split", "--on-mismatch", help="A prompt that extends no sample: split (a linked sample) or realign."
)
CreditOpt = typer.Option(
    "assistant",
    "--credit",
    help="Which generated tokens train: assistant (all), last-turn, turn-weights, or value (rising steps).",
)
SpoolOpt = typer.Option(
    None, "--spool", help="Spool file (default: beside a SQLite db, else .orchard-spool/)."
)
HostOpt = typer.Option("127.0.0.1", "--host", help="Address to listen on (one of this machine's).")


def _check_statuses(values: list[str] | None) -> list[str] | None:
    """``--status``: each one of the session statuses (exit 2 otherwise)."""
    from orchard_rec.records import SESSION_STATUSES

    for v in values or ():
        if v not in SESSION_STATUSES:
            raise usage_error(f"--status {v!r} is not one of: {', '.join(SESSION_STATUSES)}")
    return values


StatusMetavar = "[completed|truncated|aborted|failed]"


# -- the database ------------------------------------------------------------------------------------


def _parse_db(db: str) -> Any:
    """The URL of ``--db``, checked: only SQLite and PostgreSQL (exit 2 otherwise)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    hint = "use sqlite:///PATH (e.g. sqlite:///./orchard.db) or postgresql+psycopg://USER@HOST/DB"
    try:
        url = make_url(db)
    except (ArgumentError, ValueError):
        raise usage_error(f"--db {db!r} is not a database URL", hint) from None
    backend = url.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise usage_error(f"--db {db!r}: orchard-rec stores to SQLite or PostgreSQL, not {backend}", hint)
    if backend == "sqlite" and url.database in (None, "", ":memory:"):
        raise usage_error(f"--db {db!r} names no file", hint)
    if backend == "postgresql":
        driver = url.get_driver_name()
        try:
            __import__({"psycopg": "psycopg", "psycopg2": "psycopg2"}.get(driver, driver))
        except ImportError:
            raise CliError(
                f"--db {_where(url)}: the PostgreSQL driver {driver} is not installed",
                "pip install 'orchard-rec[postgres]' and use postgresql+psycopg://...",
            ) from None
    return url


def _where(url: Any) -> str:
    if url.get_backend_name() == "sqlite":
        return str(url.database)
    return str(url.render_as_string(hide_password=True))


def _db_error(exc: BaseException, url: Any) -> CliError | CliUsageError:
    """A database failure in words: unreachable server, unwritable folder, ..."""
    from sqlalchemy import exc as sa_exc

    where = _where(url) if url is not None else "the database"
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    if isinstance(exc, sa_exc.OperationalError):
        low = first.lower()
        if url is not None and url.get_backend_name() == "postgresql":
            return CliError(
                f"cannot reach PostgreSQL at {where}: {first}",
                "is the server running and the URL (host, port, user, database) right? (--db or ORCHARD_DB)",
            )
        if "readonly" in low or "read-only" in low:
            return CliError(
                f"{where} cannot be written: {first}", "check the file's and its folder's permissions"
            )
        return CliError(f"cannot open the database {where}: {first}")
    if isinstance(exc, sa_exc.ArgumentError):
        return usage_error(f"bad --db URL: {first}")
    return CliError(f"database error on {where}: {first}")


def open_read(db: str) -> Store:
    """The database for a read command: must exist, must be migrated; opened read-only."""
    from sqlalchemy import exc as sa_exc

    from orchard_rec.storage import migrate, queries
    from orchard_rec.storage.store import Store

    url = _parse_db(db)
    if url.get_backend_name() == "sqlite" and not Path(url.database).is_file():
        shown = url.database if db != default_db_url() else "./orchard.db"
        raise CliError(f"no orchard-rec database at {shown} (use --db or ORCHARD_DB)")
    store = Store(db, readonly=True)
    try:
        rev = queries.schema_revision(store)
    except sa_exc.SQLAlchemyError as exc:
        store.close()
        raise _db_error(exc, url) from None
    head = migrate.head()
    if rev != head:
        store.close()
        upgrade = f"orchard-rec db upgrade --db {db}" if db != default_db_url() else "orchard-rec db upgrade"
        if rev is None:
            raise CliError(
                f"{_where(url)} is not an orchard-rec database (no schema)",
                f"`{upgrade}` creates the schema (serve does it too)",
            )
        if not migrate.known(rev):
            raise CliError(
                f"{_where(url)} was written by a newer orchard-rec (schema {rev})",
                "upgrade orchard-rec to read it",
            )
        raise CliError(
            f"{_where(url)} needs a migration (schema {rev}, this orchard-rec reads {head})",
            f"migrate it with `{upgrade}` (or start `orchard-rec serve`, which migrates)",
        )
    return store


def open_write(db: str, *, migrate_schema: bool = True) -> Store:
    """The database for a command that writes: the folder is checked, the schema migrated."""
    from sqlalchemy import exc as sa_exc

    from orchard_rec.storage.store import Store

    url = _parse_db(db)
    if url.get_backend_name() == "sqlite":
        path = Path(url.database)
        folder = path.parent
        if not folder.is_dir():
            raise CliError(
                f"cannot create the database {path}: folder {folder} does not exist",
                "create the folder or choose another --db",
            )
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise CliError(
                f"cannot write the database {path}: {'it' if path.exists() else 'its folder'} is read-only",
                "choose a writable --db (reading commands work on a read-only database)",
            )
    store = Store(db)
    try:
        if migrate_schema:
            store.upgrade()
        else:
            from orchard_rec.storage.queries import ping

            ping(store)
    except sa_exc.SQLAlchemyError as exc:
        store.close()
        raise _db_error(exc, url) from None
    return store


@contextlib.contextmanager
def _reading(db: str) -> Iterator[Store]:
    store = open_read(db)
    try:
        yield store
    finally:
        store.close()


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _since(value: datetime | None) -> float | None:
    return value.replace(tzinfo=value.tzinfo or UTC).timestamp() if value else None


def _table(headers: list[str], rows: list[list[str]]) -> None:
    """A table on a terminal; tab-separated lines, never cut, when piped."""
    if console.is_terminal:
        t = Table(*headers)
        for r in rows:
            t.add_row(*r)
        console.print(t)
        return
    typer.echo("\t".join(headers))
    for r in rows:
        typer.echo("\t".join(r))


# -- tokenizers ----------------------------------------------------------------------------------------


def _load_tokenizer(name: str, *, hf: bool) -> Any:
    """``--tokenizer``: ``demo``, a folder, a tokenizer.json, or a cached Hugging Face id (offline)."""
    from orchard_rec.tokenizer import load_hf_tokenizer, load_tokenizer

    p = Path(name).expanduser()
    if name != "demo" and not p.exists() and (name.startswith(("/", ".", "~")) or os.sep * 2 in name):
        raise usage_error(
            f"--tokenizer {name}: no such file or folder",
            "give the model's folder (with tokenizer.json / tokenizer_config.json), or 'demo'",
        )
    from orchard_rec.signals import interrupt_deferred

    try:
        with interrupt_deferred():  # transformers imports torch: Ctrl-C inside would abort
            return load_hf_tokenizer(str(p) if p.exists() else name) if hf else load_tokenizer(name)
    except Exception as exc:
        if _debug:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CliError(
            f"cannot load tokenizer {name!r}: {first}",
            "give a local model folder (nothing is downloaded); needs the hf extra for chat templates",
        ) from None


# -- serve -----------------------------------------------------------------------------------------------


def _check_upstream(upstream: str, option: str = "--upstream", *, openai_style: bool = True) -> str:
    from urllib.parse import urlsplit

    u = upstream.strip().rstrip("/")
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        guess = f"http://{u}" if "://" not in u else f"http://{u.split('://', 1)[1]}"
        raise usage_error(f"{option} {upstream!r} is not an http(s) URL", f"e.g. {option} {guess}") from None
    if openai_style and not parts.path.rstrip("/").endswith("/v1"):
        _warn(
            f"{option} {u} has no /v1 path: OpenAI-style servers (vLLM, SGLang) serve under /v1, "
            f"so this may need {option} {u}/v1"
        )
    return u


def _fleet_urls(given: list[str] | None, path: Path | None) -> list[str]:
    """``--upstream`` values (each may be a comma-separated list) and ``--upstreams-file`` lines."""
    urls = [u.strip() for v in given or () for u in v.split(",") if u.strip()]
    if path is not None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise usage_error(f"--upstreams-file {path}: cannot read it ({exc})") from None
        urls += [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]
    if not urls:
        raise usage_error(
            "serve needs an upstream: --upstream URL (repeatable), --upstreams-file PATH or ORCHARD_UPSTREAM",
            "e.g. --upstream http://127.0.0.1:8000/v1",
        )
    return list(dict.fromkeys(urls))


def _check_port(host: str, port: int, option: str = "--host") -> None:
    """The address is this machine's and the port free (port 0: the address only)."""
    import errno
    import socket

    if not 0 <= port <= 65535:
        raise usage_error(f"port {port} is not a port: 0 to 65535 (0: any free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise usage_error(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr)
    except PermissionError:
        raise CliError(f"no permission to listen on {host}:{port}", "choose a --port above 1023") from None
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise usage_error(
                f"{option} {host} is not an address of this machine",
                "use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its own addresses",
            ) from None
        raise CliError(
            f"port {port} on {host} is in use ({exc.strerror})",
            "stop what listens there (another orchard-rec?) or choose another --port",
        ) from None
    finally:
        s.close()


def _check_spool(spool: str | None, db: str) -> None:
    """No other proxy holds the spool (its lock), checked before anything is created."""
    import fcntl

    from orchard_rec.proxy.recorder import default_spool

    path = Path(spool) if spool else default_spool(db)
    if not path.is_file():
        return
    with open(path, "rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CliError(
                f"spool {path} is in use by another orchard-rec (serve or intercept) on this database",
                "stop that one, or give this one its own --spool (or another --db)",
            ) from None
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _proxy_config(**kw: Any) -> ProxyConfig:
    from pydantic import ValidationError

    from orchard_rec.proxy.config import ProxyConfig

    try:
        return ProxyConfig(**kw)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e.get("loc", ())) or "option"
        raise usage_error(f"--{where.replace('_', '-')}: {e.get('msg')}") from None


@app.command()
def serve(
    upstream: list[str] | None = typer.Option(
        None,
        "--upstream",
        envvar="ORCHARD_UPSTREAM",
        help="Model server base URL including /v1 (repeatable: a fleet; env: comma-separated).",
    ),
    upstreams_file: Path | None = typer.Option(
        None, "--upstreams-file", help="More upstreams: one URL per line (# comments)."
    ),
    route: Literal["session", "least-busy", "round-robin"] = typer.Option(
        "session", "--route", help="Fleet routing: session (sticky, bounded load), least-busy, round-robin."
    ),
    route_epsilon: float = typer.Option(
        0.5,
        "--route-epsilon",
        help="session: a server may hold up to ceil((1+eps) x average) calls in flight.",
    ),
    routing_header: str | None = typer.Option(
        None,
        "--routing-header",
        help="Also send the session id upstream in this header (e.g. X-SMG-Routing-Key).",
    ),
    health_interval: float | None = typer.Option(
        None, "--health-interval", help="Seconds between upstream health checks (default 10)."
    ),
    db: str = DbOpt,
    host: str = HostOpt,
    port: int = typer.Option(8100, "--port", min=0, max=65535, help="0: any free port."),
    mode: ProxyMode = typer.Option(
        "token",
        "--mode",
        help="token (ask the upstream for token ids), passthrough, or tito (render here, send ids).",
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="tito: the model's HF tokenizer (path, or 'demo')."
    ),
    upstream_kind: Literal["vllm", "sglang"] = typer.Option(
        "vllm", "--upstream-kind", help="tito: vllm (/v1/completions) or sglang (/generate)."
    ),
    tool_parser: Literal["hermes"] = typer.Option("hermes", "--tool-parser", help="tito: tool-call parser."),
    max_body_mb: float = typer.Option(
        64.0, "--max-body-mb", help="Largest request body accepted, in megabytes (> 0)."
    ),
    connect_timeout: float = typer.Option(
        10.0, "--connect-timeout", help="Seconds to wait for the upstream to accept a connection."
    ),
    read_timeout: float = typer.Option(
        600.0, "--read-timeout", help="Longest silence between two upstream bytes."
    ),
    durability: Literal["process", "machine", "async", "wal"] = typer.Option(
        "process",
        "--durability",
        help="What a recorded call survives. process (default): the last byte waits for the spool's write(2),"
        " fsync'd within --fsync-interval (the proxy's crash loses nothing, a power loss at most that);"
        " machine: waits for the fsync (group commit); async: recorded after the response. wal: old name of machine.",
    ),
    fsync_interval: float = typer.Option(
        0.1,
        "--fsync-interval",
        min=0.001,
        max=60.0,
        help="process durability: the longest a written spool line waits for its fsync, in seconds (default 0.1).",
    ),
    db_writer: Literal["thread", "process"] = typer.Option(
        "thread",
        "--db-writer",
        envvar="ORCHARD_DB_WRITER",
        help="process/machine: build and write records in a thread (default) or a child process (off the event loop's GIL; more memory).",
    ),
    spool: str | None = SpoolOpt,
    max_inflight: int = typer.Option(
        4096, "--max-inflight", help="Calls in flight before 429 (0: no limit)."
    ),
    max_queue_bytes: int = typer.Option(
        256 * 1024 * 1024,
        "--max-queue-bytes",
        help="Bytes of calls waiting for the database before 429 (default 256 MiB; 0: no limit).",
    ),
    pace_queue_bytes: int = typer.Option(
        32 * 1024 * 1024,
        "--pace-queue-bytes",
        help="Above this many queued bytes new calls wait for the writer instead of queueing"
        " (default 32 MiB; 0: off).",
    ),
    api_key: list[str] | None = typer.Option(
        None,
        "--api-key",
        envvar="ORCHARD_API_KEYS",
        help="Client key, KEY or KEY:SESSION_PREFIX (repeatable; env: comma-separated).",
    ),
    admin_key: list[str] | None = typer.Option(
        None, "--admin-key", envvar="ORCHARD_ADMIN_KEYS", help="Key for admin routes (outcomes)."
    ),
    upstream_key_env: str | None = typer.Option(
        None, "--upstream-key-env", help="Name of the env var holding the upstream's API key."
    ),
    shutdown_timeout: float = typer.Option(
        30.0, "--shutdown-timeout", help="On SIGTERM/Ctrl-C, wait this long for calls in flight."
    ),
    log_level: Literal["debug", "info", "warning", "error"] = typer.Option(
        "info", "--log-level", help="info: one access-log line per call; warning: problems only."
    ),
    log_format: Literal["text", "json"] = typer.Option(
        "text", "--log-format", help="Log lines as text or one JSON object per line."
    ),
    ui: bool = typer.Option(
        False, "--ui", help="Also serve the trajectory viewer at /ui (behind --admin-key when keys are set)."
    ),
    ui_resend: bool = typer.Option(
        False, "--ui-resend", help="With --ui: allow 'send again' (replays a recorded call to the upstream)."
    ),
    policy_refresh: float = typer.Option(
        1.0,
        "--policy-refresh",
        min=0,
        help="Seconds between asks of the server's policy version (GET /weight_info, vLLM with VLLM_SERVER_DEV_MODE=1); 0: only the trainer's word (POST /v1/orchard/policy).",
    ),
    tito_endpoint: Literal["completions", "generate"] = typer.Option(
        "completions",
        "--tito-endpoint",
        help="tito with vLLM: /v1/completions, or /inference/v1/generate (vllm serve --enable-scale-out: per-token weight_versions, aborted generations continued).",
    ),
    cache_salt: Literal["off", "policy"] = typer.Option(
        "off",
        "--cache-salt",
        help="policy: send cache_salt = the current policy version with chat/completions calls (no prefix cache across weight updates).",
    ),
    routed_experts: bool = typer.Option(
        False,
        "--routed-experts",
        help="MoE routing replay: record the routed_experts the server answers (vLLM --enable-return-routed-experts), token and tito mode.",
    ),
    workers: str = typer.Option(
        "1",
        "--workers",
        envvar="ORCHARD_WORKERS",
        help="Proxy processes on the one port (SO_REUSEPORT), each with its own spool SPOOL.w<k>; auto: one per core.",
    ),
) -> None:
    """Run the recording proxy."""
    from orchard_rec.proxy.server import configure_logging, serve_proxy
    from orchard_rec.proxy.workers import workers_count

    try:
        n_workers = workers_count(workers)
    except ValueError:
        raise usage_error(f"--workers {workers}: a count of processes (1 or more), or auto") from None
    if max_queue_bytes < 0:
        raise usage_error("--max-queue-bytes must be >= 0", "0 means no limit")
    if max_body_mb <= 0:
        raise usage_error(f"--max-body-mb {max_body_mb:g}: must be above 0", "the default is 64 (megabytes)")
    if pace_queue_bytes < 0:
        raise usage_error("--pace-queue-bytes must be >= 0", "0 turns pacing off")
    if durability == "wal":
        _warn(
            "--durability wal is now called machine (the same: the last byte after the spool's fsync);"
            " wal will be removed. The default, process, survives the proxy's crash at write(2) speed."
        )
        durability = "machine"
    urls = _fleet_urls(upstream, upstreams_file)
    urls = [_check_upstream(u, openai_style=not (mode == "tito" and upstream_kind == "sglang")) for u in urls]
    if health_interval is not None and health_interval <= 0:
        raise usage_error(
            f"--health-interval {health_interval:g}: must be above 0", "the default is 10 (seconds)"
        )
    if mode == "tito" and not tokenizer:
        raise usage_error(
            "--mode tito needs --tokenizer", "the model's Hugging Face tokenizer folder (or 'demo')"
        )

    def _keys(values: list[str] | None) -> tuple[str, ...]:
        return tuple(k.strip() for v in values or () for k in v.split(",") if k.strip())

    upstream_key = None
    if upstream_key_env:
        upstream_key = os.environ.get(upstream_key_env)
        if not upstream_key:
            raise usage_error(
                f"--upstream-key-env: the environment variable {upstream_key_env} is empty or unset"
            )
    cfg = _proxy_config(
        upstream=urls[0],
        fleet=tuple(urls[1:]),
        route=route,
        route_epsilon=route_epsilon,
        routing_header=routing_header,
        health_interval=health_interval,
        db=db,
        mode=mode,
        max_body_bytes=max(1, int(max_body_mb * 1024 * 1024)),
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        durability=durability,
        fsync_interval=fsync_interval,
        db_writer=db_writer,
        spool=spool,
        max_inflight=max_inflight,
        max_queue_bytes=max_queue_bytes,
        pace_queue_bytes=pace_queue_bytes,
        api_keys=_keys(api_key),
        admin_keys=_keys(admin_key),
        upstream_key=upstream_key,
        tokenizer=tokenizer,
        upstream_kind=upstream_kind,
        tool_parser=tool_parser,
        ui=ui,
        ui_resend=ui_resend,
        policy_refresh=policy_refresh,
        tito_endpoint=tito_endpoint,
        cache_salt=cache_salt,
        routed_experts=routed_experts,
    )
    if ui_resend and not ui:
        raise usage_error("--ui-resend goes with --ui")
    if tokenizer:
        _load_tokenizer(tokenizer, hf=True)  # fails here, in words, not inside the app
    _check_port(host, port)
    _check_spool(spool, db)
    _check_writable(db)  # reachable, migrated, and takes a write: before anything listens
    configure_logging(log_level, log_format)
    if n_workers == 1:
        from orchard_rec.proxy.app import default_spool
        from orchard_rec.proxy.workers import replay_orphans

        # the spools of an earlier run with workers (``SPOOL.w<k>``) are stored before serving
        replay_orphans(cfg, Path(cfg.spool) if cfg.spool else default_spool(cfg.db), 1)
        serve_proxy(cfg, host, port, shutdown_timeout=shutdown_timeout)
        return
    _serve_workers(cfg, host, port, n_workers, shutdown_timeout)


def _serve_workers(cfg: ProxyConfig, host: str, port: int, n: int, shutdown_timeout: float) -> None:
    """``serve --workers N`` (N >= 2): ``proxy.workers``; a spool in use is said in one line."""
    from orchard_rec.proxy.app import default_spool
    from orchard_rec.proxy.workers import serve_workers, spool_paths

    base = Path(cfg.spool) if cfg.spool else default_spool(cfg.db)
    for path in spool_paths(base, n):
        _check_spool(str(path), cfg.db)
    try:
        code = serve_workers(cfg, host, port, n, shutdown_timeout=shutdown_timeout, base=base)
    except RuntimeError as exc:
        raise CliError(
            str(exc), "stop that one, or give this one its own --spool (or another --db)"
        ) from None
    if code:
        raise typer.Exit(code)


def _check_writable(db: str) -> None:
    """``serve``'s database: opened, migrated, and a trial write rolled back (a damaged SQLite
    file fails here, in one line, instead of spooling every call after "ready")."""
    from sqlalchemy import exc as sa_exc

    from orchard_rec.storage.health import check_writable

    store = open_write(db)
    try:
        check_writable(store)
    except sa_exc.SQLAlchemyError as exc:
        url = _parse_db(db)
        err = _db_error(exc, url)
        damaged = url.get_backend_name() == "sqlite" and "malformed" in str(exc)
        raise CliError(
            err.message,
            "the file is damaged: give a new --db (or restore a backup); `sqlite3 FILE .recover` may save what it holds"
            if damaged
            else err.hint,
        ) from None
    finally:
        store.close()


# -- reading -------------------------------------------------------------------------------------------------


def _session_rows(
    store: Store,
    *,
    limit: int | None,
    since: float | None,
    harness: str | None,
    status: list[str] | None,
    min_reward: float | None,
) -> tuple[list[dict[str, Any]], int]:
    """The newest ``limit`` sessions matching the filters (oldest first), and how many matched."""
    from orchard_rec.storage.queries import newest_sessions
    from orchard_rec.storage.store import _epoch

    rows, total = newest_sessions(
        store, limit=limit if min_reward is None else None, since=since, harness=harness, status=status
    )
    if min_reward is not None:
        rows = [r for r in rows if _scalar_reward(r["reward"]) is not None]
        rows = [r for r in rows if (_scalar_reward(r["reward"]) or 0.0) >= min_reward]
        total = len(rows)
        rows = rows[:limit] if limit else rows
    sizes = _session_sizes(store, [r["id"] for r in rows])
    out = []
    for r in reversed(rows):
        model, tokens = sizes.get(r["id"], (None, None))
        out.append(
            {
                "id": r["id"],
                "calls": r["call_count"],
                "status": r["status"],
                "reward": r["reward"],
                "model": model,
                "tokens": tokens,
                "harness": r["harness"],
                "metadata": r["outcome_metadata"] or {},
                "created_at": _epoch(r["created_at"]),
                "updated_at": _epoch(r["updated_at"]),
            }
        )
    return out, total


def _scalar_reward(v: Any) -> float | None:
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = json.loads(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None


def _session_sizes(store: Store, ids: list[str]) -> dict[str, tuple[str | None, int | None]]:
    """Each session's model (its last call's) and size: the largest context of its calls
    (``records.context_tokens``: ids when recorded, else usage), as the viewer counts it."""
    from orchard_rec.records import context_tokens

    out: dict[str, tuple[str | None, int | None]] = {}
    for k in range(0, len(ids), 500):
        for summary, calls in store.iter_sessions_calls(ids[k : k + 500]):
            model, size = None, None
            for c in calls:
                model = c.model or model
                n = context_tokens(c)
                size = n if size is None or (n is not None and n > size) else size
            out[summary.id] = (model, size)
    return out


def _reward_text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = json.loads(v)
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items())
    return str(v)


@app.command()
def sessions(
    db: str = DbOpt,
    as_json: bool = typer.Option(False, "--json", help="A JSON list instead of a table."),
    limit: int | None = typer.Option(
        None,
        "--limit",
        "-n",
        help="The newest N sessions (default: 100 in a table, all with --json; 0: all).",
    ),
    since: datetime | None = typer.Option(None, "--since", help="Active since (ISO date/time, UTC)."),
    harness: str | None = typer.Option(None, "--harness", help="Only sessions of this harness."),
    status: list[str] | None = typer.Option(
        None, "--status", metavar=StatusMetavar, help="Outcome status (repeatable)."
    ),
    min_reward: float | None = typer.Option(None, "--min-reward", help="Scalar reward at least this."),
) -> None:
    """List recorded sessions (newest last) with their outcome, model and size."""
    _check_statuses(status)
    n = limit if limit is not None else (None if as_json else 100)
    with _reading(db) as store:
        rows, total = _session_rows(
            store, limit=n or None, since=_since(since), harness=harness, status=status, min_reward=min_reward
        )
    if as_json:
        typer.echo(json.dumps(rows))
        return
    _table(
        [
            "session",
            "calls",
            "status",
            "reward",
            "model",
            "tokens",
            "harness",
            "first call (UTC)",
            "last call (UTC)",
        ],
        [
            [
                s["id"],
                str(s["calls"]),
                s["status"] or "-",
                _reward_text(s["reward"]),
                s["model"] or "-",
                "-" if s["tokens"] is None else str(s["tokens"]),
                s["harness"] or "-",
                _when(s["created_at"] or 0),
                _when(s["updated_at"] or 0),
            ]
            for s in rows
        ],
    )
    if len(rows) < total:
        typer.echo(f"(the newest {len(rows)} of {total} sessions; --limit 0 shows all)", err=True)


def _call_summary(r: CallRecord, *, full: bool = False) -> dict[str, Any]:
    d: dict[str, Any] = {
        "seq": r.seq,
        "call_id": r.call_id,
        "dialect": r.dialect.value,
        "method": r.method,
        "path": r.path,
        "stream": r.stream,
        "status": r.status_code,
        "outcome": r.outcome.value,
        "model": r.model,
        "harness": r.harness,
        "prompt_tokens": None if r.prompt_ids is None else len(r.prompt_ids),
        "completion_tokens": None if r.completion_ids is None else len(r.completion_ids),
        "finish_reason": r.finish_reason,
        "latency_ms": round((r.done_at - r.received_at) * 1000, 2),
        "error": r.error,
    }
    if full:
        d.update(
            received_at=r.received_at,
            usage=r.usage,
            metadata=dict(r.metadata),
            request=r.request,
            response=r.response,
        )
    return d


def _print_calls(recs: list[CallRecord]) -> None:
    rows = []
    for r in recs:
        s = _call_summary(r)
        rows.append(
            [
                str(s["seq"]),
                str(s["dialect"]),
                "yes" if s["stream"] else "no",
                str(s["status"]),
                str(s["outcome"]),
                str(s["prompt_tokens"] if s["prompt_tokens"] is not None else "-"),
                str(s["completion_tokens"] if s["completion_tokens"] is not None else "-"),
                str(s["finish_reason"] or "-"),
                str(s["latency_ms"]),
            ]
        )
    _table(
        ["seq", "dialect", "stream", "status", "outcome", "prompt ids", "completion ids", "finish", "ms"],
        rows,
    )


@app.command()
def calls(
    session: str = typer.Argument(..., help="Session id."),
    db: str = DbOpt,
    as_json: bool = typer.Option(
        False, "--json", help="A JSON list with each call's request and response as recorded."
    ),
    seq: int | None = typer.Option(None, "--seq", help="Only the call with this sequence number."),
) -> None:
    """List the calls of one session, in sequence order."""
    with _reading(db) as store:
        recs = store.calls(session)
        if not recs and store.session(session) is None:
            raise CliError(f"no session {session!r} in {db}", "list them with `orchard-rec sessions`")
    if seq is not None:
        recs = [r for r in recs if r.seq == seq]
        if not recs:
            raise CliError(f"session {session!r} has no call {seq}")
    if as_json:
        typer.echo(json.dumps([_call_summary(r, full=True) for r in recs], default=str))
        return
    _print_calls(recs)


def _plain_sample(s: Any, tok: Any, prompt_chars: int) -> str:
    """A sample as text with the loss mask in markers: <train>..</train> (credited),
    <gen>..</gen> (generated, not credited), <obs>..</obs> (observation)."""

    def piece(ids: list[int]) -> str:
        if tok is None:
            return " ".join(map(str, ids)) + " "
        try:
            return str(tok.decode(ids, skip_special_tokens=False))
        except TypeError:
            return str(tok.decode(ids))

    generated = [False] * s.response_length
    for t in s.turns:
        for i in range(t.start, t.end):
            generated[i] = True
    prompt = piece(s.prompt_ids)
    head = (
        f"# session {s.session_id} sample {s.index} status {s.status} reward {s.reward} "
        f"tokens {len(s.tokens)} prompt {s.prompt_length} response {s.response_length} "
        f"trained {sum(s.loss_mask)} turns {len(s.turns)}"
    )
    out = [head, "\n"]
    if len(prompt) > prompt_chars:
        out.append(f"[... {len(prompt) - prompt_chars} characters of prompt]\n")
        prompt = prompt[-prompt_chars:]
    out.append(prompt)
    resp = s.response_ids
    i = 0
    while i < len(resp):
        kind = "train" if s.loss_mask[i] else ("gen" if generated[i] else "obs")
        j = i
        while j < len(resp) and ("train" if s.loss_mask[j] else ("gen" if generated[j] else "obs")) == kind:
            j += 1
        out.append(f"<{kind}>{piece(resp[i:j])}</{kind}>")
        i = j
    out.append("\n")
    return "".join(out)


@app.command()
def show(
    session: str = typer.Argument(..., help="Session id."),
    db: str = DbOpt,
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer to decode ids (path, or 'demo'); ids are shown without it."
    ),
    on_mismatch: OnMismatch = OnMismatchOpt,
    credit: Credit = CreditOpt,
    prompt_chars: int = typer.Option(
        600, "--prompt-chars", help="Show at most this many characters of each prompt (its end)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="The samples as JSON lines (the jsonl export's rows)."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Text with <train>/<gen>/<obs> markers (the default when piped)."
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Write the viewer's session page to this file (one self-contained HTML)."
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Print a session's samples with the trained tokens highlighted."""
    if html is not None:
        _check_output(html, db, force, "--html")
        _show_html(session, db, tokenizer, on_mismatch, credit, html)
        return
    from orchard_rec.pipeline import iter_samples
    from orchard_rec.reconstruct.credit import credit_policy
    from orchard_rec.render import render_sample

    tok = _load_tokenizer(tokenizer, hf=False) if tokenizer else None
    with _reading(db) as store:
        if store.session(session) is None:
            raise CliError(f"no session {session!r} in {db}", "list them with `orchard-rec sessions`")
        for s in iter_samples(
            store, sessions=[session], on_mismatch=on_mismatch, credit=credit_policy(credit)
        ):
            if as_json:
                typer.echo(json.dumps(s.to_dict()))
            elif plain or not console.is_terminal:
                typer.echo(_plain_sample(s, tok, prompt_chars), nl=False)
            else:
                console.print(render_sample(s, tok, prompt_chars=prompt_chars))


def _show_html(
    session: str, db: str, tokenizer: str | None, on_mismatch: str, credit: str, out: Path
) -> None:
    """``show --html``: the viewer's session page as one self-contained file."""
    from orchard_rec.ui import UIError, render_session_html

    tok = _load_tokenizer(tokenizer, hf=False) if tokenizer else None
    with _reading(db) as store:
        try:
            page = render_session_html(store, session, tokenizer=tok, on_mismatch=on_mismatch, credit=credit)
        except UIError as exc:
            raise CliError(f"{exc} in {db}", "list them with `orchard-rec sessions`") from None
    from orchard_rec.exporters.base import atomic_output, output_set

    with output_set(lambda p: _check_output(p, db, True, "--html")) as outputs:
        with atomic_output(out) as f:
            f.write(page.encode())
        outputs.commit()
    typer.echo(f"wrote {out} ({len(page.encode()) / 1e6:.1f} MB, self-contained)")


@app.command()
def ui(
    db: str = DbOpt,
    host: str = HostOpt,
    port: int = typer.Option(8200, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer to decode ids (path, or 'demo'); else the recorded text."
    ),
    on_mismatch: OnMismatch = typer.Option("split", "--on-mismatch", help="For the samples shown."),
    credit: Credit = CreditOpt,
    resend_to: str | None = typer.Option(
        None,
        "--resend-to",
        help="Enable 'send again': replay a call to this upstream (base URL with /v1). Off by default.",
    ),
    resend_key_env: str | None = typer.Option(
        None, "--resend-key-env", help="Name of the env var holding that upstream's API key."
    ),
    annotate: bool = typer.Option(
        False, "--annotate", help="Allow setting reward/status/label/note from the page (writes outcomes)."
    ),
) -> None:
    """Serve the trajectory viewer over a database (read-only): sessions, calls, token-level samples."""
    from aiohttp import web

    from orchard_rec.ui import build_ui_app
    from orchard_rec.ui.calls import Resend

    target = None
    if resend_to is not None:
        resend_to = _check_upstream(resend_to, "--resend-to")
        key = os.environ.get(resend_key_env) if resend_key_env else None
        if resend_key_env and not key:
            raise usage_error(
                f"--resend-key-env: the environment variable {resend_key_env} is empty or unset"
            )
        target = Resend(resend_to, key)
    elif resend_key_env:
        raise usage_error("--resend-key-env goes with --resend-to URL")
    tok = _load_tokenizer(tokenizer, hf=False) if tokenizer else None
    _check_port(host, port)
    with _reading(db) as store:
        writer = open_write(db, migrate_schema=False) if annotate else None
        try:
            app_ = build_ui_app(
                store, tokenizer=tok, on_mismatch=on_mismatch, credit=credit, resend_to=target, writer=writer
            )
            mode = "annotations write outcomes" if annotate else "read-only"
            typer.echo(f"orchard-rec viewer on http://{host}:{port}/  ({db}, {mode})")
            web.run_app(app_, host=host, port=port, print=None)
        finally:
            if writer is not None:
                writer.close()


# -- db ------------------------------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(
    db: str = DbOpt,
    revision: str = typer.Option(
        "head", "--revision", help="The schema revision to migrate to (default: the newest)."
    ),
) -> None:
    """Create or migrate the database schema."""
    from orchard_rec.storage import migrate, queries

    if revision != "head" and not migrate.known(revision):
        raise usage_error(f"--revision {revision!r} is not one of this orchard-rec's migrations")
    store = open_write(db, migrate_schema=False)
    try:
        rev = queries.migrate_to(store, revision)
    finally:
        store.close()
    typer.echo(f"{db}: at revision {rev}")


@db_app.command("current")
def db_current(db: str = DbOpt) -> None:
    """Show the database's schema revision (read-only: a missing database is not created)."""
    from sqlalchemy import exc as sa_exc

    from orchard_rec.storage import migrate, queries
    from orchard_rec.storage.store import Store

    url = _parse_db(db)
    if url.get_backend_name() == "sqlite" and not Path(url.database).is_file():
        typer.echo(f"empty (no database at {url.database}; head {migrate.head()})")
        return
    store = Store(db, readonly=True)
    try:
        rev = queries.schema_revision(store)
    except sa_exc.SQLAlchemyError as exc:
        raise _db_error(exc, url) from None
    finally:
        store.close()
    typer.echo(f"{rev or 'empty'} (head {migrate.head()})")


# -- demo ------------------------------------------------------------------------------------------------------------


@demo_app.callback()
def demo(
    ctx: typer.Context,
    workdir: Path | None = typer.Option(
        None, "--workdir", help="Keep everything here (default: a temp folder, removed unless --keep)."
    ),
    mode: ProxyMode = typer.Option(
        "token", "--mode", help="The proxy's mode (tito uses the demo tokenizer)."
    ),
    keep: bool = typer.Option(False, "--keep", help="Keep the temp folder (its path is printed)."),
    vlm: bool = typer.Option(
        False, "--vlm", help="Vision-language variant: a GUI-like agent sends screenshots (last 3 kept)."
    ),
) -> None:
    """Run the whole loop on embedded defaults: demo upstream, proxy on SQLite, a scripted agent."""
    if ctx.invoked_subcommand is not None:
        return
    import shutil
    import tempfile

    from orchard_rec.demo.run import run_demo

    temp = workdir is None
    wd = workdir or Path(tempfile.mkdtemp(prefix="orchard-demo-"))
    try:
        with err.status("running the demo agent through the proxy..."):
            res = run_demo(wd, mode=mode, vlm=vlm)
        console.print(
            f"[bold]Recorded session[/bold] {res.session_id!r}: {len(res.calls)} calls in {res.db_url}"
        )
        _print_calls(res.calls)
        if vlm:
            console.print(f"The GUI agent sent {res.marker}")
            for s in res.samples:
                spans = s.metadata.get("image_spans") or []
                console.print(
                    f"sample {s.index}: {len(s.images)} image(s), image tokens per image "
                    f"{[b - a for a, b in spans]} (mask 0)"
                    + (
                        f", split: {s.metadata['images_dropped']} screenshot(s) dropped"
                        if s.metadata.get("images_dropped")
                        else ""
                    )
                )
        else:
            console.print(f"The agent's tool really ran: marker.txt = {res.marker!r}")
        from orchard_rec.demo.tokenizer import build_tokenizer
        from orchard_rec.render import render_sample

        for s in res.samples:
            console.print(render_sample(s, build_tokenizer(), prompt_chars=300))
        trained = sum(sum(s.loss_mask) for s in res.samples)
        console.print(
            f"Reconstructed {len(res.calls)} calls into {len(res.samples)} sample(s), {trained} trained tokens"
        )
        kind = (
            "slime rollout (torch.load-able, --load-debug-rollout-data)"
            if res.trainer_export.suffix == ".pt"
            else "parquet"
        )
        if temp and not keep:
            console.print(
                f"Wrote a jsonl export and a {kind}; the temp folder is removed (--keep or --workdir DIR keeps them)."
            )
        else:
            console.print(f"jsonl: {res.jsonl}\nTrainer export, {kind}: {res.trainer_export}")
            console.print(f"Explore: orchard-rec show {res.session_id} --db {res.db_url} --tokenizer demo")
    finally:
        if temp and not keep:
            shutil.rmtree(wd, ignore_errors=True)
        elif temp:
            typer.echo(f"kept: {wd}", err=True)


@demo_app.command("upstream")
def demo_upstream(
    host: str = HostOpt,
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    vlm: bool = typer.Option(
        False, "--vlm", help="Accept images and expand them into <|image_pad|> runs as Qwen2-VL does."
    ),
    min_pixels: int = typer.Option(
        56 * 56, "--min-pixels", min=1, help="--vlm: smallest resized image area."
    ),
    max_pixels: int = typer.Option(
        224 * 224, "--max-pixels", min=1, help="--vlm: largest resized image area."
    ),
) -> None:
    """Run the demo model server alone (vLLM-compatible, token ids, a scripted model): for the quick start."""
    from orchard_rec.demo.run import serve_upstream
    from orchard_rec.demo.vision import VisionConfig

    if min_pixels > max_pixels:
        raise usage_error(f"--min-pixels {min_pixels} is above --max-pixels {max_pixels}")
    _check_port(host, port)
    serve_upstream(
        host,
        port,
        vlm=vlm,
        vision=VisionConfig(min_pixels=min_pixels, max_pixels=max_pixels),
        ready=lambda p: err.print(
            f"demo upstream on http://{host}:{p}/v1 (scripted {'vision-language ' if vlm else ''}model, token ids); "
            f"try: orchard-rec serve --upstream http://{host}:{p}/v1   (Ctrl-C stops)"
        ),
    )


# -- export ------------------------------------------------------------------------------------------------------


FORMAT_INFO: dict[str, tuple[str, str]] = {
    "jsonl": (".jsonl", "one sample per line; the reference every format is tested against"),
    "parquet": (".parquet", "zstd parquet with list<int32> token columns, for pyarrow / pandas / datasets"),
    "slime": (".pt", "torch rollout file(s) with slime's Sample fields, for --load-debug-rollout-data"),
    "slime-sft": (".jsonl", "messages + per-message loss mask and tools, for slime SFT"),
    "verl": (".parquet", "rows of verl's AgentLoopOutput fields, for verl's agent loop"),
    "verl-sft": (".parquet", "messages + tools, for verl's multi-turn SFT dataset"),
    "trl": (".parquet", "input_ids, assistant_masks, completion_mask, for TRL SFTTrainer (pre-tokenized)"),
    "trl-grpo": (
        ".parquet",
        "prompt_ids, completion_ids, logprobs, env_mask, for TRL GRPOTrainer rollout_func",
    ),
    "value": (".parquet", "one row per assistant-turn boundary (prefix ids, turn, reward), for value models"),
    "openrlhf": (
        ".jsonl",
        "observation_tokens, action_ranges, log probs, reward, for OpenRLHF's agent executor",
    ),
}
"""Each built-in format: the file it writes, and what it is for."""

STDOUT_FORMATS = ("jsonl", "slime-sft", "openrlhf")
"""Formats written line by line: ``--out -`` streams them to stdout."""

_KNOWN_SUFFIXES = {".jsonl", ".json", ".parquet", ".pt"}


def _format_doc(target: str) -> str:
    """A plug-in format's first docstring line (its module's when the class has none)."""
    import importlib

    module, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(module)
        doc = getattr(mod, attr).__doc__ or mod.__doc__ or ""
    except Exception:
        doc = ""
    first = doc.strip().splitlines()[0].strip() if doc.strip() else ""
    return first or f"plug-in ({target})"


def _check_output(path: Path, db: str, force: bool, option: str = "--out") -> None:
    """Never write over a database, nor over a file that is not our own output without --force
    (``orchard_rec.outputs`` has the rules)."""
    from orchard_rec.outputs import check_output

    check_output(path, db_url=db, force=force, option=option)


def _check_out(fmt: str, out: Path) -> None:
    if str(out) == "-":
        if fmt not in STDOUT_FORMATS:
            raise usage_error(
                f"--out - (stdout) takes a line-based format ({', '.join(STDOUT_FORMATS)}); {fmt} writes a file",
                f"give --out FILE{FORMAT_INFO.get(fmt, ('',))[0]}",
            )
        return
    want = FORMAT_INFO.get(fmt, ("", ""))[0]
    got = "".join(out.suffixes[-1:]).lower()
    if want and got in _KNOWN_SUFFIXES and got != want and not (want == ".jsonl" and got == ".json"):
        raise usage_error(
            f"--format {fmt} writes {want.lstrip('.')}, but --out {out} ends in {got}",
            f"use --out {out.with_suffix(want)}, or the format that writes {got.lstrip('.')}",
        )
    if out.exists() and out.is_dir():
        raise usage_error(f"--out {out} is a folder", "give a file name")


def _dataset_out(out: str, fmt: str, pairs: list[str] | None) -> tuple[str | None, dict[str, Any]]:
    """``--out URL``: the URL and its ``--storage-option``s (None: a file, as before)."""
    from orchard_rec.errors import ExportError
    from orchard_rec.exporters.dataset import is_url, parse_storage_options

    if not is_url(out):
        if pairs:
            raise usage_error("--storage-option is for an --out URL (s3://, gs://, file://)")
        return None, {}
    from orchard_rec.exporters.upload import names_a_file

    if names_a_file(out):  # s3://bucket/samples.jsonl: the format's file(s), uploaded
        _check_out(fmt, Path(out.rsplit("/", 1)[-1]))
    elif fmt not in ("jsonl", "parquet"):  # jsonl: the default, left as it is
        raise usage_error(
            f"--out {out} (a prefix) is a partitioned parquet dataset; --format {fmt} writes files",
            f"name the file: --out {out.rstrip('/')}/samples{FORMAT_INFO.get(fmt, ('',))[0]}, or use --format parquet",
        )
    try:
        return out, parse_storage_options(pairs or ())
    except ExportError as exc:
        raise usage_error(str(exc)) from None


def _url_export(url: str, storage: dict[str, Any], engine: str, address: str | None) -> Callable[..., Any]:
    """``run_export``'s signature, writing the dataset at ``url`` (``exporters.dataset``); ``engine``
    ray: sharded over a Ray cluster (``exporters.ray_engine``, the only place Ray is imported)."""

    def run(
        db: str, fmt: str, _out: Path, *, format_options: Any = None, check: Any = None, **selection: Any
    ) -> Any:
        from orchard_rec.exporters.upload import names_a_file, upload_export

        if names_a_file(url):
            if engine == "ray":
                raise usage_error(
                    "--engine ray writes a partitioned dataset: give --out a prefix (ending in /)"
                )
            from orchard_rec.exporters.pipeline import export as run_export

            return upload_export(
                url,
                storage,
                lambda local: run_export(db, fmt, local, format_options=format_options, **selection),
            )
        if engine == "ray":
            from orchard_rec.exporters.ray_engine import export_dataset_ray

            return export_dataset_ray(db, url, storage_options=storage, address=address, **selection)
        from orchard_rec.exporters.pipeline import export_dataset

        return export_dataset(db, url, storage_options=storage, **selection)

    return run


def _group_warning(store: Store, selection: dict[str, Any], group_by: str) -> None:
    if group_by == "session":
        return
    selected = store.sessions(
        selection.get("sessions"), since=selection.get("since"), harness=selection.get("harness")
    )
    missing = [s for s in selected if s.outcome is None or s.outcome.metadata.get(group_by) is None]
    if selected and len(missing) == len(selected):
        _warn(
            f"--group-by {group_by}: no selected session has {group_by!r} in its outcome metadata, so all "
            f"are one group (set it: orchard-rec outcome SID --metadata {group_by}=VALUE)"
        )
    elif missing:
        _warn(
            f"--group-by {group_by}: {len(missing)} of {len(selected)} sessions have no {group_by!r}: they form one group"
        )


def _reward_key_check(selected: list[Any], key: str) -> None:
    """A --reward-key no selected session has is a mistake (every reward would be null); one
    that only some have is a warning."""
    from orchard_rec.pipeline import pick_reward

    missing = [s.id for s in selected if pick_reward(s.outcome, key) is None]
    if len(missing) < len(selected):
        if missing:
            _warn(
                f"--reward-key {key}: {len(missing)} of {len(selected)} sessions have no {key!r}"
                f" (e.g. {missing[0]!r}): their samples carry reward null"
            )
        return
    known: set[str] = set()
    for s in selected:
        o = s.outcome
        if o is None:
            continue
        if isinstance(o.reward, dict):
            known.update(o.reward)
        known.update(
            k for k, v in o.metadata.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        )
        if isinstance(o.metadata.get("process_reward"), dict):
            known.add("process")
    raise usage_error(
        f"--reward-key {key}: no selected session has a reward named {key!r} (every reward would be null)",
        f"known here: {', '.join(sorted(known))}"
        if known
        else "no session has named rewards: set them with `orchard-rec outcome SID --reward-json ...`",
    )


@app.command()
def export(
    fmt: str = typer.Option("jsonl", "--format", "-f", help="Output format (see --list-formats)."),
    out_arg: str | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Output file; '-' is stdout (jsonl, slime-sft, openrlhf); a URL (s3://, gs://, file://) is a partitioned parquet dataset.",
    ),
    db: str = DbOpt,
    session: list[str] | None = SessionsOpt,
    since: datetime | None = SinceOpt,
    harness: str | None = HarnessOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    credit: Credit = CreditOpt,
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="HF tokenizer (path or 'demo') to give ids to calls recorded without them (passthrough).",
    ),
    group_by: str | None = typer.Option(
        None,
        "--group-by",
        help="Outcome metadata key whose value groups sessions (GRPO groups), or 'session'.",
    ),
    status: list[str] | None = typer.Option(
        None, "--status", metavar=StatusMetavar, help="Keep samples with this status (repeatable)."
    ),
    min_reward: float | None = typer.Option(
        None, "--min-reward", help="Keep samples whose scalar reward is at least this."
    ),
    pass_rate: str | None = typer.Option(
        None, "--pass-rate", help="LO:HI - keep groups whose pass rate is in [LO, HI] (needs --group-by)."
    ),
    rollout_size: int | None = typer.Option(
        None,
        "--rollout-size",
        help="slime: samples per file (files out_0.pt, out_1.pt, ... or a {rollout_id} template).",
    ),
    processor: str | None = typer.Option(
        None,
        "--processor",
        help="slime: the model's image processor (model folder, hub id or 'demo') for samples with images.",
    ),
    reward_key: str | None = typer.Option(
        None,
        "--reward-key",
        help="Which reward samples carry: 'process' (orchard-rec reward), a named reward, or an outcome metadata number.",
    ),
    select: str | None = typer.Option(
        None,
        "--select",
        help="bar:N:LO:HI[:STRIDE] - Balanced Adaptive Rollout: exactly N attempts per group, positives ratio in [LO, HI], tried on growing prefixes of STRIDE attempts (needs --group-by).",
    ),
    filters: list[str] | None = typer.Option(
        None,
        "--filter",
        help="Dynamic-sampling filter per group (repeatable, applied in order): nonzero-std, no-aborted, no-truncated, has-positive, pass-rate, positive-only.",
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Seed for --select's tie order and --filter pass-rate (needs one of them)."
    ),
    require_teacher: bool = typer.Option(
        False,
        "--require-teacher",
        help="Drop samples that have no stored teacher log-probs (orchard-rec teacher).",
    ),
    list_formats: bool = typer.Option(False, "--list-formats", help="List the formats and exit."),
    storage_options: list[str] | None = typer.Option(
        None,
        "--storage-option",
        help="For the filesystem of an --out URL, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable).",
    ),
    engine: Literal["local", "ray"] = typer.Option(
        "local", "--engine", help="ray: shard sessions over a Ray cluster (an --out URL; the ray extra)."
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="The Ray cluster for --engine ray (default: RAY_ADDRESS, else a local one).",
    ),
    auxiliary: bool | None = typer.Option(
        None,
        "--auxiliary/--no-auxiliary",
        help="Keep samples of harnesses' side conversations (metadata.auxiliary, e.g. title generation); default: in jsonl/parquet only.",
    ),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    policy_version: int | None = typer.Option(
        None, "--policy-version", help="The trainer's current policy version V (with --max-staleness K)."
    ),
    max_staleness: int | None = typer.Option(
        None, "--max-staleness", min=0, help="Tokens sampled by versions older than V - K are stale."
    ),
    min_policy_version: int | None = typer.Option(
        None, "--min-policy-version", help="Tokens sampled by versions older than this are stale."
    ),
    stale: Literal["drop", "mask"] = typer.Option(
        "drop", "--stale", help="drop samples holding stale tokens, or mask those tokens (loss mask 0)."
    ),
    aborted: Literal["drop", "keep"] = typer.Option(
        "drop",
        "--aborted",
        help="Generations the server aborted for a weight update (finish reason abort): left out, or kept with their partial tokens.",
    ),
) -> None:
    """Reconstruct sessions into training samples and write them in a trainer's format."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchard_rec.exporters.base import available
    from orchard_rec.exporters.pipeline import export as run_export

    known = available()
    if list_formats:
        for name in sorted(known):
            ext, what = FORMAT_INFO.get(name) or ("", _format_doc(known[name]))
            typer.echo(f"{name:<10} {ext or '-':<9} {what}")
        return
    if fmt not in known:
        raise usage_error(
            f"--format {fmt!r} is not a format", f"one of: {', '.join(sorted(known))} (--list-formats)"
        )
    if out_arg is None:
        raise usage_error("--out is required", f"e.g. --out samples{FORMAT_INFO.get(fmt, ('.out',))[0]}")
    url, storage = _dataset_out(out_arg, fmt, storage_options)
    if (engine == "ray" or ray_address) and url is None:
        raise usage_error("--engine ray writes a partitioned dataset: give --out URL (s3://..., file://...)")
    if ray_address and engine != "ray":
        raise usage_error("--ray-address is for --engine ray")
    out = Path(out_arg)
    if url is None:  # a dataset prefix: new names only, a non-dataset prefix refused (exporters.dataset)
        _check_out(fmt, out)
        if "{rollout_id}" not in str(out):
            _check_output(out, db, force)
    if rollout_size is not None and (fmt != "slime" or rollout_size < 1):
        raise usage_error("--rollout-size takes a positive number, for --format slime")
    if processor is not None and fmt != "slime":
        raise usage_error("--processor is for --format slime (its samples carry the processor's output)")
    if pass_rate and not group_by:
        raise usage_error("--pass-rate needs --group-by (a pass rate is a property of a group)")
    window = None
    _check_statuses(status)
    if pass_rate:
        try:
            lo, hi = (float(x) for x in pass_rate.split(":"))
        except ValueError:
            raise usage_error("--pass-rate takes LO:HI, e.g. 0.25:0.75") from None
        if not 0.0 <= lo <= hi <= 1.0:  # also nan
            raise usage_error(
                f"--pass-rate {pass_rate}: needs 0 <= LO <= HI <= 1", "e.g. --pass-rate 0.25:0.75"
            )
        window = (lo, hi)
    bar = None
    if select is not None:
        from orchard_rec.selection import parse_bar

        try:
            bar = parse_bar(select)
        except ValueError as e:
            raise usage_error(f"--{e}") from None
    if (bar is not None or filters) and not group_by:
        raise usage_error("--select and --filter need --group-by (they choose among a task's attempts)")
    from orchard_rec.selection import FILTERS

    for name in filters or ():
        if name not in FILTERS:
            raise usage_error(f"--filter {name!r} is not a filter", f"one of: {', '.join(FILTERS)}")
    if seed is not None and bar is None and "pass-rate" not in (filters or ()):
        raise usage_error(
            "--seed orders --select's ties and --filter pass-rate's draws: without either it changes nothing",
            "add --select bar:N:LO:HI or --filter pass-rate, or leave --seed out",
        )
    from orchard_rec.pipeline import SelectionStats

    if (policy_version is None) != (max_staleness is None):
        raise usage_error(
            "--policy-version and --max-staleness go together", "e.g. --policy-version 12 --max-staleness 2"
        )
    from orchard_rec.policy import Staleness
    from orchard_rec.selection.staleness import StalenessStats

    floor = Staleness(policy_version, max_staleness, min_policy_version)
    stale_stats = StalenessStats()
    sel_stats = SelectionStats()
    options: dict[str, Any] = {"rollout_size": rollout_size} if rollout_size else {}
    if processor is not None:
        options["processor"] = processor
    since_ts = _since(since)
    tok = _load_tokenizer(tokenizer, hf=True) if tokenizer else None
    selection = {"sessions": session, "since": since_ts, "harness": harness}
    with _reading(db) as store:
        selected = store.sessions(session, since=since_ts, harness=harness)
        if session:
            missing = sorted(set(session) - {s.id for s in selected})
            if missing:
                _warn(f"no session {', '.join(map(repr, missing))} in {db}")
        if group_by:
            _group_warning(store, selection, group_by)
    if reward_key is not None and selected:
        _reward_key_check(selected, reward_key)
    total = len(selected)
    if total == 0:
        raise CliError(
            "nothing to export: no session matches the selection"
            if (session or since or harness)
            else f"nothing to export: {db} has no sessions",
            None if not (session or since or harness) else "list them with `orchard-rec sessions`",
        )
    to_stdout = str(out) == "-"
    progress = Progress(
        TextColumn("exporting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sessions"),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=True,
    )
    with progress:
        task = progress.add_task("export", total=total)
        stats = (run_export if url is None else _url_export(url, storage, engine, ray_address))(
            db,
            fmt,
            out,
            sessions=session,
            since=since_ts,
            harness=harness,
            on_mismatch=on_mismatch,
            credit=credit,
            on_session=lambda _s: progress.advance(task),
            tokenizer=tok,
            format_options=options,
            group_by=group_by,
            statuses=status,
            min_reward=min_reward,
            pass_rate=window,
            reward_key=reward_key,
            select=bar,
            seed=seed,
            filters=filters,
            selection_stats=sel_stats,
            auxiliary=auxiliary,
            require_teacher=require_teacher,
            check=lambda p: _check_output(p, db, force),
            aborted=aborted,
            staleness=floor if floor.floor is not None else None,
            stale=stale,
            staleness_stats=stale_stats,
        )
    where = "stdout" if to_stdout else ", ".join(map(str, stats.files)) or (url or str(out))
    selection_line = f"selection: {sel_stats.summary()}" if (bar is not None or filters) else None
    if stats.samples == 0:
        kept = "" if to_stdout else f"; nothing written ({out} left as it was)"
        given = [
            name
            for name, on in (
                ("--status", status),
                ("--min-reward", min_reward is not None),
                ("--pass-rate", pass_rate),
                ("--select", bar),
                ("--filter", filters),
                ("--require-teacher", require_teacher),
                ("--no-auxiliary", auxiliary is False),
                ("--policy-version/--max-staleness/--min-policy-version", floor.floor is not None),
            )
            if on
        ]
        if given:
            raise CliError(
                f"no sample passed {', '.join(given)} ({total} sessions selected){kept}",
                selection_line
                or "loosen them; `orchard-rec sessions` shows each session's status and reward",
            )
        raise CliError(
            f"the {total} selected sessions gave no samples (no calls with token ids? try --tokenizer){kept}"
        )
    if selection_line:
        typer.echo(selection_line, err=True)
    if floor.floor is not None:
        typer.echo(f"staleness: {stale_stats.summary()}", err=True)
    typer.echo(
        f"wrote {stats.samples} samples ({stats.tokens} tokens) from {total} sessions to {where}", err=True
    )


# -- outcome --------------------------------------------------------------------------------------------------------


def _parse_metadata(pairs: list[str] | None, blob: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if blob:
        try:
            m = json.loads(blob)
        except json.JSONDecodeError as exc:
            raise usage_error(f"--metadata-json is not JSON: {exc.msg} (at character {exc.pos})") from None
        if not isinstance(m, dict):
            raise usage_error('--metadata-json must be a JSON object, e.g. \'{"task": "t1"}\'')
        meta.update(m)
    for p in pairs or ():
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise usage_error(f"--metadata {p!r}: use KEY=VALUE, e.g. --metadata task=t1")
        try:
            meta[k] = json.loads(v)  # numbers and booleans keep their type
        except json.JSONDecodeError:
            meta[k] = v
    return meta


@app.command()
def outcome(
    session: str = typer.Argument(..., help="Session id."),
    reward: float | None = typer.Option(None, "--reward", help="The scalar reward."),
    reward_json: str | None = typer.Option(
        None,
        "--reward-json",
        help='Named rewards, e.g. \'{"tests": 1, "style": 0.5}\' (with --reward: stored as "reward" beside them).',
    ),
    status: Literal["completed", "truncated", "aborted", "failed"] | None = typer.Option(
        None, "--status", help="How the session ended."
    ),
    step_values: str | None = typer.Option(
        None, "--step-values", help="Comma-separated value per model turn."
    ),
    metadata: list[str] | None = typer.Option(
        None,
        "--metadata",
        help="KEY=VALUE stored with the outcome, e.g. task=t1 for --group-by (repeatable; other keys stay).",
    ),
    metadata_json: str | None = typer.Option(
        None, "--metadata-json", help="Outcome metadata as a JSON object (merged into the stored keys)."
    ),
    clear: list[str] | None = typer.Option(
        None,
        "--clear",
        help="Remove a stored field: reward, status, step_values, metadata, metadata.KEY, or all (repeatable).",
    ),
    create: bool = typer.Option(False, "--create", help="Create the session if no call recorded it yet."),
    db: str = DbOpt,
) -> None:
    """Set a session's reward/status/metadata (flows into every export); what is given merges into what is stored."""
    from sqlalchemy import exc as sa_exc

    from orchard_rec.storage.outcome import OutcomeChange
    from orchard_rec.storage.outcome import as_json as outcome_as_json

    sets: dict[str, Any] = {}
    r = _reward_option(reward, reward_json)
    if r is not None:
        sets["reward"] = r
    if status is not None:
        sets["status"] = status
    if step_values is not None:
        try:
            sets["step_values"] = tuple(float(x) for x in step_values.split(","))
        except ValueError:
            raise usage_error("--step-values takes numbers separated by commas, e.g. 0,0.5,1") from None
    meta = _parse_metadata(metadata, metadata_json)
    if meta:
        sets["metadata"] = meta
    change = _cli_outcome_change(OutcomeChange, sets, clear, "--reward-json" if reward_json else "--reward")
    open_read(db).close()  # exists and is migrated (else says which command migrates); creates nothing
    store = open_write(db, migrate_schema=False)
    try:
        if store.session(session) is None and not create:
            raise CliError(
                f"no session {session!r} in {db}",
                "check the id (`orchard-rec sessions`), or --create to record an outcome before any call",
            )
        merged = store.update_outcome(session, change)
    except sa_exc.SQLAlchemyError as exc:
        raise _db_error(exc, _parse_db(db)) from None
    finally:
        store.close()
    shown = outcome_as_json(merged)
    typer.echo(
        f"session {session}: reward={json.dumps(shown['reward'])} status={shown['status'] or '-'}"
        + (f" metadata={json.dumps(shown['metadata'])}" if shown["metadata"] else "")
    )


def _cli_outcome_change(cls: Any, sets: dict[str, Any], clear: list[str] | None, reward_option: str) -> Any:
    """The options as a ``storage.outcome.OutcomeChange``; its refusals become --option messages."""
    from orchard_rec.storage.outcome import InvalidOutcome

    names = {
        "reward": reward_option,
        "step_values": "--step-values",
        "status": "--status",
        "metadata": "--metadata",
    }
    try:
        return cls(sets, frozenset(clear or ()))
    except InvalidOutcome as exc:
        option = names.get(exc.param or "", "")
        raise usage_error(f"{option}: {exc.message}" if option else exc.message) from None


def _reward_option(reward: float | None, reward_json: str | None) -> Any:
    """``--reward`` and ``--reward-json`` as one stored reward (a number, or named numbers)."""
    if reward_json is None:
        return reward

    def refuse(name: str) -> NoReturn:
        raise usage_error(f"--reward-json: {name} is not a finite number")

    try:
        named = json.loads(reward_json, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise usage_error(
            f"--reward-json is not JSON: {exc.msg} (at character {exc.pos})",
            'e.g. --reward-json \'{"tests": 1, "style": 0.5}\'',
        ) from None
    if isinstance(named, (int, float)) and not isinstance(named, bool):
        named = {"reward": named} if reward is None else {"reward": reward, "value": named}
    if not isinstance(named, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in named.values()
    ):
        raise usage_error("--reward-json must be an object of numbers, e.g. '{\"tests\": 1}'")
    if reward is not None:
        if "reward" in named and named["reward"] != reward:
            raise usage_error('--reward and --reward-json\'s "reward" disagree: give one')
        named = {"reward": reward, **named}
    return named


def set_outcome(store: Store, session: str, outcome: Any) -> None:
    """Record an outcome (``Store.set_outcome`` retries the race with the writer creating the row)."""
    store.set_outcome(session, outcome)


# -- harnesses ---------------------------------------------------------------------------------------------------------


@harness_app.command("config")
def harness_config(
    name: str = typer.Argument(
        ..., help="codex | claude-code | openclaw | pi | opencode | hermes | kimi | zeroclaw"
    ),
    base_url: str = typer.Option("http://127.0.0.1:8100", "--base-url", help="The proxy's address."),
    session: str | None = typer.Option(
        None, "--session", help="A fixed session id in the URL (default: the harness's own id)."
    ),
    model: str = typer.Option("MODEL", "--model", help="The model name the harness asks for."),
) -> None:
    """Print what to paste so the harness talks to the proxy."""
    from orchard_rec.harnesses import get

    try:
        h = get(name)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    typer.echo(h.config_snippet(base_url, session, model), nl=False)
    tagged = ", ".join(h.session_headers + h.session_fields) or "none (use --session: /s/ID)"
    typer.echo(
        f"{h.name} {h.version or '(untested)'}: session id sent: {tagged}; history: {h.history}; "
        f"export with --on-mismatch {h.on_mismatch}",
        err=True,
    )


@harness_app.command("install")
def harness_install(
    name: str = typer.Argument("all", help="A harness name, or all."),
    force: bool = typer.Option(False, "--force", help="Install again even when the cache has it."),
) -> None:
    """Install pinned harness CLIs (npm registry, PyPI venvs) into the cache ($ORCHARD_HARNESS_CACHE)."""
    from orchard_rec.harnesses import HARNESSES, get, install

    try:
        targets = [h for h in HARNESSES if h.installable] if name == "all" else [get(name)]
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    for h in targets:
        with err.status(f"installing {h.name} ({', '.join(h.npm + h.pypi)})"):
            folder = install(h, force=force)
        console.print(f"{h.name}: {folder}")


@app.command()
def intercept(
    listen: str = typer.Option(
        "127.0.0.1:8080", "--listen", help="HOST:PORT for the harness's HTTPS_PROXY (port 0: any free port)."
    ),
    db: str = DbOpt,
    hosts: str = typer.Option(
        "api.openai.com,api.anthropic.com",
        "--hosts",
        help="Comma-separated hosts whose LLM calls are recorded; other hosts are tunnelled untouched.",
    ),
    upstream_override: str | None = typer.Option(
        None,
        "--upstream-override",
        help="Send intercepted LLM calls to this base URL (incl. /v1) instead, e.g. a local vLLM.",
    ),
    mode: Literal["token", "passthrough", "tito"] = typer.Option(
        "token",
        "--mode",
        help="With --upstream-override: token (ask the server for token ids), tito (send the session's"
        " exact ids to its token endpoint; needs --tokenizer) or passthrough.",
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="tito: the model's Hugging Face tokenizer (path or name)."
    ),
    upstream_kind: Literal["vllm", "sglang"] = typer.Option(
        "vllm", "--upstream-kind", help="tito: vllm (/v1/completions) or sglang (/generate)."
    ),
    durability: Literal["process", "machine", "async"] = typer.Option(
        "process",
        "--durability",
        help="process: the end of a client's answer waits until its call's spool line is written (a kill -9"
        " loses nothing); machine: until it is fsync'd; async: never waits.",
    ),
    confdir: str | None = typer.Option(
        None, "--confdir", help="mitmproxy's folder holding its CA (default ~/.mitmproxy)."
    ),
    upstream_ca: str | None = typer.Option(
        None, "--upstream-ca", help="PEM bundle to verify upstream hosts with (default: the system's)."
    ),
    ssl_insecure: bool = typer.Option(False, "--ssl-insecure", help="Do not verify upstream certificates."),
    spool: str | None = SpoolOpt,
    print_ca: bool = typer.Option(
        False,
        "--print-ca",
        help="Create the CA if needed, print its path and the env vars a harness needs, and exit.",
    ),
    install_runtime: bool = typer.Option(
        False,
        "--install",
        help="Build the mitmproxy runtime venv (Python >= 3.12) under ~/.cache/orchard-rec/mitm, and exit.",
    ),
    verbose: bool = typer.Option(False, "--verbose", help="mitmproxy's own log on stderr."),
) -> None:
    """Record harnesses that cannot be pointed at a base URL: an intercepting HTTPS proxy (mitmproxy)."""
    from orchard_rec.intercept import runtime

    if install_runtime:
        with err.status(f"building the intercept runtime (mitmproxy {runtime.MITM_VERSION})"):
            exe = runtime.install()
        console.print(f"intercept runtime: {exe}")
        return
    host, _, port_text = listen.rpartition(":")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise usage_error(f"--listen {listen!r}: use HOST:PORT (port 0 to 65535), e.g. 127.0.0.1:8080")
    if upstream_override:
        upstream_override = _check_upstream(upstream_override, "--upstream-override")
    if mode == "tito" and upstream_override and not tokenizer:
        raise usage_error(
            "--mode tito needs --tokenizer (the model's Hugging Face tokenizer, with its chat template)"
        )
    if not runtime.has_mitmproxy():
        if not runtime.runtime_ready():
            raise CliError(
                f"mitmproxy is not installed in this Python ({sys.version.split()[0]})",
                "run `orchard-rec intercept --install` once (builds a Python >= 3.12 venv with mitmproxy "
                f"{runtime.MITM_VERSION}), or `pip install 'orchard-rec[mitm]'` on Python >= 3.12",
            )
        orchard = str(runtime.runtime_orchard())
        os.execv(orchard, [orchard, "intercept", *sys.argv[sys.argv.index("intercept") + 1 :]])
    from orchard_rec.intercept import InterceptConfig
    from orchard_rec.intercept.run import ca_info, run_intercept

    extra = {"confdir": confdir} if confdir else {}
    cfg = InterceptConfig(
        listen_host=host or "127.0.0.1",
        listen_port=int(port_text),
        db=db,
        hosts=tuple(hosts.split(",")),
        upstream_override=upstream_override,
        mode=mode,
        tokenizer=tokenizer,
        upstream_kind=upstream_kind,
        durability=durability,
        upstream_ca=upstream_ca,
        ssl_insecure=ssl_insecure,
        spool=spool,
        **extra,
    )
    if print_ca:
        info = ca_info(cfg.confdir)
        typer.echo(f"# mitmproxy CA: {info.cert}")
        typer.echo(f"export HTTPS_PROXY=http://{cfg.listen_host}:{cfg.listen_port}")
        for k, v in info.env().items():
            typer.echo(f"export {k}={v}")
        return
    _check_port(cfg.listen_host, cfg.listen_port, "--listen")
    _check_spool(spool, db)
    from importlib.util import find_spec

    if cfg.effective_mode == "tito" and find_spec("transformers") is None:
        raise CliError(
            f"--mode tito needs transformers in the intercept's Python ({sys.executable})",
            "run `orchard-rec intercept --install` (the runtime venv includes it), or pip install 'orchard-rec[hf]'",
        )
    open_write(db).close()
    run_intercept(cfg, verbose=verbose)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    name: str = typer.Argument(
        ..., help="codex | claude-code | openclaw | pi | opencode | hermes | kimi | zeroclaw"
    ),
    session: str | None = typer.Option(None, "--session", help="Session id (default: NAME-<random>)."),
    proxy: str | None = typer.Option(
        None, "--proxy", help="A running proxy; else one is started for this run."
    ),
    upstream: str | None = typer.Option(
        None, "--upstream", envvar="ORCHARD_UPSTREAM", help="Model server, when starting a proxy."
    ),
    db: str = DbOpt,
    mode: Literal["token", "passthrough"] = typer.Option(
        "token",
        "--mode",
        help="The proxy's mode, when starting one: token (ask for token ids) or passthrough.",
    ),
    model: str = typer.Option("orchard-model", "--model", help="The model name the harness asks for."),
    binary: str | None = typer.Option(
        None, "--bin", help="The harness executable (default: cache, then PATH)."
    ),
    workdir: Path | None = typer.Option(
        None,
        "--workdir",
        help="The harness's working folder (default: a temp folder, removed unless --keep).",
    ),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds before the harness is stopped."),
    keep: bool = typer.Option(False, "--keep", help="Keep the temp home and working folder (paths printed)."),
) -> None:
    """Run a harness through the proxy: private home and config, session-tagged URL, outcome recorded.

    Arguments after -- go to the harness (e.g. the prompt).
    """
    import uuid

    from orchard_rec.harnesses import get, run_harness

    try:
        h = get(name)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    import tempfile

    sid = session or f"{name}-{uuid.uuid4().hex[:8]}"
    temps: list[Path] = []
    home = Path(tempfile.mkdtemp(prefix=f"orchard-{h.name}-home-"))
    temps.append(home)
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix=f"orchard-{h.name}-work-"))
        temps.append(workdir)
    with contextlib.ExitStack() as stack:
        stack.callback(_remove_or_say, temps, keep)
        if proxy is None:
            if not upstream:
                raise usage_error("give --proxy URL of a running proxy, or --upstream URL to start one")
            from orchard_rec.proxy.server import RecordingProxy

            cfg = _proxy_config(upstream=_check_upstream(upstream), db=db, mode=mode)
            open_write(db).close()
            proxy = stack.enter_context(RecordingProxy(cfg)).url
        try:
            res = run_harness(
                h,
                proxy,
                sid,
                list(ctx.args),
                model=model,
                binary=binary,
                workdir=workdir,
                home=home,
                timeout=timeout,
            )
        except FileNotFoundError as exc:
            raise CliError(str(exc), f"orchard-rec harness install {name}, or --bin PATH") from None
    typer.echo(f"session {sid}: {h.name} exited {res.exit_code} after {res.duration_s:.1f}s", err=True)
    typer.echo(sid)
    if res.exit_code != 0:
        raise typer.Exit(res.exit_code)


def _remove_or_say(folders: list[Path], keep: bool) -> None:
    import shutil

    for f in folders:
        if keep:
            typer.echo(f"kept: {f}", err=True)
        else:
            shutil.rmtree(f, ignore_errors=True)


@train_app.command("sft")
def train_sft_cmd(
    model: Path = typer.Option(..., "--model", help="A local Hugging Face causal LM folder."),
    out: Path = typer.Option(..., "--out", help="Where to save the trained checkpoint."),
    db: str = DbOpt,
    session: list[str] | None = SessionsOpt,
    credit: Credit = CreditOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps."),
    batch_size: int = typer.Option(4, "--batch-size", min=1, help="Samples per step."),
    lr: float = typer.Option(1e-4, "--lr", help="Learning rate."),
) -> None:
    """Credit-assignment SFT: train only on credited tokens of the recorded samples."""
    _check_output(out, db, True)  # a checkpoint folder: never the database (nor any SQLite file)
    from orchard_rec.signals import interrupt_deferred

    try:
        with interrupt_deferred():  # torch: Ctrl-C inside its import would abort the interpreter
            from transformers import AutoModelForCausalLM

            from orchard_rec.trainers.sft import train_sft
    except ImportError as exc:
        raise CliError(
            f"training needs torch and transformers ({exc})", "pip install 'orchard-rec[train,hf]'"
        ) from None
    from rich.progress import Progress

    from orchard_rec.pipeline import iter_samples
    from orchard_rec.reconstruct.credit import credit_policy

    if not model.is_dir():
        raise usage_error(f"--model {model}: no such folder")
    with _reading(db) as store:
        samples = list(
            iter_samples(store, sessions=session, credit=credit_policy(credit), on_mismatch=on_mismatch)
        )
    if not samples:
        raise CliError("no samples to train on", "record sessions first, or check --session")
    lm = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True)
    with Progress(console=err, disable=not err.is_terminal) as progress:
        task = progress.add_task("sft", total=steps)

        def step(k: int, loss: float, n: int) -> None:
            progress.update(task, advance=1, description=f"sft loss {loss:.4f} ({n} credited tokens)")
            if not err.is_terminal:
                console.print(f"step {k} loss {loss:.4f} credited_tokens {n}")

        res = train_sft(lm, samples, steps=steps, batch_size=batch_size, lr=lr, out=out, on_step=step)
    console.print(
        f"trained {steps} steps on {len(samples)} samples, {res.credited_tokens} credited tokens; loss {res.losses[0]:.4f} -> {res.losses[-1]:.4f}; saved {out}"
    )


# -- steps and process rewards ---------------------------------------------------------------------------------------


@app.command()
def steps(
    session: str = typer.Argument(..., help="Session id."),
    as_json: bool = typer.Option(False, "--json", help="One JSON list of steps."),
    db: str = DbOpt,
) -> None:
    """What the agent did: each tool call (command, files read/edited) and its result (exit code)."""
    from orchard_rec.recipes import session_steps

    with _reading(db) as store:
        if store.session(session) is None:
            raise CliError(f"no session {session!r} in {db}", "list them with `orchard-rec sessions`")
        found, turns = session_steps(store, session)
    if as_json:
        typer.echo(json.dumps([s.to_dict() for s in found], ensure_ascii=False))
        return
    if not found:
        typer.echo(f"session {session}: no tool calls in {turns} model turns")
        return
    rows = []
    for s in found:
        what = (
            s.command
            if s.command is not None
            else ", ".join(s.edits or s.reads) or json.dumps(s.arguments)[:80]
        )
        code = "-" if s.exit_code is None else str(s.exit_code)
        rows.append(
            [
                str(s.index),
                str(s.turn),
                s.tool,
                s.kind,
                what.replace("\n", " ")[:100],
                code,
                "yes" if s.failed else "",
            ]
        )
    _table(["#", "turn", "tool", "kind", "command / files", "exit", "failed"], rows)


@app.command()
def reward(
    rules: str = typer.Option(
        "swe", "--rules", help="Rule set (built in: swe, Orchard-SWE's process_shaped)."
    ),
    session: list[str] | None = SessionsOpt,
    weights: str | None = typer.Option(
        None, "--weights", help='Override term weights, e.g. \'{"f2p": 0.6, "error_rate": 0}\'.'
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the rewards, store nothing."),
    db: str = DbOpt,
) -> None:
    """Rule-based process rewards from each session's steps and its outcome's gold fields; stored
    with the outcome (metadata.process_reward, step_values) for export --reward-key process."""
    from orchard_rec import rewards as reward_sets
    from orchard_rec.recipes import score_session, with_process_reward

    options: dict[str, Any] = {}
    if weights is not None:
        try:
            options["weights"] = json.loads(weights)
        except json.JSONDecodeError as exc:
            raise usage_error(
                f"--weights is not JSON: {exc.msg}", "e.g. --weights '{\"f2p\": 0.6}'"
            ) from None
    try:
        rule_set = reward_sets.get(rules, **options)
    except KeyError as exc:
        raise usage_error(str(exc.args[0])) from None
    except (ValueError, TypeError) as exc:
        raise usage_error(f"--weights: {exc}") from None
    with _reading(db) as store:
        selected = store.sessions(session)
        if session:
            missing = sorted(set(session) - {s.id for s in selected})
            if missing:
                _warn(f"no session {', '.join(map(repr, missing))} in {db}")
        results = []
        needs = tuple(getattr(rule_set, "gold_fields", ()))
        ungraded = [
            s.id for s in selected if needs and not set(needs) & set(s.outcome.metadata if s.outcome else {})
        ]
        for summary in selected:
            res = None if summary.id in ungraded else score_session(store, summary.id, rule_set)
            if res is not None:
                results.append((summary, res))
    if ungraded:
        hint = (
            f"set the grader's fields first, e.g. orchard-rec outcome {ungraded[0]} --metadata resolved=true"
        )
        if not results:
            raise CliError(
                f"--rules {rules}: no selected session has grader data ({', '.join(needs[:4])}, ...);"
                " nothing scored, nothing stored",
                hint,
            )
        _warn(
            f"--rules {rules}: {len(ungraded)} session(s) have no grader data ({', '.join(needs[:4])}, ...),"
            f" not scored: {', '.join(map(repr, ungraded[:5]))}{' ...' if len(ungraded) > 5 else ''} ({hint})"
        )
    if not results:
        raise CliError("no session to score" + (" matches --session" if session else f" in {db}"))
    rows = []
    for summary, res in results:
        c = res.components
        rows.append(
            [summary.id, f"{res.total:.3f}"]
            + [
                f"{c.get(k, 0.0):.2f}"
                for k in ("resolved", "f2p", "localization", "anchored_flip", "integrity_gate")
            ]
            + ["; ".join(res.notes)[:60]]
        )
    _table(["session", "reward", "resolved", "f2p", "loc", "flip", "gate", "notes"], rows)
    if dry_run:
        return
    store = open_write(db)
    try:
        for summary, res in results:
            set_outcome(store, summary.id, with_process_reward(summary.outcome, rules, res))
    finally:
        store.close()
    typer.echo(f"stored {rules} process rewards for {len(results)} sessions", err=True)


# -- teacher log-probs (on-policy distillation) ---------------------------------------------------------------------


@app.command()
def teacher(
    url: str = typer.Option(
        ..., "--url", help="Teacher server base URL (vLLM: http://HOST:PORT; SGLang: http://HOST:PORT)."
    ),
    kind: Literal["vllm", "sglang"] = typer.Option(
        "vllm", "--kind", help="vllm (/v1/completions prompt_logprobs) or sglang (/generate)."
    ),
    top_k: int = typer.Option(
        0, "--top-k", help="Also store the teacher's top-K log-probs per response token."
    ),
    max_len: int | None = typer.Option(
        None, "--max-len", help="Longest token sequence the teacher accepts (default: asked of the server)."
    ),
    truncation: Literal["prefix", "suffix"] = typer.Option(
        "prefix",
        "--truncation",
        help="Over --max-len: drop from the left (prompt first) or the right (response tail).",
    ),
    concurrency: int = typer.Option(8, "--concurrency", help="Requests in flight."),
    retries: int = typer.Option(2, "--retries", help="Retries per sample before it is stored as failed."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds per request."),
    shard: str | None = typer.Option(
        None, "--shard", help="I/N: this worker's share of the samples (0 <= I < N)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model name sent to vLLM (default: its first /v1/models entry)."
    ),
    name: str | None = typer.Option(
        None, "--name", help="The teacher's name/version as stored (default: the model name)."
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="The student's tokenizer (path or 'demo'); needed with --retokenize-teacher.",
    ),
    retokenize_teacher: str | None = typer.Option(
        None,
        "--retokenize-teacher",
        help="The teacher's tokenizer when its vocabulary differs: positions are mapped by text, unaligned ones invalid.",
    ),
    session: list[str] | None = SessionsOpt,
    since: datetime | None = SinceOpt,
    harness: str | None = HarnessOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    db: str = DbOpt,
) -> None:
    """Teacher log-probs of every response token of every sample, stored per sample (resumable)."""

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchard_rec.pipeline import iter_samples
    from orchard_rec.storage.queries import teacher_store
    from orchard_rec.teacher import SampleRef, TeacherConfig, score_all
    from orchard_rec.teacher.run import run_coroutine

    url = _check_upstream(
        url, "--url", openai_style=False
    )  # the server root: /v1/completions or /generate is added
    if top_k < 0 or concurrency < 1 or retries < 0 or (max_len is not None and max_len < 2):
        raise usage_error("--top-k >= 0, --concurrency >= 1, --retries >= 0 and --max-len >= 2")
    part: tuple[int, int] | None = None
    if shard is not None:
        try:
            i, n = (int(x) for x in shard.split("/"))
            if not 0 <= i < n:
                raise ValueError
        except ValueError:
            raise usage_error("--shard takes I/N with 0 <= I < N, e.g. 0/4") from None
        part = (i, n)
    since_ts = _since(since)
    with _reading(db) as store:
        total = len(store.sessions(session, since=since_ts, harness=harness))
    if total == 0:
        raise CliError(
            "no session to score"
            + (" matches the selection" if (session or since or harness) else f" in {db}")
        )
    store = open_write(db)
    sink = teacher_store(store)
    pair = None
    if retokenize_teacher is not None or tokenizer is not None:
        if retokenize_teacher is None or tokenizer is None:
            raise usage_error(
                "--retokenize-teacher TEACHER_TOKENIZER and --tokenizer STUDENT_TOKENIZER go together",
                "give both when the teacher's tokenizer differs; neither when it is the student's",
            )
        pair = (_load_tokenizer(tokenizer, hf=False), _load_tokenizer(retokenize_teacher, hf=False))
    cfg = TeacherConfig(
        retokenize=pair,
        url=url,
        kind=kind,
        top_k=top_k,
        max_len=max_len,
        truncation=truncation,
        concurrency=concurrency,
        retries=retries,
        timeout_s=timeout,
        model=model,
        name=name,
    )
    progress = Progress(
        TextColumn("teacher"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=True,
    )
    try:
        refs = (
            SampleRef(s.session_id, s.sample_key, list(s.tokens), s.response_length)
            for s in iter_samples(
                store, sessions=session, since=since_ts, harness=harness, on_mismatch=on_mismatch
            )
        )
        with progress:
            task = progress.add_task("teacher", total=None)
            summary = run_coroutine(
                score_all(refs, cfg, sink, shard=part, progress=lambda k: progress.advance(task, k))
            )
    finally:
        store.close()
    typer.echo(summary.line(), err=True)
    for e in summary.errors[:5]:
        _warn(e)
    if summary.failed:
        _warn(
            f"{summary.failed} samples failed (stored with an all-zero valid mask); run the command again to retry them"
        )
        if any(" 404" in e or "answered 404" in e for e in summary.errors):
            typer.echo(
                f"  the teacher answered 404: is --url {cfg.url} the server's root, and --kind {kind} right? "
                f"(vllm: POST /v1/completions, sglang: POST /generate)",
                err=True,
            )
        raise SystemExit(1)


# -- verify: the trainer's log-probs against the sampler's (issue 42) ----------------------------------------------


@app.command()
def verify(
    model: str = typer.Option(
        ..., "--model", help="The policy as Hugging Face transformers loads it (folder or hub name)."
    ),
    source: Path | None = typer.Option(
        None,
        "--input",
        "-i",
        help="An export file (.jsonl, .parquet, slime .pt); default: the samples of the database.",
    ),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda:N)."),
    max_samples: int | None = typer.Option(None, "--max-samples", help="Check at most N samples."),
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        help="Per-token tolerance in nats (default by --dtype: float32 1e-3, bfloat16 0.2, float16 0.1).",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per sample, then the summary."),
    session: list[str] | None = SessionsOpt,
    since: datetime | None = SinceOpt,
    harness: str | None = HarnessOpt,
    on_mismatch: OnMismatch = OnMismatchOpt,
    db: str = DbOpt,
) -> None:
    """Recompute every sample's log-probs with transformers (teacher forcing) and compare them with
    the recorded rollout log-probs on trained positions. Exit 1 when a sample is misaligned."""
    from orchard_rec.verify.command import run as run_verify

    if source is not None and (since is not None or harness is not None):
        raise usage_error("--since and --harness select from the database; with --input use --session")
    report = run_verify(
        model=model,
        source=source,
        open_store=lambda: open_read(db),
        sessions=session,
        selection={"since": _since(since), "harness": harness, "on_mismatch": on_mismatch},
        dtype=dtype,
        device=device,
        max_samples=max_samples,
        tolerance=tolerance,
        as_json=as_json,
        echo=typer.echo,
    )
    if report.misaligned:
        _warn(
            f"{report.misaligned} samples misaligned: their tokens, mask or log-probs do not match what was sampled"
        )
        raise SystemExit(1)


def main() -> NoReturn:
    app()
    raise SystemExit(0)  # pragma: no cover - app() exits


def _fail(message: str, hint: str | None = None) -> NoReturn:
    raise CliError(message, hint)


if __name__ == "__main__":
    main()
