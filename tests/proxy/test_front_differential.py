"""The proxy's own server (``proxy.front``) against aiohttp's (``ORCHARD_FRONT=aiohttp``), differentially.

Two proxies, each over its own demo upstream and its own SQLite database: one serving its calls on
the lean front (the default), one serving everything on aiohttp's web server. Hypothesis draws
sequences of requests (calls of every dialect and method with valid, invalid, empty, chunked and
near or over-the-limit bodies, odd header spellings, session ids and queries; the proxy's own routes,
404s, HEAD, OPTIONS, HTTP/1.0, ``Expect: 100-continue``, websocket upgrades, odd paths;
``Connection: close`` or a malformed request only last) and a way of cutting their bytes into
writes (one request at a time, all in one write, the heads byte by byte, random cuts). The same
bytes go to both over one raw keep-alive connection each; the answers (status line, headers in
order less ``Date``, the body less ids and timestamps; ``/healthz`` and ``/metrics`` by status
only), whether the connection ended up closed, and what each database recorded (path, status,
outcome, stream, session, request body, error, headers) must be equal.

The seven differences it found in the front's first version (a repeated singleton header, a
value's trailing whitespace, a request begun in the read that ends a body over the limit, an
upgrade pipelined behind a call, trailer fields, trailers over the 128 fields, a client gone
before a body's end) have their own tests below and are in the fuzz's reach again. What the fuzz
does not send, because aiohttp's own server gets it wrong:

- a malformed request, or any byte after a ``Connection: close`` request, in the same read as valid
  requests before it: aiohttp answers one 400 (HTTP/1.0) and drops them all; the front answers them
  and then the 400 (malformed requests are sent ``alone``, after the answers before them);
- ``Connection: keep-alive`` on an HTTP/1.0 stream: aiohttp (3.14) sends no length and no close
  (``StreamResponse._prepare_headers`` stores ``keep_alive`` before turning it off), so the client
  never sees the end of the answer (the front hands HTTP/1.0 to aiohttp: the same on both);
- a header name over 8190 bytes together with the previous header's name: aiohttp's limit counts
  both (``cb_on_header_field`` checks before ``_process_header`` resets the name), the front's the
  name alone;
- ``Upgrade: h2c`` pipelined: aiohttp treats what follows as upgraded bytes and never answers it.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard_rec.demo.upstream import DemoUpstream
from orchard_rec.proxy.config import ProxyConfig
from orchard_rec.proxy.server import BackgroundServer, RecordingProxy
from orchard_rec.storage.store import Store

from .rawclient import RawClient, chunked

pytestmark = [pytest.mark.network, pytest.mark.slow]

LIMIT = 1024  # the proxies' max_body_bytes
MODEL = "orchard-demo"
TIMEOUT = 4.0  # every socket operation


# -- the two proxies -----------------------------------------------------------------------------------


@dataclass
class Side:
    name: str
    proxy: RecordingProxy
    up: BackgroundServer
    db: str
    seen: set[str] = field(default_factory=set)  # call ids compared already

    @property
    def port(self) -> int:
        return self.proxy.port

    def new_calls(self) -> list[Any]:
        assert self.proxy.flush(10), "recorder did not drain"
        store = Store(self.db)
        try:
            recs = [r for r in store.calls() if r.call_id not in self.seen]
        finally:
            store.close()
        self.seen.update(r.call_id for r in recs)
        return recs


def _start(tmp: Path, name: str) -> Side:
    up = BackgroundServer(DemoUpstream().app()).start()
    db = f"sqlite:///{tmp / (name + '.db')}"
    cfg = ProxyConfig(
        upstream=up.url + "/v1", db=db, spool=str(tmp / (name + ".spool")), max_body_bytes=LIMIT
    )
    proxy = RecordingProxy(cfg)
    proxy.start()
    return Side(name, proxy, up, db)


def _front_state(port: int) -> dict[str, Any]:
    with RawClient(port, TIMEOUT) as c:
        c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return dict(c.response().json()["front"])


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    tmp = tmp_path_factory.mktemp("differential")
    started: list[Side] = []
    try:
        started.append(_start(tmp, "lean"))
        with pytest.MonkeyPatch.context() as mp:  # read when the server starts
            mp.setenv("ORCHARD_FRONT", "aiohttp")
            started.append(_start(tmp, "aiohttp"))
        lean, aio = started
        assert _front_state(lean.port)["server"] == "lean"
        assert _front_state(aio.port) == {"server": "aiohttp"}
        yield lean, aio
    finally:
        for s in started:
            s.proxy.stop()
            s.up.stop()


# -- requests ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    method: str  # how its answer is read (HEAD: no body)
    data: bytes  # with "{sid}" where the example's session id goes
    head: int  # the head's length in ``data``
    body_compared: bool = True  # /healthz, /metrics: the status only
    last: bool = False  # the connection ends with it (Connection: close, HTTP/1.0, malformed)
    alone: bool = False  # sent once the answers before it are in (a malformed request: see below)
    over: bool = False  # a body over the limit (the next request waits for its answer: see
    # test_a_request_begun_in_the_read_that_ends_a_body_over_the_limit)


def _req(
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes | None = None,
    *,
    version: str = "HTTP/1.1",
    te: list[int] | None = None,
    framing: tuple[str, str, str] = ("Transfer-Encoding", "chunked", "Content-Length"),
    **kw: Any,
) -> Req:
    """``te``: cut points of a chunked body (else ``Content-Length`` when there is a body);
    ``framing``: how the two headers are spelled (and the chunked coding's value)."""
    hs = [("Host", "127.0.0.1"), *headers, ("X-Fuzz", "{sid}")]  # (whose each record is)
    if body is not None and te is not None:
        hs.append((framing[0], framing[1]))
        cuts = sorted({min(max(c, 0), len(body)) for c in te} | {0, len(body)})
        payload = chunked(*[body[a:b] for a, b in itertools.pairwise(cuts) if b > a])
    elif body is not None:
        hs.append((framing[2], str(len(body))))
        payload = body
    else:
        payload = b""
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hs) + "\r\n"
    raw = head.encode("latin-1")
    return Req(method, raw + payload, len(raw), **kw)


