"""The aiohttp app's edges: which headers cross the proxy (hop-by-hop ones and the client's
credentials never do), and errors in the caller's dialect on every route.

Errors are answered on each route's own handler (``guarded``), not by a middleware: aiohttp wraps
every middleware in one of its own, two coroutines more on every call. ``errors`` (the same
mapping as a middleware) is for what has no guarded handler: the viewer's sub-application.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from orchard_rec import dialects
from orchard_rec.errors import (
    InternalError,
    MethodNotAllowed,
    NotFound,
    OrchardError,
    PayloadTooLarge,
    Rejected,
)
from orchard_rec.proxy.versions import POLICY_HEADER

__all__ = ["CLIENT_AUTH", "HOP", "RESP_DROP", "Names", "answer_error", "error_response", "errors", "guarded"]

log = logging.getLogger("orchard_rec.proxy")

HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",  # aiohttp decoded the body we read; the upstream gets it plain
        "x-orchard-session",
        POLICY_HEADER,
    }
)
CLIENT_AUTH = frozenset({"authorization", "x-api-key", "api-key"}) | dialects.secret_headers()
"""The client's credential headers (a dialect's own among them, ``WireDialect.secret_headers``)."""
RESP_DROP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"})


# -- errors in the caller's dialect -----------------------------------------------------------


def answer_error(request: web.Request, exc: BaseException) -> web.StreamResponse:
    """The dialect's error for what a handler raised (re-raised: a redirect, a cancellation, a reset)."""
    if isinstance(exc, OrchardError):
        return error_response(request, exc)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        if exc.status == 404:
            err: OrchardError = NotFound(f"no route for {request.method} {request.path}")
        elif exc.status == 405:
            err = MethodNotAllowed(f"method {request.method} not allowed on {request.path}")
        elif exc.status == 413:
            err = PayloadTooLarge(exc.text or "request body too large")
        elif exc.status < 500:
            err = Rejected.of(exc.status)(exc.text or exc.reason)
        else:
            err = InternalError(exc.text or exc.reason)
        return error_response(request, err)
    if isinstance(exc, (asyncio.CancelledError, ConnectionResetError)) or not isinstance(exc, Exception):
        raise exc
    # a bug of ours: answer in the dialect, log it, never a bare traceback page
    log.exception("internal error on %s %s", request.method, request.path)
    err = InternalError(f"internal proxy error ({type(exc).__name__}); the call was recorded")
    return error_response(request, err)


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Errors in the caller's dialect for what has no ``guarded`` handler: the viewer's routes
    (a sub-application's), the router's own 404 and 405."""
    try:
        return await handler(request)
    except BaseException as exc:
        return answer_error(request, exc)


def guarded(handler: Any) -> Any:
    """``handler`` answering its errors in the caller's dialect, as the ``errors`` middleware
    does: on the route itself, so that a call pays no middleware chain (aiohttp wraps every
    middleware with one of its own, two coroutines per call)."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except BaseException as exc:
            return answer_error(request, exc)

    guarded.__name__ = guarded.__qualname__ = handler.__name__
    guarded.__doc__ = handler.__doc__
    return guarded


def error_response(request: web.Request, exc: OrchardError) -> web.Response:
    return web.Response(
        status=exc.status,
        body=dialects.error_body(exc, dialects.caller(request.path, request.headers)),
        content_type="application/json",
    )


# -- headers -------------------------------------------------------------------------------------


class Names:
    """Which header names (any spelling) are in ``names``: decided once per spelling, so a call's
    headers are filtered without lower-casing each name again (bounded: a hostile client cannot grow
    it without limit; past the bound a call's unknown spellings are lower-cased as before)."""

    __slots__ = ("dropped", "names")
    BOUND = 4096
    """Spellings remembered at most."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.dropped: dict[str, bool] = {}

    def _learn(self, headers: Any) -> bool:
        """Learn ``headers``' spellings; False when the bound leaves one unknown."""
        dropped = self.dropped
        for k, _ in headers.items():  # (iterating a multidict names each header once, in one spelling)
            if k not in dropped:
                if len(dropped) >= self.BOUND:
                    return False
                dropped[k] = k.lower() in self.names
        return True

    def kept(self, headers: Any) -> dict[str, str]:
        """``headers`` less the names, as a dict (a repeated header: its last value)."""
        dropped = self.dropped
        try:
            return {k: v for k, v in headers.items() if not dropped[k]}
        except KeyError:
            if self._learn(headers):
                return {k: v for k, v in headers.items() if not dropped[k]}
            return {k: v for k, v in headers.items() if k.lower() not in self.names}

    def pairs(self, headers: Any) -> list[tuple[str, str]]:
        """``headers`` less the names, every value kept (a repeated header too)."""
        dropped = self.dropped
        try:
            return [(k, v) for k, v in headers.items() if not dropped[k]]
        except KeyError:
            if self._learn(headers):
                return [(k, v) for k, v in headers.items() if not dropped[k]]
            return [(k, v) for k, v in headers.items() if k.lower() not in self.names]
