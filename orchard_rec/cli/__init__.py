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
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click
import typer
from typer.core import TyperGroup

from orchard_rec.cli import common
from orchard_rec.cli.common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    CliUsageError,
    _db_error,
    _typer,
    usage_error,
)
from orchard_rec.cli.db import db_app
from orchard_rec.cli.demo import demo_app
from orchard_rec.cli.export import export, train_app
from orchard_rec.cli.harness import harness_app, run
from orchard_rec.cli.help import teach
from orchard_rec.cli.serve import intercept, serve
from orchard_rec.cli.sessions import calls, outcome, reward, sessions, show, steps
from orchard_rec.cli.teacher import teacher
from orchard_rec.cli.ui import ui
from orchard_rec.cli.verify import verify
from orchard_rec.errors import OrchardError
from orchard_rec.settings import Settings

__all__ = ["CliError", "CliUsageError", "app", "main"]


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
    command's help gets its examples and metavars here too (``orchard_rec.cli.help``)."""

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
        argv = list(sys.argv[1:] if args is None else args)
        cut = argv.index("--") if "--" in argv else len(argv)
        common._debug = Settings.one("debug") not in ("", "0")
        if "--debug" in argv[:cut]:
            argv.remove("--debug")
            common._debug = True
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
            if common._debug:
                raise
            message, hint, code = _explain(exc)
            _report(message, hint)
            sys.exit(code)
        if rv == EXIT_INTERRUPTED:  # typer turns a KeyboardInterrupt into a silent 130
            typer.echo("interrupted", err=True)
        sys.exit(rv if isinstance(rv, int) else 0)


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


app = _typer(cls=_Group, help="Record LLM calls of agent harnesses and turn them into training samples.")


app.add_typer(db_app, name="db")


app.add_typer(harness_app, name="harness")


app.add_typer(train_app, name="train")


app.add_typer(demo_app, name="demo")


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


# The commands, in the order ``orchard-rec --help`` lists them; ``run`` passes unknown options on to the harness.
_COMMANDS: tuple[Callable[..., None], ...] = (
    serve,
    sessions,
    calls,
    show,
    ui,
    export,
    outcome,
    intercept,
    run,
    steps,
    reward,
    teacher,
    verify,
)
for _command in _COMMANDS:
    _extra = {"allow_extra_args": True, "ignore_unknown_options": True} if _command is run else None
    app.command(context_settings=_extra)(_command)


def main() -> NoReturn:
    app()
    raise SystemExit(0)  # pragma: no cover - app() exits


if __name__ == "__main__":  # pragma: no cover - ``python -m orchard_rec.cli`` runs __main__.py
    main()