def _sized(obj: dict[str, Any], size: int) -> bytes:
    """``obj`` as JSON of exactly ``size`` bytes (padded by an ``x_pad`` field) when it can be."""
    base = json.dumps({**obj, "x_pad": ""}).encode()
    return json.dumps({**obj, "x_pad": "p" * max(size - len(base), 0)}).encode()


def _call_body(route: str, stream: bool) -> dict[str, Any]:
    if route == "chat/completions":
        return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if route == "messages":
        msgs = [{"role": "user", "content": "hi"}]
        return {"model": MODEL, "max_tokens": 8, "messages": msgs, "stream": stream}
    if route == "responses":
        return {"model": MODEL, "input": "hi", "stream": stream}
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": stream}


SID_TAILS = ["", "", "", ".b", "A_B-1", ":x", "@x", "=x", "%C3%A9", "x" * 130, "%7Bx%7D", "{x}", ";p"]
FRAMING_SPELLINGS = [
    ("Transfer-Encoding", "chunked", "Content-Length"),
    ("transfer-encoding", "Chunked", "content-length"),
    ("TRANSFER-ENCODING", "CHUNKED", "CONTENT-LENGTH"),
]
ROUTES = ["chat/completions", "messages", "responses", "completions"]
QUERIES = ["", "?a=1", "?key=sk-secret&x=1", "?q=%C3%A9", "?b=a+b", "?"]
CT_NAMES = ["Content-Type", "content-type", "CONTENT-TYPE", "cOnTeNt-TyPe"]
EXTRAS = [
    ("X-Dup", "a"),
    ("X-Dup", "b"),
    ("User-Agent", "OpenAI/Python 1.55.0"),
    ("Authorization", "Bearer sk-test"),
    ("anthropic-version", "2023-06-01"),
    ("Accept", "text/event-stream"),
    ("Connection", "keep-alive"),
    ("x-ODD_name", "v"),
    ("X-Space", " \t v \t"),
    ("Content-Encoding", "identity"),
    ("Expect", "100-continue"),
    ("Accept-Encoding", "gzip, br"),
    ("X-Empty", ""),
]


