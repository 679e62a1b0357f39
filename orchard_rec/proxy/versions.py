"""The policy version in force, as the proxy knows it, and each call's fence.

The proxy learns the version three ways, the newest word winning:

- the trainer tells it: ``POST /v1/orchard/policy {"version": "..."}`` (an admin route, like
  ``/sessions/{id}/outcome``), best sent between ``update_weight_version`` and ``/resume``: then
  no token of the new weights is generated before the proxy knows them;
- a trainer-side client sends ``X-Orchard-Policy-Version`` on a call (not sent upstream);
- the proxy asks the server: ``GET /weight_info`` (vLLM with ``VLLM_SERVER_DEV_MODE=1``; SGLang's
  ``/model_info``), cached and refreshed every ``--policy-refresh`` seconds in the background
  (never on a call's path). A server without it (404) is not asked again. With a fleet each
  upstream is asked on its own and keeps its own version: a call's fence is that of the server
  that ran it (the trainer's word and a header are about every server).

A fence is the version when a call was sent and when its last token arrived; ``serial`` counts
every change, so a version that moved and came back inside one call is still seen as moved. What
polling alone can know is as fresh as its interval: a trainer that wants exact fences tells the
proxy (the first way). Must never block a response or guess a version it was not told.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from orchard_rec import rlwire
from orchard_rec.errors import BadRequest, MethodNotAllowed
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.settings import current

if TYPE_CHECKING:
    import aiohttp

__all__ = ["POLICY_HEADER", "PolicyTracker", "Version", "policy_body", "trusted"]

log = logging.getLogger("orchard_rec.proxy")

POLICY_HEADER = "x-orchard-policy-version"
"""A call's header: the policy version the trainer-side client knows to be in force."""


def trusted(cfg: ProxyConfig, key: str | None) -> bool:
    """Whether a caller presenting ``key`` may move the policy version (the admin routes' rule)."""
    if not cfg.api_keys and not cfg.admin_keys:
        return True
    admins = cfg.admin_keys or tuple(k for k in cfg.api_keys if ":" not in k)[:1]
    return key is not None and any(hmac.compare_digest(key, a) for a in admins)


def policy_body(raw: bytes) -> str:
    """The version of a ``POST /v1/orchard/policy`` body ``{"version": "..."}`` (a number is
    taken as its decimal string); a clear 400 for anything else."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"policy body is not valid JSON: {exc}") from exc
    v = body.get("version") if isinstance(body, dict) else None
    if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).strip():
        raise BadRequest('policy body must be {"version": "<non-empty string or integer>"}', param="version")
    if len(str(v)) > 128:
        raise BadRequest("version is longer than 128 characters", param="version")
    return str(v).strip()


class Version:
    """One view of the version in force (None until learned) and a counter of its changes: a
    server's own, or the newest word the proxy heard from anyone."""

    __slots__ = ("last_polled", "learned_at", "polling", "serial", "source", "version")

    def __init__(self) -> None:
        self.version: str | None = None
        self.serial = 0
        """Incremented on every change (a fence compares serials, not only strings)."""
        self.source: str | None = None
        """Who said it last: ``trainer``, ``header`` or ``server``."""
        self.learned_at: float | None = None
        self.polling = True
        """False once the server showed it has no version endpoint."""
        self.last_polled: str | None = None
        """What the server said last: a poll overrides the trainer's word only when this changes."""

    def set(self, version: str, source: str) -> bool:
        """Take a version; True when it changed."""
        self.source = source
        self.learned_at = time.time()
        if version == self.version:
            return False
        self.version = version
        self.serial += 1
        return True

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "source": self.source, "learned_at": self.learned_at}


