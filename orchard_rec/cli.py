"""The ``orchard-rec`` command line. Each command parses options and calls one library function."""

from __future__ import annotations

import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from orchard_rec.storage.store import default_db_url

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Record LLM calls of agent harnesses and turn them into training samples.",
)
db_app = typer.Typer(
    no_args_is_help=True, help="Database schema (Alembic migrations shipped in the package)."
)
app.add_typer(db_app, name="db")
harness_app = typer.Typer(no_args_is_help=True, help="Agent harnesses: configuration snippets and installs.")
app.add_typer(harness_app, name="harness")
train_app = typer.Typer(no_args_is_help=True, help="Reference training loops (needs the train extra: torch).")
app.add_typer(train_app, name="train")
console = Console()

DbOpt = typer.Option(
    default_db_url(),
    "--db",
    envvar="ORCHARD_DB",
    help="SQLAlchemy URL (sqlite:///... or postgresql+psycopg://...).",
)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command()
def serve(
    upstream: str = typer.Option(
        ..., "--upstream", envvar="ORCHARD_UPSTREAM", help="Model server base URL including /v1."
    ),
    db: str = DbOpt,
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8100, "--port"),
    mode: str = typer.Option(
        "token",
        "--mode",
        help="token (ask the upstream for token ids), passthrough, or tito (render here, send ids).",
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="tito: the model's HF tokenizer (path, or 'demo')."
    ),
    upstream_kind: str = typer.Option(
        "vllm", "--upstream-kind", help="tito: vllm (/v1/completions) or sglang (/generate)."
    ),
    tool_parser: str = typer.Option("hermes", "--tool-parser", help="tito: tool-call parser (hermes)."),
    max_body_mb: float = typer.Option(64.0, "--max-body-mb", help="Largest request body accepted."),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout"),
    read_timeout: float = typer.Option(
        600.0, "--read-timeout", help="Longest silence between two upstream bytes."
    ),
    durability: str = typer.Option(
        "async",
        "--durability",
        help="async, or wal: the last byte waits for the fsync'd spool (kill -9 safe).",
    ),
    spool: str | None = typer.Option(
        None, "--spool", help="Spool file (default: beside a SQLite db, else .orchard-spool/)."
    ),
    max_inflight: int = typer.Option(
        4096, "--max-inflight", help="Calls in flight before 429 (0: no limit)."
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
) -> None:
    """Run the recording proxy."""
    import os

    from orchard_rec.proxy import ProxyConfig, build_app, run_forever

    if mode not in ("token", "passthrough", "tito"):
        raise typer.BadParameter("--mode must be token, passthrough or tito")

    def _keys(values: list[str] | None) -> tuple[str, ...]:
        return tuple(k.strip() for v in values or () for k in v.split(",") if k.strip())

    upstream_key = None
    if upstream_key_env:
        upstream_key = os.environ.get(upstream_key_env)
        if not upstream_key:
            raise typer.BadParameter(
                f"environment variable {upstream_key_env} is empty or unset", param_hint="--upstream-key-env"
            )
    cfg = ProxyConfig(
        upstream=upstream,
        db=db,
        mode=mode,
        max_body_bytes=int(max_body_mb * 1024 * 1024),  # type: ignore[arg-type]
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        durability=durability,
        spool=spool,  # type: ignore[arg-type]
        max_inflight=max_inflight,
        api_keys=_keys(api_key),
        admin_keys=_keys(admin_key),
        upstream_key=upstream_key,
        tokenizer=tokenizer,
        upstream_kind=upstream_kind,
        tool_parser=tool_parser,  # type: ignore[arg-type]
    )
    console.print(
        f"orchard-rec proxy on http://{host}:{port}  ->  {cfg.upstream}  (mode {cfg.mode}, durability {cfg.durability}, auth {'on' if cfg.api_keys else 'off'})"
    )
    run_forever(
        build_app(cfg),
        host,
        port,
        ready=lambda p: console.print(f"ready: OPENAI_BASE_URL=http://{host}:{p}/s/<session>/v1"),
    )


