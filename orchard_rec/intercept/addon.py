"""The mitmproxy addon: LLM calls to the intercepted hosts go through the recording core.

The same pieces as the HTTP proxy, not a copy of them: a ``Capture`` per call (filled
with cheap appends on mitmproxy's event loop), the ``Recorder`` writer thread that turns
it into a ``CallRecord`` and stores it, session and harness identity from the headers,
and, when ``upstream_override`` sends the calls to local model servers (``servers``: which one,
the policy version, the cache salt), the token-mode ``Plan`` (ids and logprobs injected upstream,
removed again for the client; Responses and Messages translated to chat and back) or tito's
``TitoCall`` (the session's exact ids; an aborted generation continued, ``proxy.partial``).

Flow of one call through mitmproxy's hooks:
- ``request`` (body complete): recognise host and path (the dialects and models),
  parse the body, tag the session, re-route and rewrite for token mode; in tito mode the
  core's ``TitoCall`` plans the prompt's exact ids (off the event loop) and the request
  becomes the token endpoint's;
- ``responseheaders``: stream an event stream through a callable (the core's ``StreamRelay``):
  chunks reach the client as they arrive, a copy is kept for the record; a whole body too
  under ``async`` durability; else mitmproxy buffers it (token mode rewrites it, tito makes
  the client's answer from the token endpoint's);
- ``response`` / ``error``: the call is complete, or failed, or the client went away: by
  default (``durability`` process or machine) the async ``response`` hook awaits the call's
  spool line before mitmproxy releases the answer (a buffered body, or a stream's end);
  else it is submitted to the recorder (never blocks).
Everything else — other hosts (tunnelled without decryption via ``allow_hosts``) and
other paths on these hosts — passes untouched and unrecorded.

This module imports nothing from mitmproxy at import time except inside functions, so
its logic is importable (and documented) where mitmproxy is not installed.
"""

from __future__ import annotations

