"""The proxy's HTTP server with real clients and large or slow traffic (the wire contract itself:
``test_front_contract.py``): curl as users run it (``Expect: 100-continue``, an ``h2c`` upgrade
offered, HTTP/1.0, HEAD, streaming, several URLs on one connection), the openai and anthropic
SDKs on an oversized body, multi-megabyte request bodies in pieces, events relayed as they come,
a client that half-closes after its request; and the main cases of the wire contract against
``orchard-rec serve`` itself (its own process, on uvloop)."""

from __future__ import annotations

import gzip
import json
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard_rec.records import CallOutcome

from .frontup import (
    ANSWER,
    CHAT,
    MODEL,
    Front,
    FrontUpstream,
    chat,
    ok_call,
    piece,
    running_front,
    stored_calls,
    stream_bytes,
    upstream,
)
from .rawclient import RawClient, chunked, post_json, request

pytestmark = pytest.mark.network

LIMIT = 8192


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    with running_front(tmp_path, max_body_bytes=LIMIT) as f:
        yield f


# -- curl --------------------------------------------------------------------------------------------------


def _curl(*args: str) -> tuple[str, list[str]]:
    """curl's output and its verbose lines (``>`` sent, ``<`` received, ``*`` its notes)."""
    r = subprocess.run(
        ["curl", "-sS", "-v", "--max-time", "10", *args], capture_output=True, text=True, timeout=20
    )
    assert r.returncode == 0, r.stderr
    return r.stdout, [line.rstrip("\r") for line in r.stderr.splitlines()]


need_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


@need_curl
def test_curl_as_users_run_it(front: Front, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{front.port}/s/curl/v1"
    body = tmp_path / "body.json"
    body.write_text(json.dumps({**CHAT, "pad": "x" * 3000}))
    json_body = ("-H", "Content-Type: application/json", "--data-binary")

    out, v = _curl("-H", "Expect: 100-continue", *json_body, f"@{body}", f"{url}/chat/completions")
    assert json.loads(out) == ANSWER
    assert v.index("< HTTP/1.1 100 Continue") < v.index("< HTTP/1.1 200 OK")

    out, v = _curl("--http2", *json_body, json.dumps(CHAT), f"{url}/chat/completions")
    assert "> Upgrade: h2c" in v and "< HTTP/1.1 200 OK" in v  # the upgrade offered is declined
    assert json.loads(out) == ANSWER and not any(line.startswith("< HTTP/1.1 101") for line in v)

    out, v = _curl("--http1.0", *json_body, json.dumps(CHAT), f"{url}/chat/completions")
    assert "< HTTP/1.0 200 OK" in v and json.loads(out) == ANSWER

    out, v = _curl("-I", f"{url}/models")
    assert out.startswith("HTTP/1.1 200 OK\n") and "x-upstream-thing: kept\n" in out

    out, v = _curl("-N", *json_body, json.dumps({**CHAT, "stream": True}), f"{url}/chat/completions")
    assert out == stream_bytes(3, 8).decode() and "< Transfer-Encoding: chunked" in v

    # several URLs: one connection
    out, v = _curl(f"{url}/models", f"http://127.0.0.1:{front.port}/healthz", f"{url}/models")
    assert sum("Re-using existing connection" in line for line in v) == 2
    assert sum(line.startswith("< HTTP/1.1 200 OK") for line in v) == 3

    recs = front.calls("curl")
    assert [(r.method, r.path, r.stream, r.outcome) for r in recs] == [
        ("POST", "/v1/chat/completions", False, CallOutcome.OK),
        ("POST", "/v1/chat/completions", False, CallOutcome.OK),
        ("POST", "/v1/chat/completions", False, CallOutcome.OK),
        ("HEAD", "/v1/models", False, CallOutcome.OK),
        ("POST", "/v1/chat/completions", True, CallOutcome.OK),
        ("GET", "/v1/models", False, CallOutcome.OK),
        ("GET", "/v1/models", False, CallOutcome.OK),
    ]
    assert {r.harness for r in recs} == {"curl"}


# -- the SDKs on an oversized body ---------------------------------------------------------------------------


def test_sdks_see_413_in_their_own_dialect(front: Front) -> None:
    import anthropic
    import openai

    pad = "x" * (LIMIT + 1)
    base = f"http://127.0.0.1:{front.port}/s/sdk413"
    oai = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0, timeout=10)
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": pad}])
    assert e.value.status_code == 413 and e.value.code == "request_too_large"
    assert f"limit of {LIMIT} bytes" in e.value.message
    ok = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content == "hello from upstream"

    ant = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0, timeout=10)
    with pytest.raises(anthropic.APIStatusError) as ea:
        ant.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": pad}])
    assert ea.value.status_code == 413
    assert ea.value.body == {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": f"request body is larger than the proxy's limit of {LIMIT} bytes",
        },
    }
    msg = ant.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].type == "text" and msg.content[0].text == "hello"
    recs = front.calls("sdk413")
    assert [(r.path, r.status_code, r.outcome) for r in recs] == [
        ("/v1/chat/completions", 413, CallOutcome.REJECTED),
        ("/v1/chat/completions", 200, CallOutcome.OK),
        ("/v1/messages", 413, CallOutcome.REJECTED),
        ("/v1/messages", 200, CallOutcome.OK),
    ]