@app.command()
def sessions(db: str = DbOpt, as_json: bool = typer.Option(False, "--json")) -> None:
    """List recorded sessions."""
    from orchard_rec.storage import Store

    store = Store(db)
    rows = store.sessions()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "id": s.id,
                        "calls": s.call_count,
                        "harness": s.harness,
                        "created_at": s.created_at,
                        "updated_at": s.updated_at,
                    }
                    for s in rows
                ]
            )
        )
        return
    t = Table("session", "calls", "harness", "first call (UTC)", "last call (UTC)")
    for s in rows:
        t.add_row(s.id, str(s.call_count), s.harness or "", _when(s.created_at), _when(s.updated_at))
    console.print(t)


@app.command()
def calls(
    session: str = typer.Argument(..., help="Session id."),
    db: str = DbOpt,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
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
        "seq": r.seq,
        "call_id": r.call_id,
        "dialect": r.dialect.value,
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


def _print_calls(recs: list) -> None:  # type: ignore[type-arg]
    t = Table("seq", "dialect", "stream", "status", "outcome", "prompt ids", "completion ids", "finish", "ms")
    for r in recs:
        s = _call_summary(r)
        t.add_row(
            str(s["seq"]),
            str(s["dialect"]),
            "yes" if s["stream"] else "no",
            str(s["status"]),
            str(s["outcome"]),
            str(s["prompt_tokens"] if s["prompt_tokens"] is not None else "-"),
            str(s["completion_tokens"] if s["completion_tokens"] is not None else "-"),
            str(s["finish_reason"] or ""),
            str(s["latency_ms"]),
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
    workdir: Path | None = typer.Option(
        None, "--workdir", help="Keep everything here (default: a new temp folder)."
    ),
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
    from orchard_rec.demo.tokenizer import build_tokenizer
    from orchard_rec.reconstruct.render import render_sample

    for s in res.samples:
        console.print(render_sample(s, build_tokenizer(), prompt_chars=300))
    trained = sum(sum(s.loss_mask) for s in res.samples)
    console.print(
        f"Reconstructed {len(res.calls)} calls into {len(res.samples)} sample(s), {trained} trained tokens; jsonl: {res.jsonl}"
    )
    kind = (
        "slime rollout (torch.load-able, --load-debug-rollout-data)"
        if res.trainer_export.suffix == ".pt"
        else "parquet"
    )
    console.print(f"Trainer export, {kind}: {res.trainer_export}")
    console.print(f"Explore: orchard-rec show {res.session_id} --db {res.db_url} --tokenizer demo")


@app.command()
def export(
    fmt: str = typer.Option("jsonl", "--format", "-f", help="Output format (see --list-formats)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Output file."),
    db: str = DbOpt,
    session: list[str] | None = typer.Option(None, "--session", help="Only these sessions (repeatable)."),
    since: datetime | None = typer.Option(
        None, "--since", help="Only sessions active since (ISO date/time, UTC)."
    ),
    harness: str | None = typer.Option(None, "--harness"),
    on_mismatch: str = typer.Option("split", "--on-mismatch", help="split | realign"),
    credit: str = typer.Option("assistant", "--credit", help="assistant | last-turn | turn-weights | value"),
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
        None, "--status", help="Keep samples with this status (repeatable)."
    ),
    min_reward: float | None = typer.Option(None, "--min-reward"),
    pass_rate: str | None = typer.Option(
        None, "--pass-rate", help="LO:HI - keep groups whose pass rate is in [LO, HI] (needs --group-by)."
    ),
    rollout_size: int | None = typer.Option(
        None,
        "--rollout-size",
        help="slime: samples per file (files out_0.pt, out_1.pt, ... or a {rollout_id} template).",
    ),
    list_formats: bool = typer.Option(False, "--list-formats", help="List the formats and exit."),
) -> None:
    """Reconstruct sessions into training samples and write them in a trainer's format."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchard_rec.exporters.base import ExportError, available
    from orchard_rec.exporters.pipeline import export as run_export
    from orchard_rec.storage import Store

    if list_formats:
        for name, target in sorted(available().items()):
            typer.echo(f"{name}\t{target}")
        return
    if out is None:
        raise typer.BadParameter("--out is required", param_hint="--out")
    if on_mismatch not in ("split", "realign"):
        raise typer.BadParameter("--on-mismatch must be split or realign")
    window = None
    if pass_rate:
        try:
            lo, hi = (float(x) for x in pass_rate.split(":"))
        except ValueError:
            raise typer.BadParameter("--pass-rate takes LO:HI, e.g. 0.25:0.75") from None
        window = (lo, hi)
    options = {"rollout_size": rollout_size} if fmt == "slime" and rollout_size else {}
    since_ts = since.replace(tzinfo=since.tzinfo or UTC).timestamp() if since else None
    total = len(Store(db).sessions(session, since=since_ts, harness=harness))
    tok = None
    if tokenizer:
        from orchard_rec.tokenizer import load_hf_tokenizer

        try:
            tok = load_hf_tokenizer(tokenizer)
        except (OSError, ValueError) as exc:
            console.print(f"[red]error:[/red] cannot load tokenizer {tokenizer!r}: {exc}")
            raise typer.Exit(2) from None
    progress = Progress(
        TextColumn("exporting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sessions"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )
    try:
        with progress:
            task = progress.add_task("export", total=total)
            stats = run_export(
                db,
                fmt,
                out,
                sessions=session,
                since=since_ts,
                harness=harness,
                on_mismatch=on_mismatch,  # type: ignore[arg-type]
                credit=credit,
                on_session=lambda _s: progress.advance(task),
                tokenizer=tok,
                format_options=options,
                group_by=group_by,
                statuses=status,
                min_reward=min_reward,
                pass_rate=window,
            )
    except (ExportError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(
        f"wrote {stats.samples} samples ({stats.tokens} tokens) from {total} sessions to {', '.join(map(str, stats.files))}"
    )


@app.command()
def show(
    session: str = typer.Argument(..., help="Session id."),
    db: str = DbOpt,
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer to decode ids (path, or 'demo'); ids are shown without it."
    ),
    on_mismatch: str = typer.Option("split", "--on-mismatch"),
    credit: str = typer.Option("assistant", "--credit"),
    prompt_chars: int = typer.Option(
        600, "--prompt-chars", help="Show at most this many characters of each prompt (its end)."
    ),
) -> None:
    """Print a session's samples with the trained tokens highlighted."""
    from orchard_rec.reconstruct.credit import credit_policy
    from orchard_rec.reconstruct.render import render_sample
    from orchard_rec.reconstruct.stream import iter_samples
    from orchard_rec.storage import Store

    store = Store(db)
    if store.session(session) is None:
        console.print(f"[red]no session {session!r} in {db}[/red]")
        raise typer.Exit(1)
    tok = None
    if tokenizer:
        from orchard_rec.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer)
    for s in iter_samples(store, sessions=[session], on_mismatch=on_mismatch, credit=credit_policy(credit)):  # type: ignore[arg-type]
        console.print(render_sample(s, tok, prompt_chars=prompt_chars))