@st.composite
def calls(draw: st.DrawFn) -> Req:
    route = draw(st.sampled_from(ROUTES))
    stream = draw(st.booleans())
    tagged = draw(st.sampled_from(["path", "path", "header", "none"]))
    sid = "{sid}" + draw(st.sampled_from(SID_TAILS))
    target = (f"/s/{sid}" if tagged == "path" else "") + "/v1/" + route + draw(st.sampled_from(QUERIES))
    headers = [(draw(st.sampled_from(CT_NAMES)), "application/json")]
    if tagged == "header":
        headers.append((draw(st.sampled_from(["X-Orchard-Session", "x-orchard-session"])), sid))
    # (unique: a repeated singleton header is aiohttp's 400, which drops the requests before it in
    # the same read, an aiohttp bug; test_a_repeated_singleton_header_is_a_400 has it alone)
    headers += draw(st.lists(st.sampled_from(EXTRAS), max_size=3, unique=True))
    method = draw(st.sampled_from(["POST"] * 12 + ["PUT", "PATCH", "DELETE", "GET"]))
    kind = draw(st.sampled_from(["valid", "valid", "valid", "invalid", "empty", "none", "near", "over"]))
    obj = _call_body(route, stream)
    body: bytes | None
    if kind == "valid":
        body = json.dumps(obj).encode()
    elif kind == "invalid":
        body = draw(st.sampled_from([b"{not json", b"[1,2]", b"null", b'{"model": 1}', b"\xff\xfe"]))
    elif kind == "empty":
        body = b""
    elif kind == "none":
        body = None
    elif kind == "near":
        body = _sized(obj, LIMIT + draw(st.integers(-2, 1)))
    else:
        body = _sized(obj, LIMIT * draw(st.sampled_from([2, 5])))
    over = body is not None and len(body) > LIMIT
    te = None
    if body is not None and draw(st.booleans()):
        te = draw(st.lists(st.integers(0, len(body)), max_size=3))
    framing = draw(st.sampled_from(FRAMING_SPELLINGS))
    h10 = draw(st.integers(0, 9)) == 0
    if h10:  # HTTP/1.0: kept alive only when asked, and a stream ends with the connection
        headers = [h for h in headers if h[0] != "Connection"]  # (see test_http10_keep_alive_stream...)
        keep = not stream and draw(st.booleans())
        headers += [("Connection", "keep-alive")] if keep else []
        return _req(method, target, headers, body, version="HTTP/1.0", last=not keep, over=over)
    return _req(method, target, headers, body, te=te, framing=framing, over=over)


