"""The recording front doors: ``serve`` (the aiohttp proxy) and ``intercept`` (mitmproxy)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from orchard_rec.cli.common import (
    CliError,
    DbOpt,
    HostOpt,
    ProxyMode,
    SpoolOpt,
    _check_port,
    _check_spool,
    _check_upstream,
    _check_writable,
    _fleet_urls,
    _load_tokenizer,
    _proxy_config,
    _warn,
    console,
    err,
    open_write,
    usage_error,
)
from orchard_rec.intercept.config import DEFAULT_HOSTS
from orchard_rec.proxy.config import ProxyConfig

# ``serve``'s own options, one alias each: its signature keeps one line per parameter
_ServeUpstream = Annotated[
    list[str] | None,
    typer.Option(
        "--upstream",
        envvar="ORCHARD_UPSTREAM",
        help="Model server base URL including /v1 (repeatable: a fleet; env: comma-separated).",
    ),
]
_ServeUpstreamsFile = Annotated[
    Path | None, typer.Option("--upstreams-file", help="More upstreams: one URL per line (# comments).")
]
_ServeRoute = Annotated[
    Literal["session", "least-busy", "round-robin"],
    typer.Option("--route", help="Fleet routing: session (sticky, bounded load), least-busy, round-robin."),
]
_ServeRouteEpsilon = Annotated[
    float,
    typer.Option(
        "--route-epsilon", help="session: a server may hold up to ceil((1+eps) x average) calls in flight."
    ),
]
_ServeRoutingHeader = Annotated[
    str | None,
    typer.Option(
        "--routing-header", help="Also send the session id upstream in this header (e.g. X-SMG-Routing-Key)."
    ),
]
_ServeHealthInterval = Annotated[
    float | None,
    typer.Option("--health-interval", help="Seconds between upstream health checks (default 10)."),
]
_ServePort = Annotated[int, typer.Option("--port", min=0, max=65535, help="0: any free port.")]
_ServeMode = Annotated[
    ProxyMode,
    typer.Option(
        "--mode", help="token (ask the upstream for token ids), passthrough, or tito (render here, send ids)."
    ),
]
_ServeTokenizer = Annotated[
    str | None, typer.Option("--tokenizer", help="tito: the model's HF tokenizer (path, or 'demo').")
]
_ServeUpstreamKind = Annotated[
    Literal["vllm", "sglang"],
    typer.Option("--upstream-kind", help="tito: vllm (/v1/completions) or sglang (/generate)."),
]
_ServeToolParser = Annotated[Literal["hermes"], typer.Option("--tool-parser", help="tito: tool-call parser.")]
_ServeMaxBodyMb = Annotated[
    float, typer.Option("--max-body-mb", help="Largest request body accepted, in megabytes (> 0).")
]
_ServeConnectTimeout = Annotated[
    float, typer.Option("--connect-timeout", help="Seconds to wait for the upstream to accept a connection.")
]
_ServeReadTimeout = Annotated[
    float, typer.Option("--read-timeout", help="Longest silence between two upstream bytes.")
]
_Durability = Literal["process", "machine", "async", "wal"]
_ServeDurability = Annotated[
    _Durability,
    typer.Option(
        "--durability",
        help="What a recorded call survives. process (default): the last byte waits for the spool's write(2),"
        " fsync'd within --fsync-interval (the proxy's crash loses nothing, a power loss at most that);"
        " machine: waits for the fsync (group commit); async: recorded after the response. wal: old name of machine.",
    ),
]
_ServeFsyncInterval = Annotated[
    float,
    typer.Option(
        "--fsync-interval",
        min=0.001,
        max=60.0,
        help="process durability: the longest a written spool line waits for its fsync, in seconds (default 0.1).",
    ),
]
_ServeDbWriter = Annotated[
    Literal["auto", "thread", "process"],
    typer.Option(
        "--db-writer",
        envvar="ORCHARD_DB_WRITER",
        help="process/machine durability: build and write records in a child process (off the event loop's"
        " interpreter lock; more memory) or a thread; auto (default): the process with one worker on a"
        " machine of 2 or more cores, else the thread.",
    ),
]
_ServeMaxInflight = Annotated[
    int, typer.Option("--max-inflight", help="Calls in flight before 429 (0: no limit).")
]
_ServeMaxQueueBytes = Annotated[
    int,
    typer.Option(
        "--max-queue-bytes",
        help="Bytes of calls waiting for the database before 429 (default 256 MiB; 0: no limit).",
    ),
]
_ServePaceQueueBytes = Annotated[
    int,
    typer.Option(
        "--pace-queue-bytes",
        help="Above this many queued bytes new calls wait for the writer instead of queueing"
        " (default 32 MiB; 0: off).",
    ),
]
_ServeApiKey = Annotated[
    list[str] | None,
    typer.Option(
        "--api-key",
        envvar="ORCHARD_API_KEYS",
        help="Client key, KEY or KEY:SESSION_PREFIX (repeatable; env: comma-separated).",
    ),
]
_ServeAdminKey = Annotated[
    list[str] | None,
    typer.Option("--admin-key", envvar="ORCHARD_ADMIN_KEYS", help="Key for admin routes (outcomes)."),
]
_ServeUpstreamKeyEnv = Annotated[
    str | None, typer.Option("--upstream-key-env", help="Name of the env var holding the upstream's API key.")
]
_ServeShutdownTimeout = Annotated[
    float, typer.Option("--shutdown-timeout", help="On SIGTERM/Ctrl-C, wait this long for calls in flight.")
]
_ServeLogLevel = Annotated[
    Literal["debug", "info", "warning", "error"],
    typer.Option("--log-level", help="info: one access-log line per call; warning: problems only."),
]
_ServeLogFormat = Annotated[
    Literal["text", "json"],
    typer.Option("--log-format", help="Log lines as text or one JSON object per line."),
]
_ServeUi = Annotated[
    bool,
    typer.Option(
        "--ui", help="Also serve the trajectory viewer at /ui (behind --admin-key when keys are set)."
    ),
]
_ServeUiResend = Annotated[
    bool,
    typer.Option(
        "--ui-resend", help="With --ui: allow 'send again' (replays a recorded call to the upstream)."
    ),
]
_ServePolicyRefresh = Annotated[
    float,
    typer.Option(
        "--policy-refresh",
        min=0,
        help="Seconds between asks of the server's policy version (GET /weight_info, vLLM with VLLM_SERVER_DEV_MODE=1); 0: only the trainer's word (POST /v1/orchard/policy).",
    ),
]
_ServeTitoEndpoint = Annotated[
    Literal["completions", "generate"],
    typer.Option(
        "--tito-endpoint",
        help="tito with vLLM: /v1/completions, or /inference/v1/generate (vllm serve --enable-scale-out: per-token weight_versions, aborted generations continued).",
    ),
]
_ServeCacheSalt = Annotated[
    Literal["off", "policy"],
    typer.Option(
        "--cache-salt",
        help="policy: send cache_salt = the current policy version with chat/completions calls (no prefix cache across weight updates).",
    ),
]
_ServeRoutedExperts = Annotated[
    bool,
    typer.Option(
        "--routed-experts",
        help="MoE routing replay: record the routed_experts the server answers (vLLM --enable-return-routed-experts), token and tito mode.",
    ),
]
_ServeWorkers = Annotated[
    str,
    typer.Option(
        "--workers",
        envvar="ORCHARD_WORKERS",
        help="Proxy processes on the one port (SO_REUSEPORT), each with its own spool SPOOL.w<k>; auto: one per core.",
    ),
]


def serve(
    upstream: _ServeUpstream = None,
    upstreams_file: _ServeUpstreamsFile = None,
    route: _ServeRoute = "session",
    route_epsilon: _ServeRouteEpsilon = 0.5,
    routing_header: _ServeRoutingHeader = None,
    health_interval: _ServeHealthInterval = None,
    db: str = DbOpt,
    host: str = HostOpt,
    port: _ServePort = 8100,
    mode: _ServeMode = "token",
    tokenizer: _ServeTokenizer = None,
    upstream_kind: _ServeUpstreamKind = "vllm",
    tool_parser: _ServeToolParser = "hermes",
    max_body_mb: _ServeMaxBodyMb = 64.0,
    connect_timeout: _ServeConnectTimeout = 10.0,
    read_timeout: _ServeReadTimeout = 600.0,
    durability: _ServeDurability = "process",
    fsync_interval: _ServeFsyncInterval = 0.1,
    db_writer: _ServeDbWriter = "auto",
    spool: str | None = SpoolOpt,
    max_inflight: _ServeMaxInflight = 4096,
    max_queue_bytes: _ServeMaxQueueBytes = 256 * 1024 * 1024,
    pace_queue_bytes: _ServePaceQueueBytes = 32 * 1024 * 1024,
    api_key: _ServeApiKey = None,
    admin_key: _ServeAdminKey = None,
    upstream_key_env: _ServeUpstreamKeyEnv = None,
    shutdown_timeout: _ServeShutdownTimeout = 30.0,
    log_level: _ServeLogLevel = "info",
    log_format: _ServeLogFormat = "text",
    ui: _ServeUi = False,
    ui_resend: _ServeUiResend = False,
    policy_refresh: _ServePolicyRefresh = 1.0,
    tito_endpoint: _ServeTitoEndpoint = "completions",
    cache_salt: _ServeCacheSalt = "off",
    routed_experts: _ServeRoutedExperts = False,
    workers: _ServeWorkers = "1",
) -> None:
    """Run the recording proxy."""
    from orchard_rec.proxy.server import configure_logging

    n_workers = _check_limits(workers, max_queue_bytes, max_body_mb, pace_queue_bytes)
    durability = _durability(durability)
    urls = _fleet_urls(upstream, upstreams_file)
    urls = [_check_upstream(u, openai_style=not (mode == "tito" and upstream_kind == "sglang")) for u in urls]
    _check_health_and_tito(health_interval, mode, tokenizer)
    upstream_key = _upstream_key(upstream_key_env)
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
        db_writer=_db_writer(db_writer, durability, n_workers),
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
        _serve_one(cfg, host, port, shutdown_timeout)
        return
    _serve_workers(cfg, host, port, n_workers, shutdown_timeout)


def _check_limits(workers: str, max_queue_bytes: int, max_body_mb: float, pace_queue_bytes: int) -> int:
    """``serve``'s bounds checked; the number of worker processes."""
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
    return n_workers


