"""Agent harnesses: ``harness config``, ``harness install`` and ``run``."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Literal

import typer

from orchard_rec.cli.common import (
    CliError,
    DbOpt,
    _check_upstream,
    _proxy_config,
    _typer,
    console,
    err,
    open_write,
    usage_error,
)

harness_app = _typer(help="Agent harnesses: configuration snippets and installs.")


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