ODD_PATHS = [
    "/s/{sid}/v1/chat%2Fcompletions",
    "/s/{sid}/v1/%63hat/completions",
    "/s/{sid}/v1//chat/completions",
    "/s/{sid}/v1/./chat/completions",
    "/s/{sid}/v1/x/../chat/completions",
    "/v1/../v1/chat/completions",
    "/s/{sid}/v1/chat/completions#frag",
    "http://127.0.0.1/s/{sid}/v1/chat/completions",
    "/s/{sid}/v1/orchard/policy",
    "/v1/orchard/policy",
    "/s/{sid}/v2/chat/completions",
    "/s//v1/chat/completions",
    "/v1/",
    "/s/{sid}/v1/",
    "/s/{sid}/v1",
    "/V1/chat/completions",
    "/v1/chat/completions/",
    "/s/{sid}/v1/chat/completions?x=%2F",
]
CHAT = json.dumps(_call_body("chat/completions", False)).encode()
JSON = [("Content-Type", "application/json")]
WS = [
    ("Upgrade", "websocket"),
    ("Connection", "Upgrade"),
    ("Sec-WebSocket-Version", "13"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
]


@st.composite
def others(draw: st.DrawFn) -> Req:
    kind = draw(
        st.sampled_from(
            [
                *["healthz", "metrics", "models", "404", "outcome", "head", "options", "expect", "odd"],
                *["get-call", "websocket"],
            ]
        )
    )
    if kind == "healthz":
        return _req("GET", "/healthz", [], body_compared=False)
    if kind == "metrics":
        return _req("GET", "/metrics", [], body_compared=False)
    if kind == "models":
        return _req("GET", draw(st.sampled_from(["/v1/models", "/s/{sid}/v1/models"])), [])
    if kind == "404":
        return _req(draw(st.sampled_from(["GET", "POST"])), "/no/such/route", [], b"{}")
    if kind == "outcome":
        body = draw(st.sampled_from([b'{"reward": 1.0, "create": true}', b'{"reward": 0.5}', b"nope"]))
        return _req("POST", "/sessions/{sid}/outcome", JSON, body)
    if kind == "head":
        target = draw(st.sampled_from(["/healthz", "/s/{sid}/v1/models", "/v1/models"]))
        return _req("HEAD", target, [], body_compared=target != "/healthz")
    if kind == "options":
        return _req("OPTIONS", draw(st.sampled_from(["/s/{sid}/v1/chat/completions", "/healthz"])), [])
    if kind == "expect":  # the body sent right away (a client that does not wait for the 100)
        headers = [*JSON, ("Expect", "100-continue")]
        return _req(
            "POST", "/s/{sid}/v1/chat/completions", headers, CHAT, te=draw(st.sampled_from([None, [9]]))
        )
    if kind == "odd":
        return _req("POST", draw(st.sampled_from(ODD_PATHS)), JSON, CHAT)
    if kind == "websocket":  # (alone: test_an_upgrade_request_pipelined_behind_a_call)
        return _req("GET", draw(st.sampled_from(["/s/{sid}/v1/responses", "/v1/responses"])), WS)
    return _req("GET", "/s/{sid}/v1/chat/completions", [])  # a call route with GET


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}{",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    b"post /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Fold: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Foo : v\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 002\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/2.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2;ext=1\r\n{}\r\n0\r\nX-Trailer: t\r\n\r\n",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}\r\n",
    b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{}",
    b"POST /s/{sid}\xc3\xa9/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
]


@st.composite
def finals(draw: st.DrawFn) -> Req:
    kind = draw(st.sampled_from(["close", "close", "h10", "malformed"]))
    if kind == "malformed":
        raw = draw(st.sampled_from(MALFORMED))
        head = raw.find(b"\n\r\n") + 3 if b"\n\r\n" in raw else len(raw)
        return Req("POST", raw, head, last=True, alone=True)
    if kind == "h10":
        return _req("POST", "/s/{sid}/v1/chat/completions", JSON, CHAT, version="HTTP/1.0", last=True)
    body = json.dumps(_call_body(draw(st.sampled_from(ROUTES)), draw(st.booleans()))).encode()
    route = draw(st.sampled_from(ROUTES))
    target = draw(st.sampled_from([f"/s/{{sid}}/v1/{route}", "/healthz", "/v1/models"]))
    method = "POST" if "/s/" in target else "GET"
    return _req(
        method,
        target,
        [*JSON, ("Connection", draw(st.sampled_from(["close", "Close", "keep-alive, close"])))],
        body if method == "POST" else None,
        last=True,
        body_compared=target != "/healthz",
    )


@st.composite
def sequences(draw: st.DrawFn) -> tuple[list[Req], str, list[int]]:
    middle = draw(st.lists(st.one_of(calls(), calls(), others()), min_size=1, max_size=5))
    reqs = [r for r in middle if not r.last]  # (an HTTP/1.0 call that closes: only last)
    tail = [r for r in middle if r.last][:1]
    if not tail and draw(st.booleans()):
        tail = [draw(finals())]
    reqs += tail
    if not reqs:
        reqs = [draw(calls().filter(lambda r: not r.last))]
    mode = draw(st.sampled_from(["lockstep", "one-write", "heads-bytewise", "random-cuts"]))
    total = sum(len(r.data) for r in reqs)
    cuts = draw(st.lists(st.integers(1, max(total - 1, 1)), max_size=8)) if mode == "random-cuts" else []
    return reqs, mode, cuts


# -- one exchange --------------------------------------------------------------------------------------

_IDS = [
    (re.compile(rb'"(created|created_at|expires_at|completed_at)":\s*\d+(\.\d+)?'), rb'"\1":0'),
    (re.compile(rb"[0-9a-f]{16,}"), b"<hex>"),
    (re.compile(rb"(chatcmpl|cmpl|resp|msg|rs|fc|call|toolu|item)[-_][0-9A-Za-z]{8,}"), rb"\1-<id>"),
]