@app.command()
def outcome(
    session: str = typer.Argument(..., help="Session id."),
    reward: float | None = typer.Option(None, "--reward"),
    reward_json: str | None = typer.Option(
        None, "--reward-json", help='Named rewards, e.g. \'{"tests": 1, "style": 0.5}\'.'
    ),
    status: str | None = typer.Option(None, "--status", help="completed | truncated | aborted | failed"),
    step_values: str | None = typer.Option(
        None, "--step-values", help="Comma-separated value per model turn."
    ),
    db: str = DbOpt,
) -> None:
    """Attach a reward/status to a session (flows into every export)."""
    from orchard_rec.records import Outcome
    from orchard_rec.storage import Store

    r: object = json.loads(reward_json) if reward_json else reward
    sv = tuple(float(x) for x in step_values.split(",")) if step_values else None
    try:
        Store(db).set_outcome(session, Outcome(reward=r, status=status, step_values=sv))  # type: ignore[arg-type]
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(f"session {session}: reward={r} status={status}")


@harness_app.command("config")
def harness_config(
    name: str = typer.Argument(..., help="codex | claude-code | openclaw | zeroclaw"),
    base_url: str = typer.Option("http://127.0.0.1:8100", "--base-url", help="The proxy's address."),
    session: str | None = typer.Option(None, "--session"),
    model: str = typer.Option("MODEL", "--model"),
) -> None:
    """Print what to paste so the harness talks to the proxy."""
    from orchard_rec.harnesses import get

    try:
        h = get(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(h.config_snippet(base_url, session, model), nl=False)


@harness_app.command("install")
def harness_install(name: str = typer.Argument("all"), force: bool = typer.Option(False, "--force")) -> None:
    """Install pinned harness CLIs from the npm registry into the cache ($ORCHARD_HARNESS_CACHE)."""
    from orchard_rec.harnesses import HARNESSES, get, install

    targets = [h for h in HARNESSES if h.npm] if name == "all" else [get(name)]
    for h in targets:
        with console.status(f"installing {h.name} ({', '.join(h.npm)})"):
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
    mode: str = typer.Option(
        "token",
        "--mode",
        help="With --upstream-override: token (ask the server for token ids) or passthrough.",
    ),
    confdir: str | None = typer.Option(
        None, "--confdir", help="mitmproxy's folder holding its CA (default ~/.mitmproxy)."
    ),
    upstream_ca: str | None = typer.Option(
        None, "--upstream-ca", help="PEM bundle to verify upstream hosts with (default: the system's)."
    ),
    ssl_insecure: bool = typer.Option(False, "--ssl-insecure", help="Do not verify upstream certificates."),
    spool: str | None = typer.Option(
        None, "--spool", help="Spool file (default: beside a SQLite db, else .orchard-spool/)."
    ),
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
    import os
    import sys

    from orchard_rec.intercept import runtime

    if install_runtime:
        with console.status(f"building the intercept runtime (mitmproxy {runtime.MITM_VERSION})"):
            exe = runtime.install()
        console.print(f"intercept runtime: {exe}")
        return
    if not runtime.has_mitmproxy():
        if not runtime.runtime_ready():
            console.print(
                f"[red]mitmproxy is not installed in this Python ({sys.version.split()[0]}).[/red] Run "
                "`orchard-rec intercept --install` once (builds a Python >= 3.12 venv with mitmproxy "
                f"{runtime.MITM_VERSION}), or `pip install 'orchard-rec[mitm]'` on Python >= 3.12."
            )
            raise typer.Exit(2)
        exe = str(runtime.runtime_orchard())
        os.execv(exe, [exe, "intercept", *sys.argv[sys.argv.index("intercept") + 1 :]])
    from orchard_rec.intercept import InterceptConfig
    from orchard_rec.intercept.run import ca_info, run_intercept

    host, _, port = listen.rpartition(":")
    extra = {"confdir": confdir} if confdir else {}
    cfg = InterceptConfig(
        listen_host=host or "127.0.0.1",
        listen_port=int(port),
        db=db,
        hosts=tuple(hosts.split(",")),
        upstream_override=upstream_override,
        mode=mode,
        upstream_ca=upstream_ca,
        ssl_insecure=ssl_insecure,  # type: ignore[arg-type]
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
    run_intercept(cfg, verbose=verbose)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="codex | claude-code | openclaw | zeroclaw"),
    session: str | None = typer.Option(None, "--session", help="Session id (default: NAME-<random>)."),
    proxy: str | None = typer.Option(
        None, "--proxy", help="A running proxy; else one is started for this run."
    ),
    upstream: str | None = typer.Option(
        None, "--upstream", envvar="ORCHARD_UPSTREAM", help="Model server, when starting a proxy."
    ),
    db: str = DbOpt,
    mode: str = typer.Option("token", "--mode"),
    model: str = typer.Option("orchard-model", "--model"),
    binary: str | None = typer.Option(
        None, "--bin", help="The harness executable (default: cache, then PATH)."
    ),
    workdir: Path | None = typer.Option(None, "--workdir"),
    timeout: float = typer.Option(600.0, "--timeout"),
) -> None:
    """Run a harness through the proxy: private home and config, session-tagged URL, outcome recorded.

    Arguments after -- go to the harness (e.g. the prompt).
    """
    import uuid

    from orchard_rec.harnesses import get, run_harness

    h = get(name)
    sid = session or f"{name}-{uuid.uuid4().hex[:8]}"
    server = None
    if proxy is None:
        if not upstream:
            raise typer.BadParameter("give --proxy URL of a running proxy, or --upstream URL to start one")
        from orchard_rec.proxy import BackgroundServer, ProxyConfig, build_app

        cfg = ProxyConfig(upstream=upstream, db=db, mode=mode)  # type: ignore[arg-type]
        server = BackgroundServer(lambda: build_app(cfg)).start()
        proxy = server.url
    try:
        res = run_harness(
            h, proxy, sid, list(ctx.args), model=model, binary=binary, workdir=workdir, timeout=timeout
        )
    except FileNotFoundError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    finally:
        if server is not None:
            from orchard_rec.proxy.app import RECORDER

            if server.app is not None:
                server.app[RECORDER].flush()
            server.stop()
    console.print(
        f"session {sid}: {h.name} exited {res.exit_code} after {res.duration_s:.1f}s (workdir {res.workdir})"
    )
    typer.echo(sid)
    if res.exit_code != 0:
        raise typer.Exit(res.exit_code)


