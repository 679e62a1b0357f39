"""Proxy settings (pydantic at the edge: validated once, then read-only). The environment's
``ORCHARD_*`` knobs (cache sizes, writer timings) are next to it: ``orchard_rec.settings.Settings``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Mode", "ProxyConfig"]

Mode = Literal["token", "passthrough", "tito"]


class ProxyConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream: str
    """The model server's base URL including ``/v1``, as a client would put in OPENAI_BASE_URL."""
    db: str = "sqlite:///./orchard.db"
    mode: Mode = "token"
    """``token``: ask a vLLM-style upstream for token ids and logprobs (and translate Responses and
    Messages to chat); ``passthrough``: forward every call natively, byte for byte; ``tito``:
    render prompts here and send token ids (token-in/token-out, see ``proxy/tito.py``)."""
    tokenizer: str | None = None
    """Tito: the model's Hugging Face tokenizer (path, or ``demo``)."""
    upstream_kind: Literal["vllm", "sglang"] = "vllm"
    """Tito: vLLM ``/v1/completions`` with token-id prompts, or SGLang's native ``/generate``."""
    tool_parser: Literal["hermes"] = "hermes"
    """Tito: how tool calls are read from generated text (vLLM's parser names)."""
    max_body_bytes: int = Field(64 * 1024 * 1024, gt=0)
    connect_timeout: float = Field(10.0, gt=0)
    read_timeout: float = Field(600.0, gt=0)
    """Longest silence allowed between two upstream bytes."""
    durability: Literal["process", "machine", "async"] = "process"
    """What a recorded call survives (README, "Durability"). ``process`` (default): the client's
    last byte waits until the call's spool line is written (``write(2)``, no fsync): the proxy's
    death (``kill -9``, the OOM killer) loses nothing; a background fsync covers every write within
    ``fsync_interval``, so a machine crash or power loss loses at most that. ``machine``: the last
    byte waits for the line's fsync (group commit: one per batch of calls): nothing lost to either.
    ``async``: recorded after the response (``kill -9`` loses the calls still queued). ``wal``, the
    earlier name of ``machine``, is read as it."""
    fsync_interval: float = Field(0.1, gt=0, le=60)
    """``process``: the longest a written spool line waits for the background fsync (seconds)."""
    db_writer: Literal["thread", "process"] = "thread"
    """Under ``process`` and ``machine``: build and write the records in a thread of this process (default), or in a
    child process (``proxy.dbproc``), whose Python work then never holds this process's GIL against
    the event loop, at the price of its own caches (memory) and of decoding the spool lines it is
    handed (~25 % more CPU per long call). Worth it where the proxy's process is CPU-bound on one
    core; on a 2-core box saturated with 150k-token calls it halved ``/healthz`` p50 but not p99
    (``bench/RESULTS.md``). A ``Store`` handed to ``build_app``, an in-memory SQLite database and
    ``async`` durability always use the thread."""
    spool: str | None = None
    """Spool file (default: ``.orchard-spool/<hash of db>.jsonl`` in the working folder)."""
    max_inflight: int = Field(4096, ge=0)
    """Calls in flight before new ones get 429 (0: no limit)."""
    max_queue: int = Field(100_000, ge=0)
    """Records waiting for the database before new calls get 429 (0: no limit)."""
    max_queue_bytes: int = Field(256 * 1024 * 1024, ge=0)
    """Request + response bytes of the calls waiting for the database before new calls get 429
    (0: no limit). What bounds the proxy's memory when records are large (long contexts)."""
    pace_queue_bytes: int = Field(32 * 1024 * 1024, ge=0)
    """Pacing: above this many queued bytes a new call waits (before its body is read) until the
    writer brings the queue back under it, instead of adding to it (0: no pacing). Keeps the queue
    near this mark, well under ``max_queue_bytes``, when calls come faster than they are recorded."""
    pace_timeout: float = Field(30.0, gt=0)
    """A paced call that waited this long gets 429."""
    api_keys: tuple[str, ...] = ()
    """Keys clients must present (``Authorization: Bearer`` or ``x-api-key``); ``KEY:PREFIX`` binds
    a key to sessions whose id starts with PREFIX. Empty: no proxy authentication."""
    admin_keys: tuple[str, ...] = ()
    """Keys for the admin routes (outcomes); when none is set, the first api key without a prefix."""
    upstream_key: str | None = Field(None, repr=False)
    """The upstream's credential, held by the proxy: sent upstream instead of the client's headers."""
    policy_refresh: float = Field(1.0, ge=0)
    """Seconds between asks of the server's policy version (``GET /weight_info``, vLLM with
    ``VLLM_SERVER_DEV_MODE=1``; ``proxy.versions``); 0: never ask, only the trainer's word."""
    tito_endpoint: Literal["completions", "generate"] = "completions"
    """Tito with vLLM: ``/v1/completions`` with token-id prompts, or ``/inference/v1/generate``
    (``vllm serve --enable-scale-out``), whose answers carry per-token ``weight_versions`` and
    whose aborted generations (``/pause?mode=abort``) tito continues after ``/resume``."""
    cache_salt: Literal["off", "policy"] = "off"
    """``policy``: inject ``cache_salt`` = the current policy version into chat and completions
    requests (no KV computed by older weights is reused after an update); not shown to the client."""
    routed_experts: bool = False
    """MoE routing replay: record the ``routed_experts`` the server answers (vLLM
    ``--enable-return-routed-experts``) compactly (``orchard_rec.routing``), token and tito mode."""
    ui: bool = False
    """Mount the read-only trajectory viewer (``orchard_rec.ui``) at ``/ui``; behind the admin key
    when keys are configured."""
    ui_resend: bool = False
    """With ``ui``: allow the viewer's "send again" (a recorded call replayed to ``upstream``
    with ``upstream_key``; the answer is shown, never recorded)."""

    worker: int | None = Field(None, ge=0)
    """This process is worker ``worker`` of ``serve --workers N`` (``proxy.workers``): every call
    it records says so in ``metadata["worker"]`` (``{"index", "pid"}``). None: the only process."""
    peers: tuple[str, ...] = ()
    """``serve --workers N``: every worker's private Unix socket, by index (``worker``'s own among
    them), where ``/metrics`` asks the others for theirs (``proxy.workers.gather_metrics``)."""

    @field_validator("durability", mode="before")
    @classmethod
    def _earlier_name(cls, v: object) -> object:
        return "machine" if v == "wal" else v

    fleet: tuple[str, ...] = ()
    """More upstreams beside ``upstream`` (a fleet, ``proxy/fleet.py``): every call goes to one of them."""
    route: Literal["session", "least-busy", "round-robin"] = "session"
    """Fleet routing: ``session`` (consistent hashing with bounded loads; calls without a session go
    to the least busy), ``least-busy`` or ``round-robin``."""
    route_epsilon: float = Field(0.5, gt=0)
    """``session``: a server holds at most ``ceil((1 + epsilon) * average)`` calls in flight (0.5:
    HAProxy's ``hash-balance-factor 150``; smaller spreads load sooner, larger keeps sessions home)."""
    route_min_load: int = Field(8, ge=1)
    """``session``: calls in flight a server may always hold, whatever the average (``fleet.py``)."""
    routing_header: str | None = None
    """Send the session id upstream in this header too (e.g. ``X-SMG-Routing-Key``)."""
    health_interval: float | None = Field(None, gt=0)
    """Seconds between active health checks (default: ``ORCHARD_UPSTREAM_CHECK_S``, else 10)."""

    @field_validator("upstream")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"upstream must be an http(s) URL, got {v!r}")
        return v

    @field_validator("fleet")
    @classmethod
    def _strip_all(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(cls._strip(u) for u in v)

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Every upstream, ``upstream`` first, each once."""
        return tuple(dict.fromkeys((self.upstream, *self.fleet)))