class PolicyTracker:
    """The version each upstream runs (``servers``, by base URL: a fleet's servers may not all
    run the same weights), and the newest word heard from anyone (``newest``). The trainer's word
    and a call's header are about every server; a server's ``/weight_info`` about itself. A call's
    fence is taken from the server that runs it (``at``, when the fleet picks it)."""

    __slots__ = ("newest", "servers", "tracking")

    def __init__(self, servers: Sequence[str] = ()) -> None:
        self.servers: dict[str, Version] = {url: Version() for url in servers}
        self.newest = Version()
        self.tracking = current().tracks_policy
        """``ORCHARD_POLICY_TRACKING=off``: no fences, no polling (measurement: bench/policy.py)."""

    @property
    def version(self) -> str | None:
        """The newest word (a lone server's own)."""
        return self.newest.version

    def set(self, version: str, source: str) -> bool:
        """The trainer's (or a header's) word, for every server; True when it changed anything."""
        changed = [v.set(version, source) for v in self.servers.values()]
        return self.newest.set(version, source) or any(changed)

    def sent(self, headers: Any, trusted: bool = True) -> dict[str, Any]:
        """A call's opening fence (``metadata["policy"]``), after its header's word, if any: taken
        only from a ``trusted`` caller (the admin key, or a proxy without keys), since it moves
        the version every call is fenced with. The newest word until ``at`` names the server."""
        said = headers.get(POLICY_HEADER) if headers is not None and trusted else None
        if said and (said := said.strip()[:128]):
            self.set(said, "header")
        return {"sent": self.newest.version, "_serial": self.newest.serial}

    def at(self, metadata: dict[str, Any], url: str, *, again: bool = False) -> None:
        """The call is sent to the server ``url`` now: its fence opens with that server's version
        (a server tried before that never had the call does not count). ``again``: the rest of a
        generation (tito after an abort): on another server it keeps its opening and is closed
        with the last server's version; with no common serial to compare, an unchanged version
        there counts as moved (never a guess)."""
        fence = metadata.get("policy")
        v = self.servers.get(url)
        if v is None or not isinstance(fence, dict) or "_serial" not in fence:
            return
        if not again or fence.get("_on") is None:
            fence["sent"] = v.version
            fence["_serial"] = v.serial
            fence["_on"] = url
        elif fence["_on"] != url:
            fence["_serial"] = -1
            fence["_on"] = url

    def close(self, metadata: dict[str, Any]) -> None:
        """Close the fence ``metadata["policy"]`` holds, if open (no version known: removed)."""
        fence = metadata.get("policy")
        if isinstance(fence, dict) and "_serial" in fence:
            # closed with the version when the last token arrived (on the call's server)
            v = self.servers.get(fence.get("_on") or "", self.newest)
            sent, done = fence.get("sent"), v.version
            closed: dict[str, Any] = {"sent": sent, "done": done}
            if fence["_serial"] != v.serial and sent == done:
                closed["moved"] = True  # changed and changed back inside the call
            if "spans" in fence:  # the server's own (tito)
                closed["spans"] = fence["spans"]
            if sent is None and done is None and "spans" not in closed:
                del metadata["policy"]
            else:
                metadata["policy"] = closed

    def salt(self, cfg: ProxyConfig) -> str | None:
        """The ``cache_salt`` to send (``--cache-salt policy``): the newest version, if known (the
        body is built before the fleet picks a server: during a rolling update a server still on
        the old weights gets the new salt, which only costs it cache hits)."""
        if cfg.cache_salt != "policy" or self.newest.version is None:
            return None
        return rlwire.cache_salt(self.newest.version)

    def state(self) -> dict[str, Any]:
        """The newest word; with several upstreams, each one's (``servers``)."""
        out = self.newest.state()
        if len(self.servers) > 1:
            out["servers"] = [{"url": url, **v.state()} for url, v in self.servers.items()]
        return out

    async def refresh(
        self, session: aiohttp.ClientSession, url: str, kind: str, headers: dict[str, str] | None = None
    ) -> None:
        """Ask the server at base ``url`` once (a 404 stops asking it; an unreachable server is
        asked again)."""
        own = self.servers.setdefault(url, Version())
        root = rlwire.server_root(url)
        try:
            v = await rlwire.weight_version(session, root, kind, headers)
        except Exception as exc:  # unreachable, not JSON: the server is asked again next time
            log.debug("policy version: %s: %s: %s", root, type(exc).__name__, exc)
            return
        if v is None:
            own.polling = False
            log.info("policy version: %s has no weight_info (VLLM_SERVER_DEV_MODE=1); not asking again", root)
            return
        changed, own.last_polled = v != own.last_polled, v
        if own.source in ("trainer", "header") and not changed:
            return  # the trainer's word stands until the server reports something new
        if own.set(v, "server"):
            self.newest.set(v, "server")

    async def poll(self, session: aiohttp.ClientSession, cfg: ProxyConfig) -> None:
        """The background loop, every upstream asked on its own (an app's cleanup context starts
        and cancels it)."""
        # the proxy's own upstream credential, as on every call (never a client's)
        headers = {"Authorization": f"Bearer {cfg.upstream_key}"} if cfg.upstream_key else None

        async def one(url: str) -> None:
            own = self.servers.setdefault(url, Version())
            while own.polling and self.tracking:
                await self.refresh(session, url, cfg.upstream_kind, headers)
                await asyncio.sleep(cfg.policy_refresh)

        await asyncio.gather(*(one(url) for url in cfg.upstreams))

    def answer(self, method: str, raw: bytes) -> dict[str, Any]:
        """``POST /v1/orchard/policy`` takes the trainer's version; ``GET`` only answers."""
        if method == "POST":
            self.set(policy_body(raw), "trainer")
        elif method != "GET":
            raise MethodNotAllowed(f"{method} /v1/orchard/policy: use GET or POST")
        return self.state()
