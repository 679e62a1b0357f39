"""Intercept settings (validated once, read-only)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DEFAULT_HOSTS", "InterceptConfig", "default_confdir"]

DEFAULT_HOSTS = ("api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com")  # Gemini too


def default_confdir() -> Path:
    """mitmproxy's own default, so a CA a user already trusts is reused."""
    return Path.home() / ".mitmproxy"


class InterceptConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    listen_host: str = "127.0.0.1"
    listen_port: int = Field(8080, ge=0, le=65535)
    db: str = "sqlite:///./orchard.db"
    hosts: tuple[str, ...] = DEFAULT_HOSTS
    """Hosts whose TLS is intercepted; every other host is tunnelled untouched (not decrypted)."""
    upstream_override: str | None = None
    """Send intercepted LLM calls here instead (a local model server's base URL including ``/v1``)."""
    fleet: tuple[str, ...] = ()
    """More servers beside ``upstream_override`` (``--upstream-override`` repeated): every call goes
    to one of them (``proxy.fleet``, routed by ``route``)."""
    route: Literal["session", "least-busy", "round-robin"] = "session"
    """Fleet routing, as ``serve --route``: ``session`` (a session stays on its server, bounded
    loads), ``least-busy`` or ``round-robin``."""
    routing_header: str | None = None
    """Send the session id to the server in this header too (e.g. ``X-SMG-Routing-Key``), as
    ``serve --routing-header``."""
    routed_experts: bool = False
    """MoE routing replay: record the ``routed_experts`` the server answers (vLLM
    ``--enable-return-routed-experts``), as ``serve --routed-experts``."""
    cache_salt: Literal["off", "policy"] = "off"
    """``policy``: send ``cache_salt`` = the policy version in force with every token and tito call
    (no KV computed by older weights is reused after an update), as ``serve --cache-salt``."""
    policy_refresh: float = Field(1.0, ge=0)
    """Seconds between asks of the first server's policy version (``/weight_info``); 0: only a
    call's ``X-Orchard-Policy-Version`` header says it."""
    mode: Literal["token", "passthrough", "tito"] = "token"
    """With an override: ``token`` asks the (vLLM-style) server for token ids and hides them from the
    client, as the proxy's token mode does; ``tito`` renders the conversation and sends the session's
    exact ids to the server's token endpoint (needs ``tokenizer``), as ``serve --mode tito`` does.
    Without one, calls go to the real API untouched."""
    tokenizer: str | None = None
    """Tito: the model's Hugging Face tokenizer (path, or ``demo``)."""
    upstream_kind: Literal["vllm", "sglang"] = "vllm"
    """Tito: the server's token endpoint (vLLM ``/v1/completions``, SGLang ``/generate``)."""
    tito_endpoint: Literal["completions", "generate"] = "completions"
    durability: Literal["process", "machine", "async"] = "process"
    """As ``serve``'s: ``process`` (default) holds the end of the client's answer until the call's
    spool line is written (a ``kill -9`` loses nothing), ``machine`` until it is fsync'd; ``async``
    never waits."""
    confdir: str = Field(default_factory=lambda: str(default_confdir()))
    """mitmproxy's folder: its CA (``mitmproxy-ca-cert.pem``) is created here on first start."""
    upstream_ca: str | None = None
    """A CA bundle to verify the upstream hosts with (default: the system's)."""
    ssl_insecure: bool = False
    """Do not verify upstream certificates (test servers only)."""
    spool: str | None = None

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(h.strip().lower() for h in v if h.strip())
        if not out:
            raise ValueError("at least one host to intercept")
        return out

    @field_validator("upstream_override")
    @classmethod
    def _override(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"--upstream-override must be an http(s) URL, got {v!r}")
        return v

    @field_validator("fleet")
    @classmethod
    def _fleet(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(u for u in (cls._override(x) for x in v) if u is not None)

    @property
    def overrides(self) -> tuple[str, ...]:
        """Every server calls are sent to instead of the real hosts, each once (none: no override)."""
        if self.upstream_override is None:
            return ()
        return tuple(dict.fromkeys((self.upstream_override, *self.fleet)))

    @property
    def effective_mode(self) -> str:
        """Token mode needs a server that knows ``return_token_ids``: only with an override."""
        return self.mode if self.upstream_override else "passthrough"
