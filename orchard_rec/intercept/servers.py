"""The model servers behind ``--upstream-override``: the pieces ``serve`` drives, shared, not copied.

- Which server a call goes to: ``proxy.fleet.Fleet`` (sans-io). ``--upstream-override`` given more
  than once is a fleet, routed by ``--route`` (``session``: a session's calls stay on the server
  holding its prefix cache, with bounded loads); several servers get ``fleet.watch``'s active
  health checks, and a server a connection to failed is ejected until a check passes.
- The policy version in force: ``proxy.versions.PolicyTracker``, told by a call's
  ``X-Orchard-Policy-Version`` header (not sent on) or by the first server's ``/weight_info``
  (polled every ``--policy-refresh`` seconds): each call's fence (``metadata["policy"]``, tito's
  server spans with it), and ``--cache-salt policy``'s ``cache_salt``.
- Tito: a generation the server aborted for a weight update is continued after ``/resume``
  (``proxy.partial``) over this module's own HTTP client, on the server that ran its first part.

Unlike ``serve``, a call whose connection to its server fails is not tried again on another one:
mitmproxy owns that connection, so the client gets the failure (502); the next calls go elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from orchard_rec import rlwire
from orchard_rec.intercept.config import InterceptConfig
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.fleet import Fleet, Upstream, open_upstream, upstream_errors, watch
from orchard_rec.proxy.versions import POLICY_HEADER, PolicyTracker

__all__ = ["POLICY_HEADER", "Servers", "Target"]

log = logging.getLogger("orchard_rec.intercept")

CHECK_INTERVAL = 10.0
"""Seconds between a fleet's health checks (``serve``'s default)."""


@dataclass(frozen=True)
class Target:
    """One server as ``proxy.partial`` needs it: its base URL, its kind, how long a read may take."""

    upstream: str
    upstream_kind: str
    read_timeout: float


class Servers:
    """The override servers of one intercept process, their policy version, and an HTTP client."""

    def __init__(self, config: InterceptConfig) -> None:
        self.config = config
        self.fleet = Fleet(config.overrides, config.route) if config.overrides else None
        """None without an override: calls go to the real hosts."""
        self.policy = PolicyTracker([s.url for s in self.fleet.servers] if self.fleet is not None else ())
        self.client: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle (on mitmproxy's event loop) -------------------------------------------------------

    async def start(self) -> None:
        cfg, fleet = self.config, self.fleet
        if fleet is None:
            return
        tls: ssl.SSLContext | bool = True
        if cfg.ssl_insecure:
            tls = False
        elif cfg.upstream_ca:
            tls = ssl.create_default_context(cafile=cfg.upstream_ca)
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ssl=tls),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600),
            skip_auto_headers=("User-Agent",),
        )
        if len(fleet.servers) > 1:
            self._tasks.append(asyncio.create_task(watch(fleet, self.client, CHECK_INTERVAL, {}, 5.0)))
        if cfg.policy_refresh > 0 and self.policy.tracking:
            for s in fleet.servers:  # each server's own version, as ``serve`` asks them
                self._tasks.append(asyncio.create_task(self._poll(s.url)))

    async def _poll(self, url: str) -> None:
        """Server ``url``'s policy version, every ``policy_refresh`` seconds (until it has none)."""
        assert self.client is not None
        own = self.policy.servers[url]
        while own.polling and self.policy.tracking:
            await self.policy.refresh(self.client, url, self.config.upstream_kind)
            await asyncio.sleep(self.config.policy_refresh)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.client is not None:
            await self.client.close()

    # -- one call ----------------------------------------------------------------------------------

    def pick(self, key: str | None, counted: bool = True) -> Upstream | None:
        """The server for a call of session ``key`` (None without an override); a ``counted`` one
        is in flight there until ``end``."""
        if self.fleet is None:
            return None
        s = self.fleet.pick(key)
        assert s is not None  # nothing is excluded: every server is a candidate
        if counted:
            self.fleet.begin(s)
        return s

    def end(self, s: Upstream, never_connected: str | None = None) -> None:
        """The call on ``s`` is over; ``never_connected``: why no connection to it was made
        (then ``s`` is ejected until a health check passes)."""
        assert self.fleet is not None
        self.fleet.end(s)
        if never_connected is not None:
            self.fleet.failed(s, never_connected)

    def fence(self, cap: Capture, headers: Any) -> None:
        """Open the call's policy fence (a header's version is taken: intercept has no client keys)
        and take that header off the request."""
        if self.policy.tracking:
            cap.metadata["policy"] = self.policy.sent(headers)
        if POLICY_HEADER in headers:
            del headers[POLICY_HEADER]

    def salt(self) -> str | None:
        """The ``cache_salt`` to send (``--cache-salt policy``): the version now, if known."""
        v = self.policy.version
        return rlwire.cache_salt(v) if self.config.cache_salt == "policy" and v is not None else None

    def opener(self, cap: Capture) -> Callable[..., Any]:
        """How ``proxy.partial`` reaches a server of the fleet again for ``cap`` (the rest of an
        aborted generation): ``(url_of, prefer, **request) -> the response``, as ``serve`` does it."""
        assert self.fleet is not None and self.client is not None
        fleet, client, policy, header = self.fleet, self.client, self.policy, self.config.routing_header

        def open_(url_of: Callable[[str], str], server: str | None, **kw: Any) -> Any:
            return open_upstream(
                fleet,
                client,
                cap.session_id,
                "POST",
                url_of,
                cap.metadata,
                header,
                prefer=server,
                picked=lambda url: policy.at(cap.metadata, url, again=True),
                **kw,
            )

        return open_

    def target(self, url: str) -> Target:
        return Target(url, self.config.upstream_kind, 600.0)

    def errors(self, cap: Capture, url: str) -> Any:
        """This client's failures as the proxy's errors (recorded on ``cap``), as ``serve`` maps them."""
        return upstream_errors(cap, url)
