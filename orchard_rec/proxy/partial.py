"""Tito's partial rollouts: a generation the server aborted for a weight update, continued.

A trainer that pauses vLLM with ``/pause?mode=abort`` cuts every running generation: the server
answers ``finish_reason: "abort"`` with the tokens so far (and their ``weight_versions``). In tito
mode the proxy holds the exact ids, so it continues the generation after ``/resume`` from the
prompt plus those tokens, with what is left of ``max_tokens``, and gives the client one
uninterrupted answer (tito answers the client after the whole generation, stream or not). The
record holds every part: the ids and log-probs concatenated, the parts' sizes and finishes in
``metadata["tito"]["parts"]``, and each part's version spans shifted to its place.

Waiting for ``/resume``: vLLM's ``GET /is_paused`` is asked every ``POLL_S`` (a server without it
counts as resumed); a new request sent while paused would wait in vLLM's queue anyway. At most
``MAX_PARTS`` parts: a server that keeps aborting gets its last answer relayed as it is.
Any abort the server reports is continued (``/abort_requests`` too: the proxy cannot tell them
apart).

With a fleet the next part goes to the server that ran the call (its ``/is_paused`` is the one
waited for) while it is healthy; when it is gone (connection refused, ejected) to another server
of the fleet, which gets the exact ids so far: the part's entry in ``parts`` then names it
(``upstream``), and the record's ``metadata["upstream"]`` is the server of the last part.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from orchard_rec import policy, rlwire
from orchard_rec.errors import UpstreamProtocolError
from orchard_rec.proxy.capture import Capture
from orchard_rec.proxy.tito_wire import read_upstream
from orchard_rec.proxy.titocall import Generated

__all__ = ["MAX_PARTS", "POLL_S", "Generated", "Link", "Server", "continue_aborted", "settle"]

MAX_PARTS = 8
POLL_S = 0.05


class Server(Protocol):
    """The server a generation runs on: ``serve``'s config is one, the intercept door passes the
    server its call went to (``intercept.servers.Target``)."""

    @property
    def upstream(self) -> str: ...
    @property
    def upstream_kind(self) -> str: ...
    @property
    def read_timeout(self) -> float: ...


@dataclass
class Link:
    """How to reach the token endpoint again: the app's session, the URL on a server
    (``url_of(base)``), the headers, the app's mapping of upstream errors (a context manager), the
    call's metadata (``"upstream"``: the server that ran its last part) and the app's way to a
    server of the fleet (``open(url_of, prefer, data=..., headers=...)``: ``prefer`` first while it
    is healthy, else another; it sets ``metadata["upstream"]``)."""

    session: aiohttp.ClientSession
    url_of: Callable[[str], str]
    headers: dict[str, str]
    errors: Callable[[], AbstractContextManager[None]]
    metadata: dict[str, Any]
    open: Callable[..., AbstractAsyncContextManager[Any]]

    @property
    def server(self) -> str:
        """The base URL of the server that ran the last part."""
        return str(self.metadata["upstream"])

    async def send(self, wire: bytes) -> tuple[int, bytes]:
        """The next part, on the server that ran the last one while it is healthy, else another."""
        with self.errors():
            async with self.open(self.url_of, self.server, data=wire, headers=self.headers) as up:
                return up.status, await up.read()
        raise AssertionError("unreachable")  # pragma: no cover


async def settle(
    cfg: Server, cap: Capture, first: Generated, body: dict[str, Any], prompt: Sequence[int], link: Link
) -> Generated:
    """The generation whose ``first`` part a token endpoint answered, continued when it was aborted;
    when continued the last part's answer is what the record parses."""
    gen = first
    if rlwire.abort_finish(cfg.upstream_kind, first.obj):
        gen = await continue_aborted(cfg, body, prompt, first, link)
        if gen.status < 400:
            cap.body, cap.id_cut = gen.data, None
    return gen


def _next_body(kind: str, body: dict[str, Any], prompt: Sequence[int], ids: Sequence[int]) -> dict[str, Any]:
    """The same request, from ``prompt + ids``, for what is left of its token budget."""
    ids_in = [*prompt, *ids]
    if kind == "sglang":
        sp = dict(body["sampling_params"])
        sp["max_new_tokens"] = max(1, int(sp.get("max_new_tokens") or 1) - len(ids))
        return {**body, "input_ids": ids_in, "sampling_params": sp}
    if "sampling_params" in body:  # vLLM /inference/v1/generate
        sp = dict(body["sampling_params"])
        sp["max_tokens"] = max(1, int(sp.get("max_tokens") or 1) - len(ids))
        return {**body, "token_ids": ids_in, "sampling_params": sp}
    return {**body, "prompt": ids_in, "max_tokens": max(1, int(body.get("max_tokens") or 1) - len(ids))}


async def _resumed(link: Link, root: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not await rlwire.is_paused(link.session, root, link.headers):
                return
        except Exception:  # a server without /is_paused: take it as resumed
            return
        await asyncio.sleep(POLL_S)


async def continue_aborted(
    cfg: Server, body: dict[str, Any], prompt: Sequence[int], first: Generated, link: Link
) -> Generated:
    """``first`` (an aborted part) continued until a part ends otherwise, or ``MAX_PARTS``."""
    kind, home = cfg.upstream_kind, link.server
    ids, lps = list(first.ids), None if first.lps is None else list(first.lps)
    spans: list[policy.Span] | None = None if first.spans is None else list(first.spans)
    parts: list[dict[str, Any]] = [{"tokens": len(first.ids), "finish": "abort"}]
    last = first
    budget_left = True
    while rlwire.abort_finish(kind, last.obj) and len(parts) < MAX_PARTS and budget_left:
        # the server that ran the call resumes (a server gone counts as resumed: the part then
        # goes to another, whose queue holds it while that one is paused too)
        await _resumed(link, rlwire.server_root(link.server), cfg.read_timeout)
        nxt = _next_body(kind, body, prompt, ids)
        status, data = await link.send(orjson.dumps(nxt))
        where = {} if link.server == home else {"upstream": link.server}
        if status >= 400:
            return Generated(ids, lps, "abort", None, _spans(spans), status, data, None, parts)
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise UpstreamProtocolError("the upstream's token endpoint did not answer JSON") from exc
        more, more_lps, finish, _ = read_upstream(kind, obj)
        got = rlwire.spans_in(kind, obj, len(more))
        spans = None if spans is None or got is None else spans + policy.shift(got, len(ids))
        lps = None if lps is None or more_lps is None else lps + more_lps
        ids += more
        aborted = rlwire.abort_finish(kind, obj)
        parts.append({"tokens": len(more), "finish": "abort" if aborted else finish, **where})
        last = Generated(more, more_lps, finish, None, got, status, data, obj)
        budget_left = bool(more) or not aborted
    finish = "abort" if rlwire.abort_finish(kind, last.obj) else last.finish
    # the server's text of the parts is not joined (a character may straddle the cut): decoded whole
    return Generated(ids, lps, finish, None, _spans(spans), last.status, last.data, last.obj, parts)


def _spans(spans: list[policy.Span] | None) -> tuple[policy.Span, ...] | None:
    return None if spans is None else tuple(_merge(spans))


def _merge(spans: list[policy.Span]) -> list[policy.Span]:
    """Adjacent spans of one version joined (a part that went on with the same weights)."""
    out: list[policy.Span] = []
    for v, s, e in spans:
        if s == e:
            continue
        if out and out[-1][0] == v and out[-1][2] == s:
            out[-1] = (v, out[-1][1], e)
        else:
            out.append((v, s, e))
    return out
