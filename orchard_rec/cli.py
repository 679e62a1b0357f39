"""The ``orchard-rec`` command line. Each command parses options and calls one library function."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from orchard_rec.storage.store import default_db_url

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Record LLM calls of agent harnesses and turn them into training samples.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema (Alembic migrations shipped in the package).")
app.add_typer(db_app, name="db")
console = Console()

DbOpt = typer.Option(default_db_url(), "--db", envvar="ORCHARD_DB", help="SQLAlchemy URL (sqlite:///... or postgresql+psycopg://...).")


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@app.command()
def serve(
    upstream: str = typer.Option(..., "--upstream", envvar="ORCHARD_UPSTREAM", help="Model server base URL including /v1."),
    db: str = DbOpt,
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8100, "--port"),
    mode: str = typer.Option("token", "--mode", help="token (ask the upstream for token ids) or passthrough."),
    max_body_mb: float = typer.Option(64.0, "--max-body-mb", help="Largest request body accepted."),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout"),
    read_timeout: float = typer.Option(600.0, "--read-timeout", help="Longest silence between two upstream bytes."),
) -> None:
    """Run the recording proxy."""
    from orchard_rec.proxy import ProxyConfig, build_app, run_forever

    if mode not in ("token", "passthrough"):
        raise typer.BadParameter("--mode must be token or passthrough")
    cfg = ProxyConfig(
        upstream=upstream, db=db, mode=mode, max_body_bytes=int(max_body_mb * 1024 * 1024),  # type: ignore[arg-type]
        connect_timeout=connect_timeout, read_timeout=read_timeout,
    )
    console.print(f"orchard-rec proxy on http://{host}:{port}  ->  {cfg.upstream}  (mode {cfg.mode}, db {db})")
    run_forever(build_app(cfg), host, port, ready=lambda p: console.print(f"ready: OPENAI_BASE_URL=http://{host}:{p}/s/<session>/v1"))


@app.command()
def sessions(db: str = DbOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """List recorded sessions."""
    from orchard_rec.storage import Store

    store = Store(db)
    rows = store.sessions()
    if as_json:
        typer.echo(json.dumps([{"id": s.id, "calls": s.call_count, "harness": s.harness, "created_at": s.created_at, "updated_at": s.updated_at} for s in rows]))
        return
    t = Table("session", "calls", "harness", "first call (UTC)", "last call (UTC)")
    for s in rows:
        t.add_row(s.id, str(s.call_count), s.harness or "", _when(s.created_at), _when(s.updated_at))
    console.print(t)


@app.command()
def calls(session: str = typer.Argument(..., help="Session id."), db: str = DbOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """List the calls of one session, in sequence order."""
    from orchard_rec.storage import Store

    store = Store(db)
    recs = store.calls(session)
    if not recs and store.session(session) is None:
        console.print(f"[red]no session {session!r} in {db}[/red]")
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps([_call_summary(r) for r in recs]))
        return
    _print_calls(recs)


def _call_summary(r: object) -> dict[str, object]:
    from orchard_rec.records import CallRecord

    assert isinstance(r, CallRecord)
    return {
        "seq": r.seq, "call_id": r.call_id, "dialect": r.dialect.value, "path": r.path, "stream": r.stream,
        "status": r.status_code, "outcome": r.outcome.value, "model": r.model, "harness": r.harness,
        "prompt_tokens": None if r.prompt_ids is None else len(r.prompt_ids),
        "completion_tokens": None if r.completion_ids is None else len(r.completion_ids),
        "finish_reason": r.finish_reason, "latency_ms": round((r.done_at - r.received_at) * 1000, 2), "error": r.error,
    }


def _print_calls(recs: list) -> None:  # type: ignore[type-arg]
    t = Table("seq", "dialect", "stream", "status", "outcome", "prompt ids", "completion ids", "finish", "ms")
    for r in recs:
        s = _call_summary(r)
        t.add_row(
            str(s["seq"]), str(s["dialect"]), "yes" if s["stream"] else "no", str(s["status"]), str(s["outcome"]),
            str(s["prompt_tokens"] if s["prompt_tokens"] is not None else "-"),
            str(s["completion_tokens"] if s["completion_tokens"] is not None else "-"),
            str(s["finish_reason"] or ""), str(s["latency_ms"]),
        )
    console.print(t)


@db_app.command("upgrade")
def db_upgrade(db: str = DbOpt, revision: str = typer.Option("head", "--revision")) -> None:
    """Create or migrate the database schema."""
    from orchard_rec.storage import migrate

    migrate.upgrade(db, revision)
    console.print(f"{db}: at revision {migrate.current(db)}")


@db_app.command("current")
def db_current(db: str = DbOpt) -> None:
    """Show the database's schema revision."""
    from orchard_rec.storage import migrate

    rev = migrate.current(db)
    typer.echo(f"{rev or 'empty'} (head {migrate.head()})")


@app.command()
def demo(
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Keep everything here (default: a new temp folder)."),
    mode: str = typer.Option("token", "--mode"),
) -> None:
    """Run the whole loop on embedded defaults: demo upstream, proxy on SQLite, a scripted agent."""
    from orchard_rec.demo.run import run_demo

    wd = workdir or Path(tempfile.mkdtemp(prefix="orchard-demo-"))
    with console.status("running the demo agent through the proxy..."):
        res = run_demo(wd, mode=mode)
    console.print(f"[bold]Recorded session[/bold] {res.session_id!r}: {len(res.calls)} calls in {res.db_url}")
    _print_calls(res.calls)
    console.print(f"The agent's tool really ran: marker.txt = {res.marker!r}")
    console.print(f"Explore: orchard-rec calls {res.session_id} --db {res.db_url}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