# -- large and slow traffic ----------------------------------------------------------------------------------


def test_multi_megabyte_bodies_in_pieces(tmp_path: Path) -> None:
    text = "".join(piece(i, 1000) for i in range(3000))  # 3 MB, every KB its own
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": text}]}).encode()
    with running_front(tmp_path) as front, RawClient(front.port, timeout=10) as c:  # the default limit
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        c.send(request("POST", "/s/bigbody/v1/chat/completions", None, headers))
        c.trickle(body, 65536)
        ok_call(c.response("POST"))
        te = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        c.send(request("POST", "/s/bigbody/v1/chat/completions", None, te))
        pieces = [body[i : i + 50_000] for i in range(0, len(body), 50_000)]
        c.trickle(chunked(*pieces), 65536)
        ok_call(c.response("POST"))
        recs = front.calls("bigbody")
    assert [(r.outcome, r.bytes_in) for r in recs] == [(CallOutcome.OK, len(body))] * 2
    assert all(r.request_text == body.decode() for r in recs)


def test_events_are_relayed_as_they_come(front: Front) -> None:
    """Each event reaches the client while the upstream still holds back the next (no buffering)."""
    with RawClient(front.port) as c:
        c.send(chat("live", stream=True, x_chunks=4, x_delay=0.4, x_size=16))
        seen = []
        for i in range(4):
            c.read_until(piece(i, 16).encode())
            seen.append(time.monotonic())
        r = c.response("POST")
        assert (r.status, r.framing) == (200, "chunked") and r.body == stream_bytes(4, 16)
    # the upstream spends 1.2 s between its first and last event: buffered, they would come together
    assert seen[-1] - seen[0] > 0.8, seen
    [rec] = front.calls("live")
    assert rec.outcome is CallOutcome.OK and rec.stream


def test_client_half_closing_after_its_request(front: Front) -> None:
    """A client that sends its request then shuts down its sending side (``nc -N``). Today aiohttp
    takes the FIN for a disconnect: no answer, the call recorded ``aborted``. Answering it would be
    as right; what must hold either way: no hang, no 5xx, the call recorded, the proxy goes on."""
    with RawClient(front.port) as c:
        c.send(chat("half"))
        c.sock.shutdown(socket.SHUT_WR)
        try:
            r = c.response("POST")
        except EOFError:
            answered = False
        else:
            ok_call(r)
            answered = True
    [rec] = front.calls("half", at_least=1)
    assert rec.outcome is (CallOutcome.OK if answered else CallOutcome.ABORTED)
    with RawClient(front.port) as c:
        c.send(chat("half"))
        ok_call(c.response("POST"))


# -- orchard-rec serve -----------------------------------------------------------------------------------------


