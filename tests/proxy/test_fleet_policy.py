"""A fleet's policy versions and tito's continued aborts, per upstream (issue 39).

Each server of a fleet runs its own weights: the proxy asks each one's ``/weight_info`` on its
own, and a call's fence is that of the server that ran it. A generation aborted for a weight
update (``/pause?mode=abort``) is continued on the server that ran it, once that server says it
resumed; when that server is gone, on another one, from the exact ids so far.

The upstreams are small fakes written here (vLLM's wire as its docs and source show it:
``/weight_info``, ``/is_paused``, ``/inference/v1/generate`` with ``weight_versions``), served over
loopback; they share no code with the proxy.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from aiohttp import web

from orchard_rec.proxy.server import BackgroundServer


class FakeVllm:
    """A vLLM server with dev mode (``/weight_info``) and the token-in endpoint: chat answers
    (passthrough), ``/inference/v1/generate`` answering ``ids`` in two parts when ``abort`` is
    set: a request for the whole budget is cut after ``len(ids[0])`` tokens (``finish_reason:
    abort``), the server paused for ``pause_s`` and its weights relabelled ``after``; the rest is
    the continuation's. ``weight_info`` None: no dev mode (404)."""

    def __init__(self, name: str, version: str | None) -> None:
        self.name, self.version = name, version
        self.polls = 0
        self.generated: list[dict[str, Any]] = []
        self.paused_until = 0.0
        self.abort: tuple[list[int], list[int], str, float] | None = None
        self.aborted = threading.Event()
        self.chats = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/weight_info", self.weight_info)
        app.router.add_get("/is_paused", self.is_paused)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/inference/v1/generate", self.generate)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def weight_info(self, request: web.Request) -> web.Response:
        self.polls += 1
        if self.version is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response({"weight_version": self.version})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": time.monotonic() < self.paused_until})

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.chats += 1
        return web.json_response(
            {
                "id": f"chatcmpl-{self.name}",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.name},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["_at"] = time.monotonic()
        self.generated.append(body)
        assert self.abort is not None, "no generation armed"
        first, rest, after, pause_s = self.abort
        whole = body["sampling_params"]["max_tokens"] == 64
        ids = first if whole else rest
        version = self.version
        if whole:  # /pause?mode=abort mid-generation: the weights change while paused
            self.version = after
            self.paused_until = time.monotonic() + pause_s
        choice = {
            "index": 0,
            "finish_reason": "abort" if whole else "stop",
            "token_ids": ids,
            "weight_versions": [{"version": version, "start": 0, "end": len(ids)}],
            "logprobs": {
                "content": [{"token_id": i, "logprob": -0.5, "rank": None, "top_logprobs": []} for i in ids]
            },
        }
        if whole:
            self.aborted.set()
        return web.json_response(
            {"request_id": "r", "model": "m", "created": 1, "choices": [choice], "prompt_token_ids": None}
        )


@pytest.fixture
def fakes():  # type: ignore[no-untyped-def]
    started: list[BackgroundServer] = []

    def make(name: str, version: str | None) -> tuple[FakeVllm, BackgroundServer]:
        fake = FakeVllm(name, version)
        srv = BackgroundServer(fake.app()).start()
        started.append(srv)
        return fake, srv

    yield make
    for s in started:
        s.stop()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _chat(base: str, sid: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"{base}/s/{sid}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def _wait(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_each_upstream_is_asked_its_version_and_a_call_carries_its_servers(
    fakes, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    a, sa = fakes("a", "a1")
    b, sb = fakes("b", "b7")
    c, sc = fakes("c", None)  # no dev mode: asked once, then never again; its calls say nothing
    proxy = proxy_factory(
        sa.url + "/v1",
        sqlite_url,
        fleet=(sb.url + "/v1", sc.url + "/v1"),
        mode="passthrough",
        route="round-robin",
        policy_refresh=0.05,
    )
    urls = {"a": sa.url + "/v1", "b": sb.url + "/v1", "c": sc.url + "/v1"}

    def versions() -> dict[str, str | None]:
        servers = _get(proxy.url + "/v1/orchard/policy")["servers"]
        return {s["url"]: s["version"] for s in servers}

    _wait(lambda: versions() == {urls["a"]: "a1", urls["b"]: "b7", urls["c"]: None})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for k in range(6):
        assert _chat(proxy.url, f"s{k}", body)[0] == 200
    a.version = "a2"  # server a alone is updated
    _wait(lambda: versions()[urls["a"]] == "a2")
    for k in range(6):
        assert _chat(proxy.url, f"t{k}", body)[0] == 200
    proxy.flush()
    calls = proxy.store().calls()
    assert len(calls) == 12 and a.chats == b.chats == c.chats == 4
    want = {"s": {urls["a"]: "a1", urls["b"]: "b7"}, "t": {urls["a"]: "a2", urls["b"]: "b7"}}
    for call in calls:
        server = call.metadata["upstream"]
        if server == urls["c"]:
            assert "policy" not in call.metadata  # its server says no version: none is guessed
            continue
        v = want[call.session_id[0]][server]
        assert call.metadata["policy"] == {"sent": v, "done": v}, (call.session_id, server)
    assert c.polls == 1 and a.polls >= 2 and b.polls >= 2  # c's 404: not asked again
    health = _get(proxy.url + "/healthz")["policy"]
    assert health["version"] == "a2" and [s["version"] for s in health["servers"]] == ["a2", "b7", None]


def _tito(fakes, proxy_factory, sqlite_url, hf_tokenizer):  # type: ignore[no-untyped-def]
    """Two fakes armed alike, a tito proxy over both; ``(fakes, servers, proxy, first, rest)``."""
    eos = hf_tokenizer.eos_token_id
    first = hf_tokenizer.encode("The answer", add_special_tokens=False)
    rest = [*hf_tokenizer.encode(" is four.", add_special_tokens=False), eos]
    pair = [fakes("a", "a1"), fakes("b", "b1")]
    for fake, _ in pair:
        fake.abort = (first, rest, fake.name + "2", 0.4)
    proxy = proxy_factory(
        pair[0][1].url + "/v1",
        sqlite_url,
        fleet=(pair[1][1].url + "/v1",),
        mode="tito",
        tokenizer="demo",
        tito_endpoint="generate",
        policy_refresh=0,
        health_interval=60,  # ejected only passively: by the refused continuation
    )
    return [f for f, _ in pair], [s for _, s in pair], proxy, first, rest


BODY = {"model": "m", "messages": [{"role": "user", "content": "what is two and two"}], "max_tokens": 64}


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_an_aborted_generation_goes_on_on_the_server_that_ran_it(
    fakes, proxy_factory, sqlite_url, hf_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    pair, servers, proxy, first, rest = _tito(fakes, proxy_factory, sqlite_url, hf_tokenizer)
    status, out = _chat(proxy.url, "abort-home", BODY)
    assert status == 200 and json.loads(out)["choices"][0]["message"]["content"] == "The answer is four."
    ran = [f for f in pair if f.generated]
    assert len(ran) == 1  # both parts on the one server
    [fake] = ran
    whole, cont = fake.generated
    assert cont["_at"] >= fake.paused_until  # after it said it resumed
    assert cont["token_ids"] == whole["token_ids"] + first
    assert cont["sampling_params"]["max_tokens"] == 64 - len(first)
    proxy.flush()
    [call] = proxy.store().calls("abort-home")
    assert call.metadata["upstream"] == servers[pair.index(fake)].url + "/v1"
    n = len(first)
    assert call.completion_ids == (*first, *rest)
    v = fake.name
    assert call.policy_versions == ((v + "1", 0, n), (v + "2", n, n + len(rest)))
    assert call.metadata["tito"]["parts"] == [
        {"tokens": n, "finish": "abort"},
        {"tokens": len(rest), "finish": "stop"},
    ]


def test_an_aborted_generation_whose_server_is_gone_goes_on_on_another(
    fakes, proxy_factory, sqlite_url, hf_tokenizer
) -> None:  # type: ignore[no-untyped-def]
    pair, servers, proxy, first, rest = _tito(fakes, proxy_factory, sqlite_url, hf_tokenizer)
    got: list[tuple[int, bytes]] = []
    t = threading.Thread(target=lambda: got.append(_chat(proxy.url, "abort-gone", BODY)))
    t.start()
    _wait(lambda: any(f.aborted.is_set() for f in pair))
    k = next(i for i, f in enumerate(pair) if f.aborted.is_set())
    servers[k].stop()  # paused for the update, and then gone
    t.join(30)
    [(status, out)] = got
    assert status == 200 and json.loads(out)["choices"][0]["message"]["content"] == "The answer is four."
    gone, other = pair[k], pair[1 - k]
    [whole] = gone.generated
    [cont] = other.generated  # the rest, on the survivor, from the exact ids so far
    assert cont["token_ids"] == whole["token_ids"] + first
    assert cont["sampling_params"]["max_tokens"] == 64 - len(first)
    proxy.flush()
    [call] = proxy.store().calls("abort-gone")
    there = servers[1 - k].url + "/v1"
    assert call.metadata["upstream"] == there  # the server of the last part
    n = len(first)
    assert call.completion_ids == (*first, *rest)
    # each part's versions from the server that generated it
    assert call.policy_versions == ((gone.name + "1", 0, n), (other.name + "1", n, n + len(rest)))
    assert call.metadata["tito"]["parts"] == [
        {"tokens": n, "finish": "abort"},
        {"tokens": len(rest), "finish": "stop", "upstream": there},
    ]
    health = _get(proxy.url + "/healthz")
    assert [u["healthy"] for u in health["upstreams"]] == [k != 0, k != 1]  # the gone one ejected


def test_an_aborted_generation_with_no_server_left_fails_in_the_clients_dialect(
    fakes, proxy_factory, sqlite_url, hf_tokenizer, caplog
) -> None:  # type: ignore[no-untyped-def]
    pair, servers, proxy, _first, _rest = _tito(fakes, proxy_factory, sqlite_url, hf_tokenizer)
    got: list[Any] = []

    def call() -> None:
        try:
            got.append(_chat(proxy.url, "abort-none", BODY))
        except urllib.error.HTTPError as e:
            got.append((e.code, json.loads(e.read())))

    t = threading.Thread(target=call)
    t.start()
    _wait(lambda: any(f.aborted.is_set() for f in pair))
    for s in servers:
        s.stop()  # every server gone while paused
    t.join(30)
    [(status, err)] = got
    assert status == 502 and "unreachable" in err["error"]["message"]
    proxy.flush()
    [call_] = proxy.store().calls("abort-none")  # recorded (not left in the spool), as failed
    assert call_.outcome.value == "failed" and call_.status_code == 502
    assert "database write failed" not in caplog.text


def test_a_tito_call_whose_only_server_is_down_is_recorded(proxy_factory, sqlite_url, caplog) -> None:  # type: ignore[no-untyped-def]
    """Its request to the token endpoint (holding the prompt's ids) is recorded with the failure."""
    from factories import free_port

    proxy = proxy_factory(f"http://127.0.0.1:{free_port()}/v1", sqlite_url, mode="tito", tokenizer="demo")
    try:
        _chat(proxy.url, "down", BODY)
    except urllib.error.HTTPError as e:
        assert e.code == 502
    proxy.flush()
    [call] = proxy.store().calls("down")
    assert call.status_code == 502 and call.upstream_request["prompt"]
    assert "database write failed" not in caplog.text