def _norm(data: bytes, sid: str) -> bytes:
    data = data.replace(sid.encode(), b"<sid>")
    for pat, sub in _IDS:
        data = pat.sub(sub, data)
    return data


VOLATILE = {"date", "x-orchard-call-id", "x-request-id"}


def _answer(r: Any, req: Req, sid: str) -> tuple[Any, ...]:
    """An answer as compared: status line, headers in order as spelled (less ``Date``; ids
    normalised), framing, body (normalised; none for /healthz and /metrics, nor their length)."""
    headers = tuple(
        (k, _norm(v.encode("latin-1"), sid).decode("latin-1"))
        for k, v in r.headers
        if k.lower() not in VOLATILE and not (not req.body_compared and k.lower() == "content-length")
    )
    body = _norm(r.body, sid) if req.body_compared else None
    return (r.version, r.status, r.reason, headers, r.framing, body)


def _send(c: RawClient, reqs: list[Req], datas: list[bytes], mode: str, cuts: list[int]) -> None:
    if mode == "one-write":
        c.send(b"".join(datas))
    elif mode == "heads-bytewise":
        for r, data in zip(reqs, datas, strict=True):
            head = r.head + (len(data) - len(r.data))  # (the session id's length)
            c.trickle(data[:head], 1)
            if data[head:]:
                c.send(data[head:])
    else:
        whole = b"".join(datas)
        points = sorted({p for p in cuts if 0 < p < len(whole)} | {0, len(whole)})
        for a, b in itertools.pairwise(points):
            c.send(whole[a:b])
            time.sleep(0.001)


def exchange(port: int, reqs: list[Req], mode: str, cuts: list[int], sid: str) -> list[Any]:
    """What a client sees of ``reqs`` on one connection: each answer (and interim answer), then
    ``"closed"`` or ``"open"`` (a ``GET /healthz`` probe is answered)."""
    datas = [r.data.replace(b"{sid}", sid.encode()) for r in reqs]
    seen: list[Any] = []
    groups: list[list[int]] = []  # sent together (by ``mode``); an ``alone`` request is a group of its
    # own, a request ``over`` the limit ends one (the next is sent once its answer is in)
    for i, r in enumerate(reqs):
        if mode == "lockstep" or r.alone or not groups or reqs[groups[-1][-1]].alone:
            groups.append([i])
        else:
            groups[-1].append(i)
    with RawClient(port, TIMEOUT) as c:
        try:
            for group in groups:
                if len(group) == 1 and (mode == "lockstep" or reqs[group[0]].alone):
                    c.send(datas[group[0]])
                else:
                    start = sum(len(d) for d in datas[: group[0]])
                    _send(
                        c,
                        [reqs[i] for i in group],
                        [datas[i] for i in group],
                        mode,
                        [p - start for p in cuts],
                    )
                for i in group:
                    while True:
                        a = c.response(reqs[i].method, interim=True)
                        seen.append(_answer(a, reqs[i], sid))
                        if not 100 <= a.status < 200:
                            break
        except EOFError:
            seen.append("eof")
            return seen
        except (BrokenPipeError, ConnectionResetError):
            seen.append("reset")
            return seen
        except TimeoutError:
            seen.append("timeout")
            return seen
        try:
            c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            a = c.response()
        except (EOFError, OSError):
            seen.append("closed")
        else:
            seen.append(("open", a.status))
    return seen


def _recorded(side: Side, sid: str) -> list[tuple[Any, ...]]:
    """The calls ``side`` recorded of the example ``sid`` since the last look (a record of an
    earlier example that came late is dropped)."""
    rows = []
    for r in side.new_calls():
        if sid not in repr((r.session_id, r.path, r.headers)):
            continue
        headers = sorted((k.lower(), _norm(v.encode(), sid).decode()) for k, v in (r.headers or {}).items())
        text = None if r.request_text is None else _norm(r.request_text.encode(), sid)
        sess = None if r.session_id is None else _norm(r.session_id.encode(), sid)
        error = None if r.error is None else _norm(r.error.encode(), sid)
        rows.append(
            (r.method, r.path, r.status_code, str(r.outcome), r.stream, sess, text, error, tuple(headers))
        )
    return sorted(rows, key=repr)


