"""The one record that proxy/, storage/ and reconstruct/ share.

A finished call is built once, after the last byte went to the client (or the call
failed), and is never mutated afterwards: we record traffic, we do not rewrite it.
proxy/ builds it, storage/ persists it, reconstruct/ reads it back.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SESSION_ID_MAX",
    "SESSION_ID_PATTERN",
    "SESSION_ID_RULE",
    "SESSION_STATUSES",
    "CallOutcome",
    "CallRecord",
    "Dialect",
    "Outcome",
    "context_tokens",
    "session_id_problem",
]


class Dialect(str, enum.Enum):
    """Which wire API a call spoke (the client's side of it)."""

    CHAT = "chat"
    """OpenAI Chat Completions, ``POST /v1/chat/completions``."""
    COMPLETIONS = "completions"
    """OpenAI (legacy) Completions, ``POST /v1/completions``."""
    RESPONSES = "responses"
    """OpenAI Responses, ``POST /v1/responses``."""
    MESSAGES = "messages"
    """Anthropic Messages, ``POST /v1/messages``."""
    MODELS = "models"
    """``GET /v1/models``."""
    OTHER = "other"
    """Any other ``/v1/*`` path, passed through."""

    @property
    def is_generation(self) -> bool:
        return self in (Dialect.CHAT, Dialect.COMPLETIONS, Dialect.RESPONSES, Dialect.MESSAGES)


class CallOutcome(str, enum.Enum):
    """How a call ended, from the proxy's point of view."""

    OK = "ok"
    """The upstream answered 2xx and the client received all of it."""
    UPSTREAM_ERROR = "upstream_error"
    """The upstream answered with an error status (relayed as is)."""
    FAILED = "failed"
    """The upstream could not be reached or broke the protocol; the proxy answered 5xx."""
    ABORTED = "aborted"
    """The client went away before the answer was complete; what had arrived is kept. (A
    generation the server aborted, for a weight update, is ``ok`` with ``finish_reason`` ``abort``.)"""
    REJECTED = "rejected"
    """The proxy refused the request itself (bad input); never forwarded."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call as the client saw it. Built once, after the last byte."""

    call_id: str
    """Proxy-assigned id (uuid4 hex); the idempotency key in storage."""
    session_id: str | None
    """From the ``/s/{id}`` route prefix or the ``X-Orchard-Session`` header; None if untagged."""
    dialect: Dialect
    method: str
    path: str
    """The client's path after the session prefix, with its query string (``/v1/messages?beta=true``)."""
    stream: bool
    """Whether the answer was relayed as server-sent events."""
    status_code: int | None
    """HTTP status the client received (None if it left before any)."""
    outcome: CallOutcome
    received_at: float
    """Wall clock (epoch seconds) when the request arrived."""
    first_byte_at: float | None
    """When the upstream's first response byte arrived."""
    done_at: float
    """When the last byte was sent to the client, or the call failed."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The client's request headers; secrets (authorization, api keys, cookies) removed before this object exists."""
    harness: str | None = None
    """Best guess of the client program (``codex``, ``claude-code``, ``openclaw``, ``openai-python`` ...)."""
    harness_session: str | None = None
    """A session id the harness itself sent (Codex ``session-id``, Claude Code ``X-Claude-Code-Session-Id`` ...)."""
    model: str | None = None
    request: Any = None
    """The client's body, parsed (None when it was not JSON)."""
    request_text: str | None = None
    """The client's body exactly as sent (UTF-8 JSON text) when it was JSON; storage rebuilds it byte for byte."""
    upstream_request: Any = None
    """The body actually sent upstream, when the proxy changed it (injected fields, translation)."""
    response: Any = None
    """What the client received: the JSON body, or for streams the object a non-stream call would have returned."""
    events: list[Any] | None = None
    """For streams: the raw server-sent events in order, as ``[event_name_or_None, data]``."""
    error: str | None = None
    usage: Mapping[str, Any] | None = None
    prompt_ids: tuple[int, ...] | None = None
    """Token ids of the prompt as the server tokenised it (None when it did not say)."""
    completion_ids: tuple[int, ...] | None = None
    """Token ids the server generated (choice 0), None when it did not say."""
    completion_logprobs: tuple[float, ...] | None = None
    """Log-probability of each generated token, aligned with ``completion_ids``."""
    finish_reason: str | None = None
    bytes_in: int = 0
    """Request body size."""
    bytes_out: int = 0
    """Response bytes relayed to the client."""
    seq: int | None = None
    """1-based position in its session, assigned by storage when the call is committed (None before)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """What the proxy decided about the call (token-in/token-out: ``{"tito": {"branch", "fresh", ...}}``)."""
    policy_versions: tuple[tuple[str, int, int], ...] | None = None
    """Which weights sampled the completion: ``(version, start, end)`` spans over
    ``completion_ids`` (``orchard_rec.policy``; ``"unknown"`` where an update could not be
    placed); None when no version was known."""
    routed_experts: bytes | None = None
    """MoE routing replay (``--routed-experts``): the experts the server routed each token to,
    packed by ``orchard_rec.routing`` (rows over prompt + completion, less the last token)."""


SESSION_STATUSES = ("completed", "truncated", "aborted", "failed")

SESSION_ID_MAX = 128
"""The longest session id: the ``sessions.id`` column's length, on SQLite as on PostgreSQL."""
SESSION_ID_RULE = (
    f"1-{SESSION_ID_MAX} characters of A-Z a-z 0-9 . _ : @ = + -, starting with a letter or digit"
)
"""The one session-id rule, for every entry point: the proxy's routes and header, the intercept
addon, every CLI command and the storage layer. Ids travel in URL paths (``/s/ID/v1``, the
viewer's ``/s/ID``), so nothing that a path, a query or a fragment would read differently is
allowed (no ``/``, ``?``, ``#``, ``%``, no ``..`` alone: it must start alphanumeric), and no
control character. Non-ASCII letters are refused too: the same-looking id could be spelled in
two Unicode normal forms, and percent-encoded differently by different clients."""
SESSION_ID_PATTERN = rf"[A-Za-z0-9][A-Za-z0-9._:@=+-]{{0,{SESSION_ID_MAX - 1}}}"
"""``SESSION_ID_RULE`` as a regular expression (for a full match)."""
_SESSION_ID_RE = re.compile(SESSION_ID_PATTERN)


def session_id_problem(sid: str) -> str | None:
    """None for a valid session id (``SESSION_ID_RULE``), else what is wrong with it, in a few words."""
    if _SESSION_ID_RE.fullmatch(sid):
        return None
    if not sid:
        return "it is empty"
    if len(sid) > SESSION_ID_MAX:
        return f"it has {len(sid)} characters, at most {SESSION_ID_MAX}"
    bad = next((c for c in sid if not _SESSION_ID_RE.fullmatch("a" + c)), None)
    if bad is not None:
        return f"it contains {bad!r}"
    return f"it starts with {sid[0]!r}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a session ended, as a harness runner or grader reports it (``POST /sessions/{id}/outcome``)."""

    reward: float | Mapping[str, float] | None = None
    """A number, or named rewards; flows into every exported sample of the session."""
    status: str | None = None
    """One of ``SESSION_STATUSES``; None lets reconstruction decide from the calls."""
    step_values: tuple[float, ...] | None = None
    """A value estimate after each model turn, for value-based credit assignment."""
    metadata: Mapping[str, Any] = field(default_factory=dict)


def context_tokens(call: CallRecord) -> int | None:
    """A call's context size: prompt + completion ids when recorded, else the usage the upstream
    reported (prompt + completion, OpenAI or Anthropic names); None when neither is known.
    A session's size, in ``orchard-rec sessions`` and the viewer alike, is the largest of its calls'."""
    if call.prompt_ids is not None and call.completion_ids is not None:
        return len(call.prompt_ids) + len(call.completion_ids)
    u = call.usage
    if isinstance(u, Mapping):
        a = u.get("prompt_tokens", u.get("input_tokens"))
        b = u.get("completion_tokens", u.get("output_tokens"))
        if isinstance(a, int) and isinstance(b, int):
            return a + b
    return None
