"""Reading a client's request body: shared by both front doors (the proxy and ``intercept``)."""

from __future__ import annotations

from typing import Any

import orjson

from orchard_rec.errors import BadRequest, UnsupportedMediaType
from orchard_rec.records import Dialect

__all__ = ["parse_body"]


def parse_body(raw: bytes, content_type: str | None, dialect: Dialect) -> Any:
    """The JSON object of a generation call (``None`` for other calls); a dialect error when malformed."""
    if not dialect.is_generation:
        return None
    if content_type is not None and "json" not in content_type.lower():
        raise UnsupportedMediaType(f"content-type must be application/json, got {content_type[:100]!r}")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    return body
