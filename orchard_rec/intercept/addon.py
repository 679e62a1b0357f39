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

import orjson

from orchard_rec.errors import OrchardError, UpgradeRequired, error_body
from orchard_rec.intercept.config import InterceptConfig
from orchard_rec.protocol.sse import TERMINAL_EVENTS
from orchard_rec.proxy.app import default_spool, dialect_of
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.identity import SESSION_HEADER, validate_session_id
from orchard_rec.proxy.recorder import Recorder
from orchard_rec.proxy.request import caller, take_body
from orchard_rec.proxy.server import tune_interpreter
from orchard_rec.proxy.token import Plan, plan_for
from orchard_rec.records import CallOutcome, Dialect
from orchard_rec.storage.store import Store

__all__ = ["InterceptAddon", "llm_route"]

log = logging.getLogger("orchard_rec.intercept")

_KEY = "orchard"
_RECORDED = frozenset(
    {Dialect.CHAT, Dialect.COMPLETIONS, Dialect.RESPONSES, Dialect.MESSAGES, Dialect.MODELS}
)


def llm_route(hosts: tuple[str, ...], host: str, method: str, path: str) -> tuple[Dialect, str, str] | None:
    """``(dialect, prefix, tail)`` when ``method host path`` is an LLM API call we record, else None.

    ``path`` is split at its ``/v1/`` segment: ``/v1/chat/completions?x=1`` gives prefix
    ``""`` and tail ``chat/completions?x=1`` (gateways that mount the API under a prefix,
    like ``/openai/v1/...``, keep their prefix).
    """
    if host.lower() not in hosts:
        return None
    i = path.find("/v1/")
    if i < 0:
        return None
    tail = path[i + 4 :]
    dialect = dialect_of(method, tail.split("?", 1)[0])
    if dialect not in _RECORDED:
        return None
    return dialect, path[:i], tail


