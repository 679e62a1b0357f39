"""Errors the proxy answers with, and how each dialect spells them.

    OrchardError                      base; carries an HTTP status and a message
    ├── BadRequest (400)              malformed JSON, wrong types, bad session id
    │   └── PayloadTooLarge (413)     body over the configured limit
    ├── NotFound (404)                unknown route
    ├── UnsupportedMediaType (415)    not application/json
    ├── Unauthorized (401)            missing or wrong proxy API key (403: key bound elsewhere)
    ├── TooManyRequests (429)         back-pressure: the proxy is at capacity
    ├── UpstreamUnavailable (502)     upstream refused, reset or timed out
    ├── UpstreamProtocolError (502)   upstream answered something we cannot relay
    └── SessionNotFound (404)         admin/read routes

Internals raise builtins; only the request edges raise these, and one middleware
renders them in the caller's dialect: OpenAI ``{"error": {...}}`` or Anthropic
``{"type": "error", "error": {...}}``.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = [
    "BadRequest",
    "NotFound",
    "OrchardError",
    "PayloadTooLarge",
    "SessionNotFound",
    "TooManyRequests",
    "Unauthorized",
    "UnsupportedMediaType",
    "UpstreamProtocolError",
    "UpstreamUnavailable",
    "error_body",
]


class OrchardError(Exception):
    status = 500
    openai_type = "server_error"
    anthropic_type = "api_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(OrchardError):
    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class PayloadTooLarge(BadRequest):
    status = 413
    anthropic_type = "request_too_large"
    code = "request_too_large"


class UnsupportedMediaType(BadRequest):
    status = 415


class NotFound(OrchardError):
    status = 404
    openai_type = "invalid_request_error"
    anthropic_type = "not_found_error"
    code = "not_found"


class SessionNotFound(NotFound):
    pass


class Unauthorized(OrchardError):
    status = 401
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"
    code = "invalid_api_key"


class TooManyRequests(OrchardError):
    status = 429
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"
    code = "proxy_at_capacity"


class UpstreamUnavailable(OrchardError):
    status = 502
    openai_type = "upstream_error"
    anthropic_type = "api_error"
    code = "upstream_unavailable"


class UpstreamProtocolError(UpstreamUnavailable):
    code = "upstream_protocol_error"


def error_body(exc: OrchardError, anthropic: bool) -> bytes:
    """The JSON error body a client of that dialect expects."""
    err: dict[str, Any]
    if anthropic:
        err = {"type": "error", "error": {"type": exc.anthropic_type, "message": exc.message}}
    else:
        err = {
            "error": {"message": exc.message, "type": exc.openai_type, "param": exc.param, "code": exc.code}
        }
    return orjson.dumps(err)
