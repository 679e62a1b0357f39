"""Every error orchard-rec reports to a person: one tree, one base the CLI and the proxy both catch.

    OrchardError (500)                    base: .message, .status (HTTP), .exit_code (CLI)
    ├── UsageError (400)                  a CLI or configuration mistake; exit code 2
    ├── ExportError (500)                 an export cannot be written as asked
    ├── Rejected (400)                    4xx: the proxy refuses the caller's request
    │   ├── BadRequest (400)              malformed JSON, wrong types, bad session id
    │   ├── Unauthorized (401)            missing or wrong proxy API key
    │   ├── Forbidden (403)               a valid key bound to other sessions
    │   ├── NotFound (404)                unknown route
    │   │   └── SessionNotFound (404)     no session with that id
    │   ├── MethodNotAllowed (405)        known route, wrong method
    │   ├── PayloadTooLarge (413)         body over the configured limit
    │   ├── UnsupportedMediaType (415)    not application/json
    │   ├── UpgradeRequired (426)         a WebSocket was asked for; HTTP POST (+ SSE) only
    │   └── TooManyRequests (429)         back-pressure: the proxy is at capacity
    ├── InternalError (500)               a bug of ours, answered in the caller's dialect
    └── UpstreamError (502)               the upstream failed us
        ├── UpstreamUnavailable (502)     refused, reset
        ├── UpstreamProtocolError (502)   answered something we cannot relay
        ├── UpstreamTimeout (504)         no answer in time
        └── UpstreamStatus (502)          answered an error status; ``UpstreamStatus.of(code)``

The status is a class attribute, never set on an instance: a status with no class here
gets one built once (``Rejected.of(431)``, ``UpstreamStatus.of(503)``), a subclass of the
family it belongs to. ``tests/test_errors.py`` checks this drawing against the classes.

Internals raise builtins; the request edges raise these, and one middleware renders them in
the caller's dialect (``orchard_rec.protocol.error_body``): OpenAI ``{"error": {...}}`` or
Anthropic ``{"type": "error", "error": {...}}``. The CLI prints ``message`` and exits with
``exit_code``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

__all__ = [
    "BadRequest",
    "ExportError",
    "Forbidden",
    "InternalError",
    "MethodNotAllowed",
    "NotFound",
    "OrchardError",
    "PayloadTooLarge",
    "Rejected",
    "SessionNotFound",
    "TooManyRequests",
    "Unauthorized",
    "UnsupportedMediaType",
    "UpgradeRequired",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamStatus",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "UsageError",
    "cache_stats",
    "env_megabytes",
    "one_line",
]


class OrchardError(Exception):
    """Base of the tree. ``status`` is what the proxy answers, ``exit_code`` what the CLI exits with."""

    status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1
    openai_type: ClassVar[str] = "server_error"
    anthropic_type: ClassVar[str] = "api_error"
    code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UsageError(OrchardError):
    """The command line or the configuration asks for something impossible (exit code 2)."""

    status = 400
    exit_code = 2
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


def env_megabytes(name: str, default: float) -> int:
    """The bytes a size in megabytes given by environment variable ``name`` says (``default``
    when unset or empty); a ``UsageError`` naming the variable when it is not a number >= 0."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return int(default * (1 << 20))
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not 0 <= mb < 1 << 40:
        raise UsageError(f"{name} must be a number of megabytes (0 or more), got {raw[:40]!r}")
    return int(mb * (1 << 20))


def cache_stats(entries: int, nbytes: int, max_bytes: int, hits: int, misses: int) -> dict[str, int]:
    """What a per-session cache reports (``/healthz`` ``caches``, ``/metrics`` ``orchard_cache_*``):
    keys held, their bytes by its own count, its bound (``env_megabytes``), calls it served (hits)
    and calls whose session it no longer held or never had (misses: O(the context) again)."""
    return {"entries": entries, "bytes": nbytes, "max_bytes": max_bytes, "hits": hits, "misses": misses}


class ExportError(OrchardError):
    """An export cannot be written as asked (unknown format, missing folder, unexportable sample)."""


class Rejected(OrchardError):
    """4xx: the proxy refuses the caller's request."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    _built: ClassVar[dict[int, type[Rejected]]] = {}

    @classmethod
    def of(cls, status: int) -> type[Rejected]:
        """The class for a 4xx ``status``: one drawn in the tree, else one built once for it."""
        if not 400 <= status < 500:
            raise ValueError(f"{status} is not a 4xx status")
        for known in Rejected.__subclasses__():  # the drawn ones, and any built before
            if known.status == status:
                return known
        if status not in Rejected._built:
            Rejected._built[status] = type(f"Rejected{status}", (Rejected,), {"status": status})
        return Rejected._built[status]


class BadRequest(Rejected):
    status = 400


class Unauthorized(Rejected):
    status = 401
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(Rejected):
    status = 403
    openai_type = "authentication_error"
    anthropic_type = "permission_error"
    code = "invalid_api_key"


class NotFound(Rejected):
    status = 404
    anthropic_type = "not_found_error"
    code = "not_found"


class SessionNotFound(NotFound):
    status = 404


class MethodNotAllowed(Rejected):
    status = 405
    anthropic_type = "not_found_error"
    code = "not_found"


class PayloadTooLarge(Rejected):
    status = 413
    anthropic_type = "request_too_large"
    code = "request_too_large"


class UnsupportedMediaType(Rejected):
    status = 415


class UpgradeRequired(Rejected):
    status = 426


class TooManyRequests(Rejected):
    status = 429
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"
    code = "proxy_at_capacity"


class InternalError(OrchardError):
    status = 500


class UpstreamError(OrchardError):
    """The upstream failed us: unreachable, too slow, unintelligible, or an error status of its own."""

    status = 502
    openai_type = "upstream_error"
    anthropic_type = "api_error"
    code = "upstream_unavailable"


class UpstreamUnavailable(UpstreamError):
    status = 502


class UpstreamProtocolError(UpstreamError):
    status = 502
    code = "upstream_protocol_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamStatus(UpstreamError):
    """The upstream answered an error status; ``UpstreamStatus.of(code)`` is the class relaying it."""

    status = 502
    code = "upstream_error"
    _built: ClassVar[dict[int, type[UpstreamStatus]]] = {}

    @classmethod
    def of(cls, status: int) -> type[UpstreamStatus]:
        """A subclass answering ``status`` (built once per status). A 4xx stays the caller's fault
        (``invalid_request_error``), a 5xx the upstream's."""
        if not 400 <= status < 600:
            raise ValueError(f"{status} is not an error status")
        if status not in UpstreamStatus._built:
            attrs: dict[str, Any] = {"status": status}
            if status < 500:
                attrs.update(openai_type="invalid_request_error", anthropic_type="invalid_request_error")
            UpstreamStatus._built[status] = type(f"UpstreamStatus{status}", (UpstreamStatus,), attrs)
        return UpstreamStatus._built[status]


def one_line(exc: BaseException) -> str:
    """``Type: message`` in one line, for logs: a database driver's own error (SQLAlchemy's
    ``.orig``) without the statement, parameters and link SQLAlchemy appends."""
    inner = getattr(exc, "orig", None)
    err = inner if isinstance(inner, BaseException) else exc
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
