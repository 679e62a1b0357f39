"""The proxy as an aiohttp application: routes, the relay, and the lifecycle.

Routes (each also under ``/s/{session_id}``): ``POST /v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/v1/messages`` (``?beta=true`` too),
``GET /v1/models``, and any other ``/v1/*`` path passed through as ``other``.
Plus ``GET /healthz`` and ``GET /metrics``. GETs that a harness plug-in declares as
probes (hermes-agent's ``/api/tags``, ``/v1/props``, ``/version`` ...) are relayed to the
upstream's root and not recorded: they are not model calls.

Policy:
- The client receives the upstream's status, headers (less hop-by-hop and encoding
  ones) and body bytes as they arrive; streams are relayed chunk by chunk.
- Every call that reached a route is recorded, whatever happened: a disconnect mid-stream
  is ``aborted`` with what had arrived ("record even on disconnect: the tokens were
  generated"), an unreachable upstream is ``failed``, bad input is ``rejected``.
- The handler never waits on SQL: it hands a ``Capture`` to the recorder with a
  synchronous ``put_nowait`` in ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from orchard_rec import dialects
from orchard_rec.errors import (
    BadRequest,
    Forbidden,
    NotFound,
    OrchardError,
    PayloadTooLarge,
    SessionNotFound,
    TooManyRequests,
    Unauthorized,
    UsageError,
)
from orchard_rec.harnesses import is_probe
from orchard_rec.proxy import front, partial, reqparse, tochat
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.core import Call, StreamRelay, dialect_of, renders, upstream_address
from orchard_rec.proxy.edge import CLIENT_AUTH, HOP, RESP_DROP, Names, errors, guarded
from orchard_rec.proxy.fleet import Fleet, open_upstream, upstream_errors, watch
from orchard_rec.proxy.identity import SESSION_HEADER, opening_stats, validate_session_id
from orchard_rec.proxy.metrics import Metrics
from orchard_rec.proxy.openapi import openapi_spec
from orchard_rec.proxy.recorder import Recorder, default_spool
from orchard_rec.proxy.tito import TitoSessions
from orchard_rec.proxy.tito_history import StoreHistory
from orchard_rec.proxy.tito_wire import upstream_url
from orchard_rec.proxy.titocall import TitoCall
from orchard_rec.proxy.upclient import UpResponse, UpstreamClient
from orchard_rec.proxy.versions import PolicyTracker, trusted
from orchard_rec.records import CallOutcome, Dialect
from orchard_rec.settings import current
from orchard_rec.storage.outcome import as_json as outcome_as_json
from orchard_rec.storage.outcome import change_from_json
from orchard_rec.storage.store import Store

__all__ = ["CONFIG", "METRICS", "RECORDER", "STORE", "UPSTREAM", "build_app", "dialect_of"]

log = logging.getLogger("orchard_rec.proxy")

CONFIG = web.AppKey("config", ProxyConfig)
STORE = web.AppKey("store", Store)
RECORDER = web.AppKey("recorder", Recorder)
UPSTREAM = web.AppKey("upstream", aiohttp.ClientSession)
METRICS = web.AppKey("metrics", Metrics)
TITO = web.AppKey("tito", TitoSessions)
FLEET = web.AppKey("fleet", Fleet)
POLICY = web.AppKey("policy", PolicyTracker)

# -- the relay ---------------------------------------------------------------------------------


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        limit = request.app[CONFIG].max_body_bytes
        raise PayloadTooLarge(f"request body is larger than the proxy's limit of {limit} bytes") from exc
    except RequestPayloadError as exc:  # e.g. Content-Encoding: gzip over a body that is not gzip
        enc = request.headers.get("content-encoding", "")
        raise BadRequest(f"request body could not be read (content-encoding {enc!r}): {exc}") from exc


_TO_UPSTREAM = Names(HOP)
_TO_UPSTREAM_KEYED = Names(HOP | CLIENT_AUTH)
_TO_CLIENT = Names(RESP_DROP)


def _upstream_headers(
    request: web.Request, cfg: ProxyConfig, dialect: Dialect | None = None
) -> dict[str, str]:
    out = (_TO_UPSTREAM_KEYED if (cfg.api_keys or cfg.upstream_key) else _TO_UPSTREAM).kept(request.headers)
    out["Accept-Encoding"] = "identity"  # we must read what we record; clients get it uncompressed
    if cfg.upstream_key:  # the proxy's own credential; a client's key never reaches the upstream
        out["Authorization"] = f"Bearer {cfg.upstream_key}"
        wire = dialects.caller(request.path, request.headers, dialect)
        out.update(wire.auth_headers(cfg.upstream_key, request.headers))
    return out


def _presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


def _authorize(
    request: web.Request, session_id: str | None, *, admin: bool = False, cfg: ProxyConfig | None = None
) -> None:
    if cfg is None:
        cfg = request.app[CONFIG]
    if not cfg.api_keys and not cfg.admin_keys:
        return
    key = _presented_key(request)
    if key is None:
        raise Unauthorized("this proxy requires an API key (Authorization: Bearer KEY or x-api-key)")
    if admin:
        admins = cfg.admin_keys or tuple(k for k in cfg.api_keys if ":" not in k)[:1]
        if not any(hmac.compare_digest(key, a) for a in admins):
            raise Unauthorized("this route needs the proxy's admin key")
        return
    for entry in cfg.api_keys:
        secret, _, prefix = entry.partition(":")
        if hmac.compare_digest(key, secret):
            if prefix and not (session_id or "").startswith(prefix):
                raise Forbidden(f"this key may only record sessions whose id starts with {prefix!r}")
            return
    raise Unauthorized("invalid API key")


def _client_headers(up: UpResponse) -> list[tuple[str, str]]:
    return _TO_CLIENT.pairs(up.headers)


async def _relay_probe(request: web.Request, path: str) -> web.StreamResponse:
    """A harness asking what the server is (``harnesses.is_probe``): relayed to the upstream's
    root, never recorded (it is not a model call)."""
    sid = request.match_info.get("sid")
    if sid is not None:
        validate_session_id(sid)
    _authorize(request, sid)
    cfg = request.app[CONFIG]
    tail = path + (("?" + request.query_string) if request.query_string else "")
    scratch = Capture(Dialect.OTHER, request.method, path, None)  # never submitted
    scratch.session_id = sid

    def url_of(base: str) -> str:
        return (base[:-3] if base.endswith("/v1") else base) + tail

    with upstream_errors(scratch, cfg.upstream):
        async with _open(
            request.app[DOOR], scratch, "GET", url_of, headers=_upstream_headers(request, cfg)
        ) as up:
            data = await up.read()
            return web.Response(status=up.status, body=data, headers=_client_headers(up))
    raise AssertionError("unreachable")  # pragma: no cover


async def probe_handler(request: web.Request) -> web.StreamResponse:
    """GETs outside ``/v1`` (``/api/tags``, ``/props``, ``/version`` ...): relayed when a harness
    plug-in declares them as probes, else 404 as before."""
    path = "/" + request.match_info.get("tail", "").lstrip("/")
    if dialect_of(request.method, path).is_generation:  # a dialect routed outside /v1 (``/v1beta/...``)
        return await _proxy(request, path)
    if not is_probe(request.method, path, request.headers):
        raise NotFound(f"no route for {request.method} {request.path}")
    return await _relay_probe(request, path)


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    tail = request.match_info["tail"]
    if request.method == "GET" and is_probe("GET", "/v1/" + tail, request.headers):
        return await _relay_probe(request, "/v1/" + tail)
    return await _proxy(request, "/v1/" + tail)


_OUTCOME = {o: o.value for o in CallOutcome}
"""Each outcome's value (an enum's ``.value`` is a descriptor call: one dictionary look-up instead)."""


class _Door:
    """What every call reads of the app, gathered once (each ``app[KEY]`` is a Python-level look-up);
    ``client`` is set when the upstream client opens (``build_app``'s lifecycle)."""

    __slots__ = ("client", "config", "fleet", "metrics", "policy", "recorder")

    def __init__(self, app: web.Application) -> None:
        self.config = app[CONFIG]
        self.recorder = app[RECORDER]
        self.metrics = app[METRICS]
        self.policy = app[POLICY]
        self.fleet = app[FLEET]
        self.client: UpstreamClient | None = None


DOOR = web.AppKey("door", _Door)


async def _proxy(request: web.Request, route: str) -> web.StreamResponse:
    """One recorded call to ``route`` (the client's path after any ``/s/{id}``, no query string)."""
    door = request.app[DOOR]
    cfg = door.config
    headers = request.headers
    query = request.query_string
    dialect = dialect_of(request.method, route)
    path = dialects.redact_query(route + ("?" + query if query else ""))
    call = Call(dialect, request.method, path, headers)
    cap = call.cap
    if cfg.worker is not None:  # ``serve --workers N``: which process took it
        cap.metadata["worker"] = {"index": cfg.worker, "pid": os.getpid()}
    recorder = door.recorder
    policy = door.policy
    recorder.begin()
    try:
        call.name_session(request.match_info.get("sid") or headers.get(SESSION_HEADER))
        keys = bool(cfg.api_keys or cfg.admin_keys)
        if keys:
            _authorize(request, cap.session_id, cfg=cfg)
        crowded = bool(cfg.max_inflight and recorder.inflight > cfg.max_inflight)
        queued = recorder.queued_bytes
        if (
            cfg.pace_queue_bytes and not crowded and queued > cfg.pace_queue_bytes
        ):  # (else admit is True at once)
            if not await recorder.admit(cfg.pace_queue_bytes, cfg.pace_timeout):
                raise TooManyRequests(
                    f"the proxy's recording queue stayed above {cfg.pace_queue_bytes} bytes for"
                    f" {cfg.pace_timeout:g} s ({recorder.queued_bytes} bytes waiting for the database); retry shortly"
                )
            queued = recorder.queued_bytes
        if (
            crowded
            or (cfg.max_queue and recorder.depth > cfg.max_queue)
            or (cfg.max_queue_bytes and queued > cfg.max_queue_bytes)
        ):
            raise TooManyRequests(
                f"the proxy is at capacity ({recorder.inflight} calls in flight, {recorder.depth} records"
                f" / {recorder.queued_bytes} bytes waiting for the database); retry shortly"
            )
        call.identify(headers)
        if dialect.is_generation:
            if policy.tracking:  # the caller's key matters only when the proxy has keys
                cap.metadata["policy"] = policy.sent(
                    headers, trusted(cfg, _presented_key(request) if keys else None)
                )
            if cfg.routed_experts:
                cap.metadata["routed_experts"] = True  # taken out of the answer on the writer thread
        raw = await _read_body(request)
        body = call.read(raw, headers.get("content-type"), cfg.mode, policy.salt(cfg))
        if cfg.mode == "tito" and renders(dialect):
            return await _relay_tito(request, cap, body)
        return await _relay(request, door, call, raw, route)
    except OrchardError as exc:
        status, err = call.reject(exc)
        return web.Response(status=status, body=err, content_type="application/json")
    except asyncio.CancelledError:
        if not cap.complete:  # a client that hangs up after the last event (as SDKs do at [DONE]) got it all
            cap.fail(CallOutcome.ABORTED, "client disconnected")
        raise
    except Exception as exc:
        cap.fail(CallOutcome.FAILED, f"internal error: {type(exc).__name__}: {exc}")
        cap.status_code = 500
        raise
    finally:
        if not cap.submitted:
            cap.done_at = time.time()
            policy.close(cap.metadata)
            recorder.submit(cap)
        door.metrics.observe_call(
            str.__str__(dialect),  # ``dialect.value``, without the property
            _OUTCOME[cap.outcome],
            cap.bytes_in,
            cap.bytes_out,
            (cap.done_at or time.time()) - cap.received_at,
            None if cap.first_byte_at is None else cap.first_byte_at - cap.received_at,
        )


async def _relay_tito(request: web.Request, cap: Capture, body: dict[str, Any]) -> web.StreamResponse:
    """Token-in/token-out: the core's steps (``titocall``) around this door's I/O: the token
    endpoint's request, an aborted generation continued after ``/resume`` (``partial``), the reply."""
    app = request.app
    cfg = app[CONFIG]
    tito = app[TITO]
    call = TitoCall(cap, body, tito, cfg.upstream_kind, cfg.tito_endpoint, app[POLICY].salt(cfg))
    await asyncio.to_thread(call.plan)
    path, wire = call.upstream()
    headers = _upstream_headers(request, cfg)
    headers["Content-Type"] = "application/json"
    door = app[DOOR]
    with upstream_errors(cap, cfg.upstream):
        async with _open(
            door,
            cap,
            "POST",
            lambda base: upstream_url(cfg.upstream_kind, base, path),
            data=wire,
            headers=headers,
        ) as up:
            cap.first_byte_at = time.time()
            data = await up.read()
            status = up.status
    err = call.answer(status, data)
    if err is not None:
        return web.Response(status=status, body=err, content_type="application/json")
    link = partial.Link(
        app[UPSTREAM],
        lambda base: upstream_url(cfg.upstream_kind, base, path),
        headers,
        lambda: upstream_errors(cap, cfg.upstream),
        cap.metadata,
        lambda url_of, server, **kw: _open(door, cap, "POST", url_of, server, **kw),
    )
    call.settle(await partial.settle(cfg, cap, call.first(), call.up_body, call.prompt, link))
    await asyncio.to_thread(call.commit)
    payload, ctype = call.reply()
    resp = front.stream(request, 200, {"Content-Type": ctype})
    if call.wait_durable(cfg.durability):
        cap.done_at = time.time()
        app[POLICY].close(cap.metadata)
        await app[RECORDER].durable(cap, committed=call.key is not None)
        tito.acknowledge(call.key)
    await resp.prepare(request)
    await resp.write(payload)
    cap.complete = True
    await resp.write_eof()
    return resp


async def _relay(request: web.Request, door: _Door, call: Call, raw: bytes, route: str) -> web.StreamResponse:
    cfg = door.config
    cap = call.cap
    path, data = call.upstream_target(route, request.query_string)
    if data is None:
        data = raw
    with upstream_errors(cap, cfg.upstream):
        async with _open(
            door,
            cap,
            request.method,
            lambda base: upstream_address(base, path),
            data=data if data else None,
            headers=_upstream_headers(request, cfg, cap.dialect),
        ) as up:
            relay = call.response(up.status, up.content_type, up.headers)
            if relay is not None:
                return await _relay_stream(request, call, relay, up)
            out = call.body(await up.read(), up.status)
            resp = front.reply(request, up.status, out, _client_headers(up))
            if cfg.durability != "async":
                cap.done_at = time.time()
                door.policy.close(cap.metadata)
                await door.recorder.durable(cap)  # recorded before the client can have it
            await resp.prepare(request)
            await resp.write_eof()
            cap.complete = True
            return resp
    raise AssertionError("unreachable")  # pragma: no cover


def _open(door: _Door, cap: Capture, method: str, url_of: Any, server: str | None = None, **kw: Any) -> Any:
    """The upstream's response from the server the fleet picks for the call's session (``fleet.py``;
    ``server``: this one first while it is healthy), the call's policy fence taken there (when
    the call has one: policy tracking on, a generation)."""
    policy, meta = door.policy, cap.metadata
    assert door.client is not None
    return open_upstream(
        door.fleet,
        door.client,
        cap.session_id,
        method,
        url_of,
        meta,
        door.config.routing_header,
        prefer=server,
        picked=(lambda url: policy.at(meta, url, again=server is not None)) if "policy" in meta else None,
        **kw,
    )


async def _relay_stream(
    request: web.Request, call: Call, relay: StreamRelay, up: UpResponse
) -> web.StreamResponse:
    """Relay an event stream chunk by chunk, as ``relay`` (the core) rewrites it."""
    cap = call.cap
    resp = front.stream(request, up.status, _client_headers(up))
    if call.client_content_type is not None:
        resp.headers["Content-Type"] = call.client_content_type
    await resp.prepare(request)
    wal = request.app[CONFIG].durability != "async"
    try:
        async for chunk in up.content.iter_any():  # --read-timeout: the client's, while it waits (upclient)
            out = relay.feed(chunk)
            if out:
                ended = relay.ended  # only ``feed`` turns it
                if ended and wal and not cap.submitted:
                    relay.sending(len(out))
                    cap.done_at = time.time()
                    request.app[POLICY].close(cap.metadata)
                    await request.app[RECORDER].durable(cap)  # recorded before the client has the end
                    await resp.write(out)
                else:
                    await resp.write(out)
                    relay.sending(len(out))
                if ended:
                    # the client may hang up now (SDKs stop at [DONE]) while we wait for the upstream's EOF
                    cap.complete = True
        tail = relay.finish()
        if wal and not cap.submitted:
            relay.sending(len(tail))
            cap.done_at = time.time()
            request.app[POLICY].close(cap.metadata)
            await request.app[RECORDER].durable(cap)
            if tail:
                await resp.write(tail)
        elif tail:
            await resp.write(tail)
            relay.sending(len(tail))
        cap.complete = True
    except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
        cap.fail(CallOutcome.ABORTED, f"client disconnected: {exc}")
        return resp
    except (TimeoutError, aiohttp.ClientError) as exc:
        # The status line is gone already: the only honest signal left is a cut stream.
        cap.fail(CallOutcome.FAILED, f"upstream stream broke: {type(exc).__name__}: {exc}")
        where = cap.metadata.get("upstream", request.app[CONFIG].upstream)
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await resp.write(relay.broke(f"upstream {where} broke off the stream ({type(exc).__name__})"))
        if request.transport is not None:
            request.transport.close()
        return resp
    try:
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass  # the client had every event already
    return resp


# -- service routes ------------------------------------------------------------------------------


def cache_stats(app: web.Application) -> dict[str, dict[str, int]]:
    """Every per-session cache of the proxy: ``entries``, ``bytes``, ``max_bytes``, ``hits`` and
    ``misses`` of each (``requests``: bodies parsed on a session's last, ``ORCHARD_REQUEST_CACHE_MB``;
    ``translations``: Responses/Messages requests translated on the last, the same bound; ``openings``:
    the digests of the conversation openings a derived session id was hashed from, 8 MiB for long
    ones and 256 KiB for short ones kept by their bytes; ``ids``,
    ``state``, ``spool_bases``: ``Recorder.caches``; ``tito``: the sessions' token branches). Misses
    that keep growing with the calls mean more sessions at once than the bound holds: each then
    costs O(its context) again (raise the ``ORCHARD_*_MB`` it names)."""
    out = {
        "requests": reqparse.cache.stats(),
        "translations": tochat.translator.stats(),
        "openings": opening_stats(),
    }
    out.update(app[RECORDER].caches())
    tito = app.get(TITO)
    if tito is not None:
        out["tito"] = tito.stats()
    return out


async def healthz(request: web.Request) -> web.Response:
    rec = request.app[RECORDER]
    upstream = request.app[FLEET].summary()
    body = {
        "status": "ok" if rec.healthy and upstream["reachable"] is not False else "degraded",
        "upstream": upstream,
        "upstreams": request.app[FLEET].figures(),
        "queue_depth": rec.depth,
        "queued_bytes": rec.queued_bytes,
        "max_queue_bytes": request.app[CONFIG].max_queue_bytes,
        "pace_queue_bytes": request.app[CONFIG].pace_queue_bytes,
        "paced": rec.paced,
        "spool_depth": rec.spool_depth,
        "written": rec.written,
        "mode": request.app[CONFIG].mode,
        "durability": rec.durability,
        "spool_sync": rec.sync_stats(),
        "db_writer": rec.writer_state,
        "caches": cache_stats(request.app),
        "policy": request.app[POLICY].state(),
        "front": request.app[front.ENTRY].state(),
    }
    if request.app[CONFIG].worker is not None:  # ``serve --workers N``: the one that answered
        body["worker"] = {"index": request.app[CONFIG].worker, "pid": os.getpid()}
    if rec.last_error:
        body["error"] = rec.last_error
    if rec.spool_rejected and rec.spool is not None:
        body["spool_rejected"] = rec.spool_rejected
        body["warning"] = (
            f"{rec.spool_rejected} spool line(s) could not be decoded ({rec.spool.last_rejection});"
            f" kept in {rec.spool.rejected_path}, not replayed"
        )
    return web.json_response(body, dumps=lambda o: orjson.dumps(o).decode())


async def post_outcome(request: web.Request) -> web.Response:
    """``POST /sessions/{id}/outcome``: ``{"reward": number|object, "status": ..., "step_values": [...], "metadata": {...}}``.

    The fields given merge into the stored outcome, ``null`` clears one (a metadata key too), a
    body that changes nothing is a 400 (``storage.outcome``, the same rules as the CLI)."""
    sid = validate_session_id(request.match_info["sid"])
    _authorize(request, sid, admin=True)
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"outcome body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("outcome body must be a JSON object")
    change = change_from_json(body)  # the fields merge into the stored outcome; null clears one
    store = request.app[STORE]
    if body.get("create") is not True and await asyncio.to_thread(store.session, sid) is None:
        # its first call may still be on the way to the database: let the writer catch up
        await asyncio.to_thread(request.app[RECORDER].flush, 5.0)
        if await asyncio.to_thread(store.session, sid) is None:
            raise SessionNotFound(
                f'no session {sid!r}: record a call first, or send "create": true', param="session_id"
            )
    merged = await asyncio.to_thread(store.update_outcome, sid, change)
    return web.json_response({"session_id": sid, "recorded": True, "outcome": outcome_as_json(merged)})


async def _ui_slash(request: web.Request) -> web.Response:
    """``/ui`` is the viewer too: to ``/ui/`` (its links are relative to it), the query kept (``?key=``)."""
    raise web.HTTPFound("/ui/" + (f"?{request.query_string}" if request.query_string else ""))


def _ui_tokenizer(name: str | None) -> Any:
    """The viewer's tokenizer (``--tokenizer``: a folder, or ``demo``), loaded as ``orchard-rec ui`` does."""
    if not name:
        return None
    from orchard_rec.tokenizer import load_tokenizer

    return load_tokenizer(name)


async def policy_handler(request: web.Request) -> web.Response:
    """``GET|POST /v1/orchard/policy`` (admin key): the trainer's word (``proxy.versions``). With
    ``serve --workers N`` a POST is passed on to the other workers (``workers.tell_peers``), and
    the answer says how many of the N took it (``workers``)."""
    _authorize(request, None, admin=True)
    raw = await request.read()
    state = request.app[POLICY].answer(request.method, raw)
    cfg = request.app[CONFIG]
    if request.method == "POST" and cfg.peers and cfg.worker is not None and "worker" not in request.query:
        from orchard_rec.proxy.workers import tell_peers

        keep = ("authorization", "x-api-key")
        headers = {k: v for k, v in request.headers.items() if k.lower() in keep}
        told = await tell_peers(cfg.peers, cfg.worker, request.path, raw, headers)
        state["workers"] = {"told": 1 + told, "of": len(cfg.peers)}
    return web.json_response(state)


async def openapi_handler(request: web.Request) -> web.Response:
    return web.json_response(openapi_spec())


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    cfg = request.app[CONFIG]
    if cfg.peers and cfg.worker is not None and "worker" not in request.query:  # ``serve --workers N``
        from orchard_rec.proxy.workers import gather_metrics

        body = await gather_metrics(cfg.peers, cfg.worker, body)
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


# -- lifecycle -------------------------------------------------------------------------------------


def _mount_ui(app: web.Application, config: ProxyConfig) -> None:
    """The viewer under ``/ui`` (``--ui``), on the app's store."""
    from orchard_rec.ui import build_ui_app

    admins = config.admin_keys or tuple(k for k in config.api_keys if ":" not in k)[:1]
    locked = bool(config.api_keys or config.admin_keys)
    from orchard_rec.ui.calls import Resend

    resend_to = Resend(config.upstream, config.upstream_key) if config.ui_resend else None
    shown_by = _ui_tokenizer(config.tokenizer)  # --tokenizer decodes the ids there too, in any mode
    app.router.add_get("/ui", guarded(_ui_slash))
    app.add_subapp(
        "/ui",
        build_ui_app(
            app[STORE],
            base="/ui",
            keys=admins,
            locked=locked,
            tokenizer=shown_by,
            resend_to=resend_to,
            writer=app[STORE],
        ),
    )


def build_app(config: ProxyConfig, store: Store | None = None) -> web.Application:
    """The proxy app. Owns the upstream ``ClientSession`` and the recorder through one cleanup context."""
    # errors in the caller's dialect: each route's handler is ``_guarded``; the middleware only for
    # the viewer's sub-application (a middleware costs every call a chain of coroutines)
    app = web.Application(middlewares=[errors] if config.ui else [], client_max_size=config.max_body_bytes)
    app[CONFIG] = config
    owned_store = store is None
    app[STORE] = store if store is not None else Store(config.db)
    in_memory = config.db in ("sqlite://", "sqlite:///:memory:")
    recorder = Recorder(
        app[STORE],
        spool=Path(config.spool) if config.spool else default_spool(config.db),
        durability=config.durability,
        fsync_interval=config.fsync_interval,
        # a Store handed in is the caller's own (it may not even be the URL's): it writes
        writer=config.db_writer if owned_store and not in_memory else "thread",
    )
    app[RECORDER] = recorder
    app[POLICY] = PolicyTracker(config.upstreams)
    app[METRICS] = Metrics(
        lambda: recorder.depth,
        lambda: recorder.spool_depth,
        lambda: recorder.inflight,
        lambda: recorder.queued_bytes,
        lambda: recorder.paced,
        lambda: cache_stats(app),
        spool_sync=recorder.sync_stats,
    )
    app[FLEET] = Fleet(config.upstreams, config.route, config.route_epsilon, config.route_min_load)
    app[METRICS].registry.register(app[FLEET].collector())
    app[DOOR] = door = _Door(app)
    if config.mode == "tito":
        from orchard_rec.tokenizer import load_hf_tokenizer

        if not config.tokenizer:
            raise UsageError(
                "--mode tito needs --tokenizer (the model's Hugging Face tokenizer, with its chat template)"
            )
        # ORCHARD_TITO_RENDER=whole: every call renders its whole conversation (measurement, a template
        # whose non-locality the probe and the sampled checks might miss)
        whole = current().tito_renders_whole
        app[TITO] = TitoSessions(load_hf_tokenizer(config.tokenizer), incremental=not whole)
        app[TITO].source = StoreHistory(app[STORE], app[TITO].tok)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if owned_store:
            await asyncio.to_thread(app[STORE].upgrade)
        recorder.start()
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
        )
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        # the calls' client (upclient: a lean one); aiohttp's session for health checks, the policy
        # version and the RL routes (pause/resume), which are not on the calls' path
        door.client = UpstreamClient(connect_timeout=config.connect_timeout, read_timeout=config.read_timeout)
        app[UPSTREAM] = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=True, skip_auto_headers=("User-Agent",)
        )
        # the proxy's own upstream credential, as on every call (never a client's)
        auth = {"Authorization": f"Bearer {config.upstream_key}"} if config.upstream_key else {}
        every = config.health_interval or current().upstream_check_s
        tasks = [
            asyncio.create_task(
                watch(app[FLEET], app[UPSTREAM], every, auth, min(5.0, config.connect_timeout + 2))
            )
        ]
        if config.policy_refresh > 0:
            tasks.append(asyncio.create_task(app[POLICY].poll(app[UPSTREAM], config)))
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await app[UPSTREAM].close()
        await door.client.close()
        await asyncio.to_thread(recorder.close)
        if owned_store:
            app[STORE].close()

    app.cleanup_ctx.append(lifecycle)
    _add_routes(app, config)
    return app


