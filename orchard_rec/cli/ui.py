"""The viewer: ``ui``."""

from __future__ import annotations

import os

import typer

from orchard_rec.cli.common import (
    Credit,
    CreditOpt,
    DbOpt,
    HostOpt,
    OnMismatch,
    _check_port,
    _check_upstream,
    _load_tokenizer,
    _reading,
    open_write,
    usage_error,
)


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
