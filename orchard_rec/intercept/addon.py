"""The mitmproxy addon: LLM calls to the intercepted hosts go through the recording core.

The same pieces as the HTTP proxy, not a copy of them: a ``Capture`` per call (filled
with cheap appends on mitmproxy's event loop), the ``Recorder`` writer thread that turns
it into a ``CallRecord`` and stores it, session and harness identity from the headers,
and, when ``upstream_override`` sends the calls to a local model server, the token-mode
``Plan`` (ids and logprobs injected upstream, removed again for the client; Responses and
Messages translated to chat and back).

Flow of one call through mitmproxy's hooks:
- ``request`` (body complete): recognise host and path (the four dialects and models),
  parse the body, tag the session, re-route and rewrite for token mode;
- ``responseheaders``: stream the body through a callable (every response, SSE or not,
  unless token mode must rewrite a non-stream JSON body): chunks reach the client as
  they arrive, a copy is kept for the record;
- ``response`` / ``error``: the call is complete, or failed, or the client went away:
  submit it to the recorder (never blocks).
Everything else — other hosts (tunnelled without decryption via ``allow_hosts``) and
other paths on these hosts — passes untouched and unrecorded.

This module imports nothing from mitmproxy at import time except inside functions, so
its logic is importable (and documented) where mitmproxy is not installed.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchard_rec import dialects
from orchard_rec.errors import OrchardError
from orchard_rec.intercept.config import InterceptConfig
from orchard_rec.proxy.app import default_spool
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.core import Call, refuse_websocket, upstream_address
from orchard_rec.proxy.identity import SESSION_HEADER
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.proxy.server import tune_interpreter
from orchard_rec.records import CallOutcome, Dialect
from orchard_rec.storage.store import Store

__all__ = ["InterceptAddon", "llm_route"]

log = logging.getLogger("orchard_rec.intercept")

_KEY = "orchard"


def llm_route(hosts: tuple[str, ...], host: str, method: str, path: str) -> tuple[Dialect, str, str] | None:
    """``(dialect, prefix, route)`` when ``method host path`` is an LLM API call we record, else None.

    The dialect is the registry's whose route ends ``path`` (``dialects.route``; ``GET .../v1/models``
    too); ``route`` is the path from that route's start, with the query string, and ``prefix`` what
    comes before it: ``/v1/chat/completions?x=1`` gives prefix ``""`` and route
    ``/v1/chat/completions?x=1`` (gateways that mount the API under a prefix, like
    ``/openai/v1/...``, keep their prefix).
    """
    if host.lower() not in hosts:
        return None
    bare = path.partition("?")[0]
    found = dialects.route(method, bare)
    if found is not None:
        start = found[1].start()
        return found[0].name, path[:start], path[start:]
    if method == "GET" and bare.endswith("/v1/models"):
        start = len(bare) - len("/v1/models")
        return Dialect.MODELS, path[:start], path[start:]
    return None


class _Flow:
    """What the addon keeps on ``flow.metadata`` for one recorded call."""

    __slots__ = ("call", "chunks", "streamed")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.chunks: list[bytes] | None = None
        self.streamed = False


class InterceptAddon:
    def __init__(
        self,
        config: InterceptConfig,
        store: Store | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self._owned_store = store is None
        self.store = store if store is not None else Store(config.db)
        spool = Path(config.spool) if config.spool else default_spool(config.db)
        self.recorder = Recorder(self.store, spool=spool)
        self._announce = announce or (lambda line: print(line, flush=True, file=sys.stdout))
        self._override = urlsplit(config.upstream_override) if config.upstream_override else None

    # -- lifecycle ------------------------------------------------------------------------------

    def running(self) -> None:
        if self._owned_store:
            self.store.upgrade()
        self.recorder.start()
        tune_interpreter()  # the same server settings as `serve` (GC, GIL switch interval)
        from mitmproxy import ctx

        addrs = ctx.master.addons.get("proxyserver").listen_addrs()
        host, port = addrs[0][:2] if addrs else (self.config.listen_host, self.config.listen_port)
        self._announce(
            f"orchard-rec intercept listening on http://{host}:{port} (hosts: {', '.join(self.config.hosts)})"
        )

    def done(self) -> None:
        self.recorder.close()
        if self._owned_store:
            self.store.close()

    # -- request ----------------------------------------------------------------------------------

    def request(self, flow: Any) -> None:
        req = flow.request
        if req.pretty_host.lower() in self.config.hosts:
            refusal = refuse_websocket(req.path, req.headers)
            if refusal is not None:
                from mitmproxy import http

                flow.response = http.Response.make(*refusal, {"content-type": "application/json"})
                return
        route = llm_route(self.config.hosts, req.pretty_host, req.method, req.path)
        if route is None:
            if self._override is not None and req.pretty_host.lower() in self.config.hosts:
                # the real host is not to be contacted: its other routes go to the local server too
                # (a quick 404 there instead of a connection timeout to an unreachable API)
                i = req.path.find("/v1/")
                self._reroute(req, req.path[i:] if i >= 0 else req.path)
            return
        dialect, _prefix, path = route
        call = Call(dialect, req.method, dialects.redact_query(path), req.headers)
        cap = call.cap
        cap.metadata = {"intercept": {"host": req.pretty_host}}
        self.recorder.begin()
        flow.metadata[_KEY] = _Flow(call)
        try:
            sid = req.headers.get(SESSION_HEADER)
            call.name_session(sid)
            if sid is not None:
                del req.headers[SESSION_HEADER]
            call.identify(req.headers)
            mode = self.config.effective_mode if self._override is not None else "passthrough"
            call.read(req.get_content(strict=False) or b"", req.headers.get("content-type"), mode)
            req.headers["accept-encoding"] = "identity"  # we must read what we record
            if self._override is not None:
                target, content = call.upstream_target(*_split_query(path))
                if content is not None:
                    req.content = content
                self._reroute(req, target)
                cap.metadata["intercept"]["upstream"] = self.config.upstream_override
        except OrchardError as exc:
            from mitmproxy import http

            status, body = call.reject(exc)
            flow.response = http.Response.make(status, body, {"content-type": "application/json"})

    def _reroute(self, req: Any, path: str) -> None:
        """Point ``req`` at the override server: ``path`` (from the root) where ``core.upstream_address``
        places it (``/v1/...`` under its base path, anything else under its root)."""
        o = self._override
        assert o is not None
        req.scheme = o.scheme
        req.host = o.hostname or "127.0.0.1"
        req.port = o.port or (443 if o.scheme == "https" else 80)
        req.path = upstream_address(o.path.rstrip("/"), path) or "/"
        req.headers["host"] = o.netloc

    # -- response -----------------------------------------------------------------------------------

    def responseheaders(self, flow: Any) -> None:
        held: _Flow | None = flow.metadata.get(_KEY)
        if held is None or held.call.cap.outcome is not CallOutcome.OK:
            return
        call, resp = held.call, flow.response
        relay = call.response(resp.status_code, resp.headers.get("content-type"), resp.headers)
        if relay is not None:
            if relay.filter is not None:
                resp.headers.pop("content-length", None)  # events are rewritten on the way
            if call.client_content_type is not None:
                resp.headers["content-type"] = call.client_content_type
            cap = call.cap

            def stream(chunk: bytes) -> list[bytes]:
                # a list, never b"": mitmproxy would send an empty chunk, which ends a chunked body
                out = relay.feed(chunk) if chunk else relay.finish()
                if out:
                    relay.sending(len(out))
                if not chunk or relay.ended:
                    cap.complete = True  # the client may hang up now, as SDKs do at [DONE]
                return [out] if out else []

            resp.stream = stream
            held.streamed = True
        elif call.plan is None:
            body: list[bytes] = []
            held.chunks = body

            def collect(chunk: bytes) -> list[bytes]:
                if not chunk:
                    return []
                body.append(chunk)
                call.passing(chunk)
                return [chunk]

            resp.stream = collect
            held.streamed = True
        # else: token mode rewrites this JSON body in ``response`` (mitmproxy buffers it)

    def response(self, flow: Any) -> None:
        held: _Flow | None = flow.metadata.get(_KEY)
        if held is None:
            return
        call, resp = held.call, flow.response
        cap = call.cap
        if cap.outcome is CallOutcome.OK:
            if cap.status_code is None:  # a response set by another addon
                cap.status_code = resp.status_code
            if not cap.stream:
                if held.streamed:
                    cap.body = b"".join(held.chunks or ())
                else:
                    data = resp.raw_content or b""
                    out = call.body(data, resp.status_code)
                    if out is not data:
                        resp.content = out
                    if call.client_content_type is not None:
                        resp.headers["content-type"] = call.client_content_type
            cap.complete = True
        self._submit(cap)

    def error(self, flow: Any) -> None:
        held: _Flow | None = flow.metadata.get(_KEY)
        if held is None or held.call.cap.submitted:
            return
        cap = held.call.cap
        msg = flow.error.msg if flow.error is not None else "connection error"
        if cap.outcome is CallOutcome.OK and not cap.complete:
            client_side = "client" in msg.lower()
            cap.fail(CallOutcome.ABORTED if client_side else CallOutcome.FAILED, msg)
        self._submit(cap)

    def _submit(self, cap: Capture) -> None:
        if cap.submitted:
            return
        cap.submitted = True
        cap.done_at = time.time()
        self.recorder.submit(cap)


def _split_query(tail: str) -> tuple[str, str]:
    path, _, query = tail.partition("?")
    return path, query