def _db_writer(choice: str, durability: str, n_workers: int) -> Literal["thread", "process"]:
    """``--db-writer``, ``auto`` decided: the writer process where it runs beside the event loop
    (one worker, a spool to read from, a second core), else the thread (``--workers`` spread the
    work over the cores already; on one core a second process only adds its own CPU)."""
    if choice in ("thread", "process"):
        return choice  # type: ignore[return-value]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return "process" if durability != "async" and n_workers == 1 and cores >= 2 else "thread"


def _durability(durability: _Durability) -> _Durability:
    """``--durability``, its old name ``wal`` said and mapped to ``machine``."""
    if durability == "wal":
        _warn(
            "--durability wal is now called machine (the same: the last byte after the spool's fsync);"
            " wal will be removed. The default, process, survives the proxy's crash at write(2) speed."
        )
        return "machine"
    return durability


def _check_health_and_tito(health_interval: float | None, mode: str, tokenizer: str | None) -> None:
    """``--health-interval`` above 0; ``--mode tito`` with a ``--tokenizer``."""
    if health_interval is not None and health_interval <= 0:
        raise usage_error(
            f"--health-interval {health_interval:g}: must be above 0", "the default is 10 (seconds)"
        )
    if mode == "tito" and not tokenizer:
        raise usage_error(
            "--mode tito needs --tokenizer", "the model's Hugging Face tokenizer folder (or 'demo')"
        )