class _Call:
    """What the addon keeps on ``flow.metadata`` for one recorded call."""

    __slots__ = ("cap", "chunks", "plan", "streamed")

    def __init__(self, cap: Capture, plan: Plan | None) -> None:
        self.cap = cap
        self.plan = plan
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
        if (
            req.headers.get("upgrade") or ""
        ).lower() == "websocket" and req.pretty_host.lower() in self.config.hosts:
            # Codex's built-in provider tries a Responses WebSocket first: what it sends there could not be
            # recorded as calls. A quick 426 makes it fall back to POST + SSE at once, as with the proxy.
            from mitmproxy import http

            exc = UpgradeRequired(
                "WebSocket transport is not supported while recording; use HTTP POST with stream=true"
            )
            flow.response = http.Response.make(
                426, error_body(exc, False), {"content-type": "application/json"}
            )
            return
        route = llm_route(self.config.hosts, req.pretty_host, req.method, req.path)
        if route is None:
            if self._override is not None and req.pretty_host.lower() in self.config.hosts:
                # the real host is not to be contacted: its other routes go to the local server too
                # (a quick 404 there instead of a connection timeout to an unreachable API)
                i = req.path.find("/v1/")
                if i >= 0:
                    self._reroute(req, req.path[i + 4 :])
                else:
                    self._reroute(req, req.path.lstrip("/"), root=True)
            return
        dialect, _prefix, tail = route
        cap = Capture(dialect, req.method, "/v1/" + tail, None)
        cap.metadata = {"intercept": {"host": req.pretty_host}}
        self.recorder.begin()
        call = _Call(cap, None)
        flow.metadata[_KEY] = call
        try:
            sid = req.headers.get(SESSION_HEADER)
            if sid is not None:
                cap.session_id = validate_session_id(sid)
                del req.headers[SESSION_HEADER]
            caller(cap, req.headers)
            body = take_body(cap, req.get_content(strict=False) or b"", req.headers.get("content-type"))
            req.headers["accept-encoding"] = "identity"  # we must read what we record
            if self._override is not None:
                call.plan = plan = plan_for(self.config.effective_mode, dialect, body)
                path = tail
                if plan is not None:
                    req.content = orjson.dumps(plan.body)
                    cap.upstream_request = plan.body
                    cap.upstream_dialect = plan.upstream
                    query = tail.partition("?")[2]
                    path = plan.upstream_path + ("?" + query if query and not plan.translated else "")
                self._reroute(req, path)
                cap.metadata["intercept"]["upstream"] = self.config.upstream_override
        except OrchardError as exc:
            cap.fail(CallOutcome.REJECTED, exc.message)
            cap.status_code = exc.status
            self._answer_error(flow, exc)

    def _reroute(self, req: Any, tail: str, *, root: bool = False) -> None:
        """Point ``req`` at the override server: ``tail`` under its base path (``/v1``), or under
        its root for paths outside the API (``root``)."""
        o = self._override
        assert o is not None
        req.scheme = o.scheme
        req.host = o.hostname or "127.0.0.1"
        req.port = o.port or (443 if o.scheme == "https" else 80)
        req.path = ("" if root else o.path.rstrip("/")) + "/" + tail
        req.headers["host"] = o.netloc

    def _answer_error(self, flow: Any, exc: OrchardError) -> None:
        from mitmproxy import http

        anthropic = (
            flow.metadata[_KEY].cap.dialect is Dialect.MESSAGES or "anthropic-version" in flow.request.headers
        )
        flow.response = http.Response.make(
            exc.status, error_body(exc, anthropic), {"content-type": "application/json"}
        )

    # -- response -----------------------------------------------------------------------------------

    def responseheaders(self, flow: Any) -> None:
        call: _Call | None = flow.metadata.get(_KEY)
        if call is None or call.cap.outcome is not CallOutcome.OK:
            return
        cap, plan, resp = call.cap, call.plan, flow.response
        cap.first_byte_at = time.time()
        cap.status_code = resp.status_code
        ctype = (resp.headers.get("content-type") or "").lower()
        if "text/event-stream" in ctype:
            cap.stream = True
            filt = plan.stream_filter() if plan is not None else None
            if filt is not None:
                resp.headers.pop("content-length", None)  # events are rewritten on the way
                if plan is not None and plan.translated:
                    resp.headers["content-type"] = "text/event-stream; charset=utf-8"
                    cap.client_events = filt.client_events
            chunks = cap.chunks

            def relay(chunk: bytes) -> list[bytes]:
                # a list, never b"": mitmproxy would send an empty chunk, which ends a chunked body
                if not chunk:  # end of the body
                    tail = filt.finish() if filt is not None else b""
                    cap.bytes_out += len(tail)
                    cap.complete = True
                    return [tail] if tail else []
                chunks.append(chunk)
                out = chunk if filt is None else filt.feed(chunk)
                if not out:
                    return []
                cap.bytes_out += len(out)
                if any(t in out for t in TERMINAL_EVENTS):
                    cap.complete = True  # the client may hang up now, as SDKs do at [DONE]
                return [out]

            resp.stream = relay
            call.streamed = True
        elif plan is None:
            body: list[bytes] = []
            call.chunks = body

            def collect(chunk: bytes) -> list[bytes]:
                if not chunk:
                    return []
                body.append(chunk)
                cap.bytes_out += len(chunk)
                return [chunk]

            resp.stream = collect
            call.streamed = True
        # else: token mode rewrites this JSON body in ``response`` (mitmproxy buffers it)

    def response(self, flow: Any) -> None:
        call: _Call | None = flow.metadata.get(_KEY)
        if call is None:
            return
        cap, resp = call.cap, flow.response
        if cap.outcome is CallOutcome.OK:
            if cap.status_code is None:  # a response set by another addon
                cap.status_code = resp.status_code
            if not cap.stream:
                if call.streamed:
                    cap.body = b"".join(call.chunks or ())
                else:
                    data = resp.raw_content or b""
                    cap.body = data
                    if call.plan is not None:
                        out, cap.client_response = call.plan.client_body_bytes(data, resp.status_code)
                        if out is not data:
                            resp.content = out
                            if call.plan.translated:
                                resp.headers["content-type"] = "application/json"
                        data = out
                    cap.bytes_out = len(data)
            cap.complete = True
        self._submit(cap)

    def error(self, flow: Any) -> None:
        call: _Call | None = flow.metadata.get(_KEY)
        if call is None or call.cap.submitted:
            return
        cap = call.cap
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
