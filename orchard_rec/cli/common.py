"""What every command shares: errors and exit codes, option declarations, opening the database,
the checks run before anything is created, and the consoles."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from orchard_rec.errors import OrchardError, UsageError
from orchard_rec.storage.store import default_db_url

if TYPE_CHECKING:
    from orchard_rec.proxy.config import ProxyConfig
    from orchard_rec.storage.store import Store

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


HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


def _typer(**kw: Any) -> typer.Typer:
    return typer.Typer(
        no_args_is_help=True, rich_markup_mode=None, add_completion=False, context_settings=HELP_OPTIONS, **kw
    )


console = Console()
"""Data (tables, samples) on stdout."""
err = Console(stderr=True)
"""Messages, progress and warnings on stderr."""


def _warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


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


def _check_output(path: Path, db: str, force: bool, option: str = "--out") -> None:
    """Never write over a database, nor over a file that is not our own output without --force
    (``orchard_rec.outputs`` has the rules)."""
    from orchard_rec.outputs import check_output

    check_output(path, db_url=db, force=force, option=option)


def _fail(message: str, hint: str | None = None) -> NoReturn:
    raise CliError(message, hint)