@train_app.command("sft")
def train_sft_cmd(
    model: Path = typer.Option(..., "--model", help="A local Hugging Face causal LM folder."),
    out: Path = typer.Option(..., "--out", help="Where to save the trained checkpoint."),
    db: str = DbOpt,
    session: list[str] | None = typer.Option(None, "--session"),
    credit: str = typer.Option("assistant", "--credit"),
    on_mismatch: str = typer.Option("split", "--on-mismatch"),
    steps: int = typer.Option(20, "--steps"),
    batch_size: int = typer.Option(4, "--batch-size"),
    lr: float = typer.Option(1e-4, "--lr"),
) -> None:
    """Credit-assignment SFT: train only on credited tokens of the recorded samples."""
    try:
        from transformers import AutoModelForCausalLM

        from orchard_rec.trainers.sft import train_sft
    except ImportError as exc:
        console.print(
            f"[red]error:[/red] training needs torch and transformers: pip install 'orchard-rec[train,hf]' ({exc})"
        )
        raise typer.Exit(2) from None
    from rich.progress import Progress

    from orchard_rec.reconstruct import iter_samples
    from orchard_rec.reconstruct.credit import credit_policy
    from orchard_rec.storage import Store

    samples = list(
        iter_samples(Store(db), sessions=session, credit=credit_policy(credit), on_mismatch=on_mismatch)
    )  # type: ignore[arg-type]
    lm = AutoModelForCausalLM.from_pretrained(str(model), local_files_only=True)
    with Progress(console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("sft", total=steps)

        def step(k: int, loss: float, n: int) -> None:
            progress.update(task, advance=1, description=f"sft loss {loss:.4f} ({n} credited tokens)")
            if not console.is_terminal:
                console.print(f"step {k} loss {loss:.4f} credited_tokens {n}")

        res = train_sft(lm, samples, steps=steps, batch_size=batch_size, lr=lr, out=out, on_step=step)
    console.print(
        f"trained {steps} steps on {len(samples)} samples, {res.credited_tokens} credited tokens; loss {res.losses[0]:.4f} -> {res.losses[-1]:.4f}; saved {out}"
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