def _keys(values: list[str] | None) -> tuple[str, ...]:
    """``--api-key``/``--admin-key`` values (each may be comma-separated) as one tuple."""
    return tuple(k.strip() for v in values or () for k in v.split(",") if k.strip())


def _upstream_key(upstream_key_env: str | None) -> str | None:
    """The upstream's API key, from the environment variable ``--upstream-key-env`` names."""
    if not upstream_key_env:
        return None
    upstream_key = os.environ.get(upstream_key_env)
    if not upstream_key:
        raise usage_error(
            f"--upstream-key-env: the environment variable {upstream_key_env} is empty or unset"
        )
    return upstream_key


def _serve_one(cfg: ProxyConfig, host: str, port: int, shutdown_timeout: float) -> None:
    """``serve`` in this process; the spools of an earlier run with workers (``SPOOL.w<k>``)
    are stored before serving."""
    from orchard_rec.proxy.recorder import default_spool
    from orchard_rec.proxy.server import serve_proxy
    from orchard_rec.proxy.workers import replay_orphans

    replay_orphans(cfg, Path(cfg.spool) if cfg.spool else default_spool(cfg.db), 1)
    serve_proxy(cfg, host, port, shutdown_timeout=shutdown_timeout)


def _serve_workers(cfg: ProxyConfig, host: str, port: int, n: int, shutdown_timeout: float) -> None:
    """``serve --workers N`` (N >= 2): ``proxy.workers``; a spool in use is said in one line."""
    from orchard_rec.proxy.recorder import default_spool
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