def _add_routes(app: web.Application, config: ProxyConfig) -> None:
    """The routes on aiohttp's router; the calls' handler also for the proxy's own server (``front``)."""
    app.router.add_get("/healthz", guarded(healthz))
    app.router.add_get("/metrics", guarded(metrics_handler))
    app.router.add_post("/sessions/{sid}/outcome", guarded(post_outcome))
    app.router.add_get("/openapi.json", guarded(openapi_handler))
    app.router.add_route("*", "/v1/orchard/policy", guarded(policy_handler))
    calls = guarded(proxy_handler)
    app[front.ENTRY] = front.Entry(calls, config.max_body_bytes)
    app.router.add_route("*", "/v1/{tail:.*}", calls)
    app.router.add_route("*", "/s/{sid}/v1/{tail:.*}", calls)
    if config.ui:
        _mount_ui(app, config)
    # probes some harnesses send before their first model call (hermes-agent: /api/tags, /props, /version ...)
    # (any method, so that other unknown routes stay a 404 in the caller's dialect; ``(?s:.*)``: a
    # path with a line break too, which the router would answer itself, in no dialect)
    probes = guarded(probe_handler)
    app.router.add_route("*", "/s/{sid}", probes)
    app.router.add_route("*", "/s/{sid}/{tail:.*}", probes)
    app.router.add_route("*", "/{tail:(?s:.*)}", probes)
