"""The recording proxy: OpenAI- and Anthropic-compatible HTTP front door (aiohttp), and the
recording core every front door shares.

Owns: ``core`` (the sans-io ``Call``/``StreamRelay``: identity, body, WebSocket refusal, token-mode
plan, what the client receives, end of stream, errors in the caller's dialect), ``capture`` (what a
call collects; ``to_record`` on the writer thread), ``request`` and ``identity`` (caller, session
ids, stored headers), ``reqparse`` (request bodies read from their session's previous one: only
the new bytes parsed), ``token`` (token-mode ``Plan``/``StreamFilter``), ``tochat`` (token mode's
Responses/Messages-to-chat translation, only the new items), ``idcut`` (token-id
arrays cut at byte level, parsed once per session prefix), ``tito`` (token-in/token-out
sessions; ``tito_wire`` the token endpoint's request and answer, the generation parsed back to chat), ``titocall`` (tito's per-call steps, sans-io, driven by both front doors: plan, token-endpoint
request, answer, commit, reply), ``recorder`` (the writer threads; ``dbthread`` its database thread), ``dbproc`` (under ``process`` and ``machine``, the database writer in a
process of its own: records built and written off the event loop's GIL), ``logs`` (log lines and
the access log, shared with that process), ``recent`` (a few recent entries per key, bounded in bytes: the caches of ``reqparse`` and
``tochat``), ``versions`` (the policy version in force and each call's fence: asynchronous RL),
``partial`` (tito's generations aborted for a weight update, continued after ``/resume``), ``fleet``
(several upstreams: the sans-io picker, consistent hashing with bounded loads, health checks, safe
retries), ``capline`` (the spool's capture lines under ``process`` and ``machine``:
a call's raw material, written as what is new relative to its session's earlier calls; ``capbases``
the encoder's delta bases; ``handoff`` the hand-over to the database thread), ``app`` (aiohttp routes driving the core; ``edge`` the headers that cross it and its errors in
the caller's dialect), ``server``, ``config``, ``metrics``, ``openapi``, ``upclient`` (the
calls' HTTP/1.1 client to the upstreams: keep-alive, httptools, aiohttp's exceptions).

``build_app(ProxyConfig(...))`` gives the aiohttp application; ``run_forever`` and
``BackgroundServer`` run it. Handlers hand finished calls to the ``Recorder`` and never wait on SQL.

May import: ``orchard_rec.dialects`` (every wire shape), ``errors``, ``records``, ``storage``,
``tokenizer``, ``harnesses`` (who is calling, and probes, from the plug-ins' own data), ``ui``
(mounted with ``--ui``), ``policy`` and ``rlwire`` (policy versions, the servers' RL wire). Never ``reconstruct``, ``exporters``, ``trainers``, ``intercept`` or ``demo``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard_rec.proxy.app import build_app, dialect_of
    from orchard_rec.proxy.config import Mode, ProxyConfig
    from orchard_rec.proxy.recorder import Recorder
    from orchard_rec.proxy.server import BackgroundServer, run_forever

__all__ = ["BackgroundServer", "Mode", "ProxyConfig", "Recorder", "build_app", "dialect_of", "run_forever"]

_HOME = {
    "build_app": "app",
    "dialect_of": "app",
    "Mode": "config",
    "ProxyConfig": "config",
    "Recorder": "recorder",
    "BackgroundServer": "server",
    "run_forever": "server",
}


def __getattr__(name: str) -> Any:
    """The package's names, imported when first asked for: the database writer process imports
    ``proxy.dbproc`` without the HTTP side (aiohttp, the app) it never uses."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