_COUNTER = [0]


def _compare(sides: tuple[Side, Side], reqs: list[Req], mode: str, cuts: list[int]) -> None:
    lean, aio = sides
    _COUNTER[0] += 1
    sid = f"dx{_COUNTER[0]:05d}"
    got_lean = exchange(lean.port, reqs, mode, cuts, sid)
    got_aio = exchange(aio.port, reqs, mode, cuts, sid)
    rec_lean, rec_aio = _recorded(lean, sid), _recorded(aio, sid)
    deadline = time.monotonic() + 2
    while len(rec_lean) != len(rec_aio) and time.monotonic() < deadline:  # a record may come late
        time.sleep(0.05)
        rec_lean = sorted(rec_lean + _recorded(lean, sid), key=repr)
        rec_aio = sorted(rec_aio + _recorded(aio, sid), key=repr)
    sent = b"".join(r.data for r in reqs)
    assert got_lean == got_aio, f"answers differ for {mode} {cuts} {sent[:2000]!r}"
    assert rec_lean == rec_aio, f"records differ for {mode} {cuts} {sent[:2000]!r}"


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    database=None,
)
@given(seq=sequences())
def test_lean_front_answers_and_records_as_aiohttp_does(sides: tuple[Side, Side], seq: Any) -> None:
    reqs, mode, cuts = seq
    _compare(sides, reqs, mode, cuts)


def test_the_comparison_tells_answers_apart(sides: tuple[Side, Side]) -> None:
    """What the fuzz compares is not normalised away: two dialects' answers differ, a closed
    connection is told from an open one, and a session id is only ever ``<sid>``."""
    lean = sides[0]
    chat = _req("POST", "/s/{sid}/v1/chat/completions", JSON, CHAT)
    messages = _req("POST", "/s/{sid}/v1/messages", JSON, json.dumps(_call_body("messages", False)).encode())
    close = _req("POST", "/s/{sid}/v1/chat/completions", [*JSON, ("Connection", "close")], CHAT, last=True)
    a = exchange(lean.port, [chat, messages], "one-write", [], "dx-apart")
    b = exchange(lean.port, [chat, close], "lockstep", [], "dx-apart")
    assert [x[1] for x in a[:2]] == [200, 200] and a[0] != a[1] and a[-1] == ("open", 200)
    assert a[0] == b[0] and b[1][1] == 200 and b[-1] == "closed"
    assert b"dx-apart" not in repr(a + b).encode()
    assert {r[5] for r in _recorded(lean, "dx-apart")} == {b"<sid>"}


# -- the differences found in the front's first version, each fixed --------------------------------------


def _one(sides: tuple[Side, Side], data: bytes) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """One request alone on a connection of each proxy: both answers, then both records."""
    req = Req("POST", data, data.index(b"\r\n\r\n") + 4)
    lean, aio = sides
    _COUNTER[0] += 1
    sid = f"dx{_COUNTER[0]:05d}"
    got = exchange(lean.port, [req], "lockstep", [], sid), exchange(aio.port, [req], "lockstep", [], sid)
    return got[0], got[1], _recorded(lean, sid), _recorded(aio, sid)


def _call_with(*lines: str) -> bytes:
    head = "POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return (
        head + "".join(f"{h}\r\n" for h in lines) + f"Content-Length: {len(CHAT)}\r\n\r\n"
    ).encode() + CHAT


SINGLETONS = ["Host", "Content-Type", "User-Agent", "Content-Location", "Content-Range", "ETag", "Server"]


@pytest.mark.parametrize("name", SINGLETONS)
def test_a_repeated_singleton_header_is_a_400(sides: tuple[Side, Side], name: str) -> None:
    data = _call_with(f"{name}: a", f"{name}: b") if name != "Content-Type" else _call_with("Content-Type: b")
    lean, aio, rec_lean, rec_aio = _one(sides, data)
    assert aio[0][1] == 400 and aio[-1] == "closed" and rec_aio == []
    assert lean == aio and rec_lean == rec_aio