import asyncio
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
from orchard_rec.intercept.servers import Servers
from orchard_rec.proxy import partial
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.core import Call, refuse_websocket, renders, upstream_address
from orchard_rec.proxy.fleet import Upstream
from orchard_rec.proxy.identity import SESSION_HEADER
from orchard_rec.proxy.recorder import Recorder, default_spool
from orchard_rec.proxy.server import tune_interpreter
from orchard_rec.proxy.tito import TitoSessions
from orchard_rec.proxy.tito_wire import upstream_url
from orchard_rec.proxy.titocall import TitoCall
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

    __slots__ = ("call", "chunks", "server", "streamed", "tito", "tito_path")

    def __init__(self, call: Call) -> None:
        self.call = call
        self.chunks: list[bytes] | None = None
        self.streamed = False
        self.tito: TitoCall | None = None
        self.tito_path = ""
        """Tito: the token endpoint's path (an aborted generation is continued there)."""
        self.server: Upstream | None = None
        """The override server the call went to (counted in flight until the call ends)."""


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
        self.recorder = Recorder(self.store, spool=spool, durability=config.durability)
        self._announce = announce or (lambda line: print(line, flush=True, file=sys.stdout))
        self.servers = Servers(config)
        """The override servers (a fleet), the policy version, tito's continuation (``servers``)."""
        self.tito: TitoSessions | None = None
        if config.effective_mode == "tito":
            from orchard_rec.proxy.tito_history import StoreHistory
            from orchard_rec.tokenizer import load_hf_tokenizer

            if not config.tokenizer:
                raise ValueError("tito mode needs a tokenizer (--tokenizer)")
            self.tito = TitoSessions(load_hf_tokenizer(config.tokenizer))
            self.tito.source = StoreHistory(self.store, self.tito.tok)

    # -- lifecycle ------------------------------------------------------------------------------

    async def running(self) -> None:
        if self._owned_store:
            self.store.upgrade()
        self.recorder.start()
        await self.servers.start()
        tune_interpreter()  # the same server settings as `serve` (GC, GIL switch interval)
        from mitmproxy import ctx

        addrs = ctx.master.addons.get("proxyserver").listen_addrs()
        host, port = addrs[0][:2] if addrs else (self.config.listen_host, self.config.listen_port)
        self._announce(
            f"orchard-rec intercept listening on http://{host}:{port} (hosts: {', '.join(self.config.hosts)})"
        )

    async def done(self) -> None:
        await self.servers.close()
        self.recorder.close()
        if self._owned_store:
            self.store.close()

    # -- request ----------------------------------------------------------------------------------

    async def request(self, flow: Any) -> None:
        req = flow.request
        if req.pretty_host.lower() in self.config.hosts:
            refusal = refuse_websocket(req.path, req.headers)
            if refusal is not None:
                from mitmproxy import http

                flow.response = http.Response.make(*refusal, {"content-type": "application/json"})
                return
        route = llm_route(self.config.hosts, req.pretty_host, req.method, req.path)
        overridden = bool(self.config.overrides)
        if route is None:
            ours = req.pretty_host.lower() in self.config.hosts
            server = self.servers.pick(None, counted=False) if ours else None
            if server is not None:
                # the real host is not to be contacted: its other routes go to the local server too
                # (a quick 404 there instead of a connection timeout to an unreachable API)
                i = req.path.find("/v1/")
                self._reroute(req, req.path[i:] if i >= 0 else req.path, server.url)
            return
        dialect, _prefix, path = route
        call = Call(dialect, req.method, dialects.redact_query(path), req.headers)
        cap = call.cap
        cap.metadata = {"intercept": {"host": req.pretty_host}}
        self.recorder.begin()
        held = flow.metadata[_KEY] = _Flow(call)
        try:
            sid = req.headers.get(SESSION_HEADER)
            call.name_session(sid)
            if sid is not None:
                del req.headers[SESSION_HEADER]
            call.identify(req.headers)
            if dialect.is_generation:
                self.servers.fence(cap, req.headers)
            mode = self.config.effective_mode if overridden else "passthrough"
            salt = self.servers.salt() if overridden else None
            body = call.read(
                req.get_content(strict=False) or b"", req.headers.get("content-type"), mode, salt
            )
            req.headers["accept-encoding"] = "identity"  # we must read what we record
            held.server = self.servers.pick(cap.session_id)
            if held.server is not None:
                cap.metadata["intercept"]["upstream"] = held.server.url
                self.servers.policy.at(cap.metadata, held.server.url)  # its fence: that server's version
                if self.config.routing_header and cap.session_id:
                    req.headers[self.config.routing_header] = cap.session_id
                if self.config.routed_experts and dialect.is_generation:
                    cap.metadata["routed_experts"] = True  # taken out of the answer on the writer thread
            if self.tito is not None and renders(dialect) and isinstance(body, dict):
                await self._tito_request(flow, req, call, body, salt)
            elif held.server is not None:
                target, content = call.upstream_target(*_split_query(path))
                if content is not None:
                    req.content = content
                self._reroute(req, target, held.server.url)
        except OrchardError as exc:
            from mitmproxy import http

            status, body = call.reject(exc)
            flow.response = http.Response.make(status, body, {"content-type": "application/json"})

    async def _tito_request(
        self, flow: Any, req: Any, call: Call, body: dict[str, Any], salt: str | None
    ) -> None:
        """Tito: the core's plan (off the event loop: the chat template) and the token endpoint's
        request in place of the client's; the answer is rewritten in ``response`` (buffered)."""
        cfg = self.config
        held: _Flow = flow.metadata[_KEY]
        assert self.tito is not None and held.server is not None
        tc = TitoCall(call.cap, body, self.tito, cfg.upstream_kind, cfg.tito_endpoint, salt)
        held.tito = tc
        await asyncio.to_thread(tc.plan)
        path, wire = tc.upstream()
        held.tito_path = path
        url = urlsplit(upstream_url(cfg.upstream_kind, held.server.url, path))
        req.method = "POST"
        req.scheme = url.scheme
        req.host = url.hostname or "127.0.0.1"
        req.port = url.port or (443 if url.scheme == "https" else 80)
        req.path = url.path
        req.headers["host"] = url.netloc
        req.headers["content-type"] = "application/json"
        req.content = wire

    def _reroute(self, req: Any, path: str, base: str) -> None:
        """Point ``req`` at the override server ``base``: ``path`` (from the root) where
        ``core.upstream_address`` places it (``/v1/...`` under its base path, anything else under its root)."""
        o = urlsplit(base)
        req.scheme = o.scheme
        req.host = o.hostname or "127.0.0.1"
        req.port = o.port or (443 if o.scheme == "https" else 80)
        req.path = upstream_address(o.path.rstrip("/"), path) or "/"
        req.headers["host"] = o.netloc

    # -- response -----------------------------------------------------------------------------------

    def responseheaders(self, flow: Any) -> None:
        held: _Flow | None = flow.metadata.get(_KEY)
        if held is None or held.tito is not None or held.call.cap.outcome is not CallOutcome.OK:
            return  # tito: the token endpoint's answer is buffered, the client's made in ``response``
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
        elif call.plan is None and self.recorder.durability == "async":
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
        # else: mitmproxy buffers this body: token mode rewrites it in ``response``, and by default
        # (``durability``) the client has it once its call is recorded there

    async def response(self, flow: Any) -> None:
        """The call is complete. By default (``durability`` process or machine) the client's answer
        is held here until the call's spool line is written: a whole body entirely, an event stream
        its end (mitmproxy sends the stream's last chunk / END_STREAM after this hook)."""
        held: _Flow | None = flow.metadata.get(_KEY)
        if held is None:
            return
        call, resp = held.call, flow.response
        cap = call.cap
        if held.tito is not None and cap.outcome is CallOutcome.OK:
            await self._tito_response(flow, call, held)
        elif cap.outcome is CallOutcome.OK:
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
        self._release(held)
        self.servers.policy.close(cap.metadata)
        key = cap.session_id if held.tito is not None and cap.outcome is CallOutcome.OK else None
        if not cap.submitted and (self.recorder.durability != "async" or key is not None):
            # a tito session's call is in the database before the client has it (``TitoCall.wait_durable``)
            cap.done_at = time.time()
            await self.recorder.durable(cap, committed=key is not None)
            if self.tito is not None and key is not None:
                self.tito.acknowledge(key)
        self._submit(cap)

    async def _tito_response(self, flow: Any, call: Call, held: _Flow) -> None:
        """The token endpoint answered: the core turns it into the client's answer and commits the
        turn to the session. A generation the server aborted (a weight update) is continued after
        ``/resume`` on the same server (``proxy.partial``, as ``serve`` does): the client gets one answer."""
        from mitmproxy import http

        tc, resp = held.tito, flow.response
        assert tc is not None and held.server is not None
        cap = tc.cap
        cap.first_byte_at = cap.first_byte_at or time.time()
        try:
            err = tc.answer(resp.status_code, resp.get_content(strict=False) or b"")
            if err is not None:
                flow.response = http.Response.make(
                    resp.status_code, err, {"content-type": "application/json"}
                )
                return
            gen = tc.first()
            if tc.aborted and self.servers.client is not None:
                base = held.server.url
                path, kind = held.tito_path, self.config.upstream_kind
                headers = {"Content-Type": "application/json"}
                if "authorization" in flow.request.headers:
                    headers["Authorization"] = flow.request.headers["authorization"]
                cap.metadata.setdefault("upstream", base)
                link = partial.Link(
                    self.servers.client,
                    lambda b: upstream_url(kind, b, path),
                    headers,
                    lambda: self.servers.errors(cap, base),
                    cap.metadata,
                    self.servers.opener(cap),
                )
                gen = await partial.settle(self.servers.target(base), cap, gen, tc.up_body, tc.prompt, link)
            tc.settle(gen)
            await asyncio.to_thread(tc.commit)
            payload, ctype = tc.reply()
        except OrchardError as exc:
            status, body = call.reject(exc)
            flow.response = http.Response.make(status, body, {"content-type": "application/json"})
            return
        flow.response = http.Response.make(200, payload, {"content-type": ctype})
        cap.complete = True

    def error(self, flow: Any) -> None:
        held: _Flow | None = flow.metadata.get(_KEY)
        if held is None or held.call.cap.submitted:
            return
        cap = held.call.cap
        msg = flow.error.msg if flow.error is not None else "connection error"
        client_side = "client" in msg.lower()
        if cap.outcome is CallOutcome.OK and not cap.complete:
            cap.fail(CallOutcome.ABORTED if client_side else CallOutcome.FAILED, msg)
        connected = getattr(flow.server_conn, "timestamp_tcp_setup", None) is not None
        self._release(held, None if client_side or connected or flow.response is not None else msg)
        self.servers.policy.close(cap.metadata)
        self._submit(cap)

    def _release(self, held: _Flow, never_connected: str | None = None) -> None:
        """The call no longer holds its server (once); a server never connected to is ejected."""
        if held.server is not None:
            self.servers.end(held.server, never_connected)
            held.server = None

    def _submit(self, cap: Capture) -> None:
        if cap.submitted:
            return
        cap.submitted = True
        cap.done_at = time.time()
        self.recorder.submit(cap)


def _split_query(tail: str) -> tuple[str, str]:
    path, _, query = tail.partition("?")
    return path, query