def _serve_wire(port: int) -> None:
    """The contract's main cases, on one keep-alive connection and a few others."""
    body = json.dumps({**CHAT, "n": 5}).encode()
    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    te = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    expect = {"Content-Type": "application/json", "Content-Length": str(len(body)), "Expect": "100-continue"}
    reqs: list[tuple[str, bytes, int]] = [
        ("GET", request("GET", "/healthz"), 200),
        ("POST", chat("uv"), 200),
        ("HEAD", request("HEAD", "/s/uv/v1/models"), 200),
        ("POST", request("POST", "/s/uv/v1/chat/completions", gzip.compress(body), gz), 200),
        ("POST", request("POST", "/s/uv/v1/chat/completions", chunked(body[:7], body[7:]), te), 200),
        ("POST", chat("uv", pad="x" * (LIMIT + 1)), 413),
        ("GET", request("GET", "/s/uv/nowhere"), 404),
        (
            "POST",
            post_json("/s/uv/v1/chat/completions", CHAT, {"Connection": "keep-alive"}, version="HTTP/1.0"),
            200,
        ),
        ("POST", chat("uv", stream=True), 200),
    ]
    with RawClient(port) as c:
        c.trickle(b"".join(data for _, data, _ in reqs), 11)  # pipelined, cut anywhere
        answers = [c.response(method) for method, _, _ in reqs]
        assert [r.status for r in answers] == [status for _, _, status in reqs]
        for r in (answers[1], answers[3], answers[4]):
            ok_call(r)
        assert answers[5].json()["error"]["code"] == "request_too_large"
        assert (answers[7].version, answers[7].framing) == ("HTTP/1.0", "length")
        assert answers[8].framing == "chunked" and answers[8].body == stream_bytes(3, 8)
        c.send(request("POST", "/s/uv/v1/chat/completions", None, expect))
        assert c.response("POST", interim=True).status == 100
        c.send(body)
        ok_call(c.response("POST"))
        c.send(post_json("/s/uv/v1/chat/completions", CHAT, {"Connection": "close"}))
        r = c.response("POST")
        assert r.header("connection") == "close" and r.json() == ANSWER
        assert c.closed()
    with RawClient(port) as c:
        c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
        assert c.response().status == 400 and c.closed()
    with RawClient(port) as c:
        c.send(post_json("/s/uv/v1/chat/completions", CHAT, version="HTTP/1.0"))
        r = c.response("POST")
        assert (r.version, r.status, r.framing) == ("HTTP/1.0", 200, "length") and c.closed()


def test_serve_speaks_the_same_wire(tmp_path: Path) -> None:
    from factories import free_port, serve_process

    up = upstream(FrontUpstream())
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    port = free_port()
    mb = str(LIMIT / 1024 / 1024)  # exactly LIMIT bytes
    args = ("--mode", "passthrough", "--spool", str(tmp_path / "serve.spool"), "--max-body-mb", mb)
    proc = serve_process(port, up.url + "/v1", db, *args, stderr=subprocess.PIPE)
    try:
        _serve_wire(port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        up.stop()
    # no traceback but aiohttp's own log of the malformed request (a log line, not a crash)
    assert err.count("Traceback") == err.count("Error handling request") <= 1, err
    assert "stopped after" in err and "10 call(s) recorded" in err
    recs = stored_calls(db, "uv")
    assert [(r.method, r.status_code, r.stream, r.outcome) for r in recs] == [
        ("POST", 200, False, CallOutcome.OK),
        ("HEAD", 200, False, CallOutcome.OK),
        ("POST", 200, False, CallOutcome.OK),
        ("POST", 200, False, CallOutcome.OK),
        ("POST", 413, False, CallOutcome.REJECTED),
        ("POST", 200, False, CallOutcome.OK),
        ("POST", 200, True, CallOutcome.OK),
        ("POST", 200, False, CallOutcome.OK),
        ("POST", 200, False, CallOutcome.OK),
        ("POST", 200, False, CallOutcome.OK),
    ]