# ``intercept``'s own options, one alias each: its signature keeps one line per parameter
_InterceptListen = Annotated[
    str, typer.Option("--listen", help="HOST:PORT for the harness's HTTPS_PROXY (port 0: any free port).")
]
_InterceptHosts = Annotated[
    str,
    typer.Option(
        "--hosts",
        help="Comma-separated hosts whose LLM calls are recorded; other hosts are tunnelled untouched.",
    ),
]
_InterceptUpstreamOverride = Annotated[
    list[str] | None,
    typer.Option(
        "--upstream-override",
        help="Send intercepted LLM calls to this base URL (incl. /v1) instead, e.g. a local vLLM (repeatable: a fleet).",
    ),
]
_InterceptRoute = Annotated[
    Literal["session", "least-busy", "round-robin"],
    typer.Option("--route", help="Fleet routing: session (sticky, bounded load), least-busy, round-robin."),
]
_InterceptRoutingHeader = Annotated[
    str | None,
    typer.Option("--routing-header", help="Also send the session id to the server in this header."),
]
_InterceptRoutedExperts = Annotated[
    bool,
    typer.Option(
        "--routed-experts",
        help="MoE routing replay: record the routed_experts the server answers, token and tito mode.",
    ),
]
_InterceptCacheSalt = Annotated[
    Literal["off", "policy"],
    typer.Option(
        "--cache-salt",
        help="policy: send cache_salt = the current policy version with token and tito calls (no prefix cache across weight updates).",
    ),
]
_InterceptPolicyRefresh = Annotated[
    float,
    typer.Option(
        "--policy-refresh",
        min=0,
        help="Seconds between asks of the first server's policy version (GET /weight_info); 0: only a call's X-Orchard-Policy-Version header.",
    ),
]
_InterceptTitoEndpoint = Annotated[
    Literal["completions", "generate"],
    typer.Option(
        "--tito-endpoint",
        help="tito with vLLM: /v1/completions, or /inference/v1/generate (per-token weight_versions, aborted generations continued).",
    ),
]
_InterceptMode = Annotated[
    Literal["token", "passthrough", "tito"],
    typer.Option(
        "--mode",
        help="With --upstream-override: token (ask the server for token ids), tito (send the session's"
        " exact ids to its token endpoint; needs --tokenizer) or passthrough.",
    ),
]
_InterceptTokenizer = Annotated[
    str | None, typer.Option("--tokenizer", help="tito: the model's Hugging Face tokenizer (path or name).")
]
_InterceptUpstreamKind = Annotated[
    Literal["vllm", "sglang"],
    typer.Option("--upstream-kind", help="tito: vllm (/v1/completions) or sglang (/generate)."),
]
_InterceptDurability = Annotated[
    Literal["process", "machine", "async"],
    typer.Option(
        "--durability",
        help="process: the end of a client's answer waits until its call's spool line is written (a kill -9"
        " loses nothing); machine: until it is fsync'd; async: never waits.",
    ),
]
_InterceptConfdir = Annotated[
    str | None, typer.Option("--confdir", help="mitmproxy's folder holding its CA (default ~/.mitmproxy).")
]
_InterceptUpstreamCa = Annotated[
    str | None,
    typer.Option("--upstream-ca", help="PEM bundle to verify upstream hosts with (default: the system's)."),
]
_InterceptSslInsecure = Annotated[
    bool, typer.Option("--ssl-insecure", help="Do not verify upstream certificates.")
]
_InterceptPrintCa = Annotated[
    bool,
    typer.Option(
        "--print-ca",
        help="Create the CA if needed, print its path and the env vars a harness needs, and exit.",
    ),
]
_InterceptInstallRuntime = Annotated[
    bool,
    typer.Option(
        "--install",
        help="Build the mitmproxy runtime venv (Python >= 3.12) under ~/.cache/orchard-rec/mitm, and exit.",
    ),
]
_InterceptVerbose = Annotated[bool, typer.Option("--verbose", help="mitmproxy's own log on stderr.")]


def intercept(
    listen: _InterceptListen = "127.0.0.1:8080",
    db: str = DbOpt,
    hosts: _InterceptHosts = ",".join(DEFAULT_HOSTS),
    upstream_override: _InterceptUpstreamOverride = None,
    route: _InterceptRoute = "session",
    routing_header: _InterceptRoutingHeader = None,
    routed_experts: _InterceptRoutedExperts = False,
    cache_salt: _InterceptCacheSalt = "off",
    policy_refresh: _InterceptPolicyRefresh = 1.0,
    tito_endpoint: _InterceptTitoEndpoint = "completions",
    mode: _InterceptMode = "token",
    tokenizer: _InterceptTokenizer = None,
    upstream_kind: _InterceptUpstreamKind = "vllm",
    durability: _InterceptDurability = "process",
    confdir: _InterceptConfdir = None,
    upstream_ca: _InterceptUpstreamCa = None,
    ssl_insecure: _InterceptSslInsecure = False,
    spool: str | None = SpoolOpt,
    print_ca: _InterceptPrintCa = False,
    install_runtime: _InterceptInstallRuntime = False,
    verbose: _InterceptVerbose = False,
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
    overrides = [_check_upstream(u, "--upstream-override") for u in upstream_override or ()]
    if mode == "tito" and overrides and not tokenizer:
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
        upstream_override=overrides[0] if overrides else None,
        fleet=tuple(overrides[1:]),
        route=route,
        routing_header=routing_header,
        routed_experts=routed_experts,
        cache_salt=cache_salt,
        policy_refresh=policy_refresh,
        tito_endpoint=tito_endpoint,
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