def test_trailing_whitespace_of_a_header_value(sides: tuple[Side, Side]) -> None:
    lean, aio, rec_lean, rec_aio = _one(sides, _call_with("X-Space: v \t", "X-Tail: w  "))
    assert lean == aio
    assert ("x-space", "v") in rec_aio[0][-1] and ("x-tail", "w") in rec_aio[0][-1]
    assert rec_lean == rec_aio


def test_a_request_begun_in_the_read_that_ends_a_body_over_the_limit(sides: tuple[Side, Side]) -> None:
    big = _req(
        "POST",
        "/s/linger/v1/chat/completions",
        JSON,
        _sized(_call_body("chat/completions", False), LIMIT + 1),
    )
    nxt = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    for side in sides[::-1]:  # aiohttp's first: it answers both at once
        with RawClient(side.port, 3.0) as c:
            c.send(big.data + nxt[:5])
            time.sleep(0.1)  # the server has read the first write
            c.send(nxt[5:])
            assert c.response("POST").status == 413
            assert c.response().status == 200, side.name
            assert not c.closed(0.1)


def test_an_upgrade_request_pipelined_behind_a_call(sides: tuple[Side, Side]) -> None:
    call = _req("POST", "/s/{sid}/v1/chat/completions", JSON, CHAT)
    ws = _req("GET", "/s/{sid}/v1/responses", WS)
    seqs = [exchange(side.port, [call, ws, call], "one-write", [], "dx-upgrade") for side in sides]
    statuses = [[a if isinstance(a, str) else a[1] for a in seq] for seq in seqs]
    assert statuses[1] == [200, 426, 200, 200]  # (the last: the probe's, on a connection still open)
    assert statuses[0] == statuses[1]


def test_trailers_of_a_request_handed_over_rebuilt(sides: tuple[Side, Side]) -> None:
    call = _req("POST", "/s/{sid}/v1/chat/completions", JSON, CHAT)
    head = b"PUT /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    put = Req("PUT", head + b"%x\r\n%b\r\n0\r\nX-Trailer: t\r\n\r\n" % (len(CHAT), CHAT), len(head))
    _COUNTER[0] += 1
    sid = f"dx{_COUNTER[0]:05d}"
    got = [exchange(side.port, [call, put], "one-write", [], sid) for side in sides]
    records = [_recorded(side, sid) for side in sides]
    assert got[0] == got[1]  # (the upstream's 405 to a PUT, on both)
    assert len(records[1]) == 2 and all(("x-trailer", "t") not in r[-1] for r in records[1])  # dropped
    assert records[0] == records[1]


def test_trailers_over_the_header_count_of_a_call_the_front_took(sides: tuple[Side, Side]) -> None:
    fields = b"".join(b"X-%d: 1\r\n" % i for i in range(126))
    head = b"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" + fields
    trailers = b"".join(b"T-%d: 1\r\n" % i for i in range(5))
    data = head + b"\r\n%x\r\n%b\r\n0\r\n%b\r\n" % (len(CHAT), CHAT, trailers)
    lean, aio, rec_lean, rec_aio = _one(sides, data)
    assert aio[0][:2] == ("HTTP/1.0", 400) and aio[-1] == "closed" and rec_aio == []
    assert lean == aio and rec_lean == rec_aio


def test_a_client_gone_before_the_end_of_a_body(sides: tuple[Side, Side]) -> None:
    _COUNTER[0] += 1
    sid = f"dx{_COUNTER[0]:05d}"
    data = _req("POST", "/s/{sid}/v1/chat/completions", JSON, CHAT).data.replace(b"{sid}", sid.encode())
    for side in sides:
        with RawClient(side.port, TIMEOUT) as c:
            c.send(data[: data.index(b"\r\n\r\n") + 4 + 40])  # the head and 40 bytes of the body
            time.sleep(0.2)
    records: list[list[Any]] = [[], []]
    deadline = time.monotonic() + 3
    while not records[1] and time.monotonic() < deadline:
        time.sleep(0.1)
        records = [records[0] + _recorded(sides[0], sid), records[1] + _recorded(sides[1], sid)]
    assert [(r[2], r[3], r[7]) for r in records[1]] == [(None, "CallOutcome.ABORTED", b"client disconnected")]
    assert records[0] == records[1]
