"""The intercept door's override servers, as ``serve`` has them (``intercept.servers``).

- ``--upstream-override`` repeated is a fleet (``proxy.fleet.Fleet``): a session's calls stay on
  its server, and a server that refuses connections is ejected, the next calls going elsewhere;
- ``--cache-salt policy`` sends the policy version in force as ``cache_salt`` (told by a call's
  ``X-Orchard-Policy-Version`` or polled from ``/weight_info``), and each call is fenced with it;
- tito continues a generation the server aborted for a weight update (``proxy.partial``): the
  client gets one answer, the record holds both parts and their versions;
- ``--routing-header`` and ``--routed-experts`` as ``serve``'s.

The clients are the real openai SDK, configured only through ``HTTPS_PROXY`` and mitmproxy's CA.
"""

from __future__ import annotations

import time

import openai
import pytest
from proxy import test_routed_experts as moe

from orchard_rec import routing
from orchard_rec.proxy.fleet import Fleet
from orchard_rec.storage import Store

pytestmark = [pytest.mark.slow, pytest.mark.network]  # mitmproxy runtimes in subprocesses

moe_upstream = moe.moe_upstream  # the demo server answering vLLM's routed_experts (a fixture)

CHAT_PATHS = ("/v1/chat/completions", "/v1/completions")


def _client(session: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="sk-x", max_retries=0, default_headers={"X-Orchard-Session": session, **headers}
    )


def _ask(client: openai.OpenAI, text: str, **extra: object) -> str:
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=16, **extra
    )
    return r.choices[0].message.content or ""


def _salts(fake) -> list[object]:  # type: ignore[no-untyped-def]
    return [b.get("cache_salt") for p, b in fake.log if p in CHAT_PATHS]


@pytest.mark.parametrize("mode", ["token", "tito"])
def test_cache_salt_policy_sends_the_version_a_call_says(
    upstream, intercept_factory, via, tmp_path, mode
) -> None:  # type: ignore[no-untyped-def]
    """No version known: no salt; once a call says ``X-Orchard-Policy-Version`` it is the salt
    (``/`` becomes ``_``, as vLLM needs) and the call's fence; a client's own salt is kept."""
    db = f"sqlite:///{tmp_path / 'salt.db'}"
    args = [
        "--upstream-override",
        upstream.url,
        "--mode",
        mode,
        "--cache-salt",
        "policy",
        "--policy-refresh",
        "0",
    ]
    it = intercept_factory(db, *args, *(["--tokenizer", "demo"] if mode == "tito" else []))
    via(it)
    _ask(_client("salt"), "no version yet")
    _ask(_client("salt", **{"X-Orchard-Policy-Version": "step/7"}), "salted")
    _ask(_client("salt"), "own salt", extra_body={"cache_salt": "mine"})
    assert _salts(upstream.fake) == [None, "step_7", "mine"]
    assert it.stop() == 0
    calls = Store(db).calls("salt")
    assert len(calls) == 3 and "cache_salt" not in calls[1].request  # the client did not send it
    n = len(calls[1].completion_ids or ())
    assert calls[1].policy_versions == (("step/7", 0, n),)
    assert all("x-orchard-policy-version" not in h for h in upstream.fake.headers)  # not sent on


def test_cache_salt_follows_the_version_the_server_reports(
    upstream, intercept_factory, via, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    upstream.fake.weight_version = "v3"
    db = f"sqlite:///{tmp_path / 'poll.db'}"
    it = intercept_factory(
        db, "--upstream-override", upstream.url, "--cache-salt", "policy", "--policy-refresh", "0.05"
    )
    via(it)
    time.sleep(0.5)  # a few polls of /weight_info
    _ask(_client("poll"), "hello")
    assert _salts(upstream.fake) == ["v3"]


def test_cache_salt_is_off_by_default(upstream, intercept_factory, via, tmp_path) -> None:  # type: ignore[no-untyped-def]
    it = intercept_factory(f"sqlite:///{tmp_path / 'off.db'}", "--upstream-override", upstream.url)
    via(it)
    _ask(_client("off", **{"X-Orchard-Policy-Version": "v1"}), "hello")
    assert _salts(upstream.fake) == [None]


def _sessions_on_both(urls: list[str], each: int) -> dict[str, str]:
    """Session ids and each one's home server on the ring: ``each`` on every server."""
    ring = Fleet(urls)
    homes: dict[str, str] = {}
    for i in range(10_000):
        home = ring.home(f"fleet-{i}").url
        if sum(1 for h in homes.values() if h == home) < each:
            homes[f"fleet-{i}"] = home
        if len(homes) == each * len(urls):
            return homes
    raise AssertionError("the ring puts no session on some server")


def test_a_fleet_keeps_each_session_on_its_server_and_ejects_a_dead_one(
    upstream_factory, intercept_factory, via, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    a, b = upstream_factory(), upstream_factory()
    db = f"sqlite:///{tmp_path / 'fleet.db'}"
    it = intercept_factory(db, "--upstream-override", a.url, "--upstream-override", b.url)
    via(it)
    homes = _sessions_on_both([a.url, b.url], 3)
    for sid in homes:
        for turn in range(2):
            _ask(_client(sid), f"turn {turn}")
    by_url = {a.url: a, b.url: b}
    for url, up in by_url.items():
        mine = sum(1 for h in homes.values() if h == url)
        assert len([p for p, _ in up.fake.log if p in CHAT_PATHS]) == 2 * mine > 0
    b.server.stop()  # b dies: its sessions' next call fails once, then goes to a
    on_b = next(sid for sid, h in homes.items() if h == b.url)
    before = len(a.fake.log)
    with pytest.raises(openai.APIStatusError):
        _ask(_client(on_b), "b is gone")
    _ask(_client(on_b), "again")
    assert len(a.fake.log) == before + 1
    assert it.stop() == 0
    calls = Store(db).calls(on_b)
    assert [c.metadata["intercept"]["upstream"] for c in calls] == [b.url, b.url, b.url, a.url]
    assert calls[2].outcome.value != "ok" and calls[3].outcome.value == "ok"


def test_tito_continues_a_generation_the_server_aborted(upstream, intercept_factory, via, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``/pause?mode=abort`` for a weight update cuts the generation after 2 tokens: intercept
    continues it from prompt + those tokens after ``/resume``, as ``serve`` does."""
    db = f"sqlite:///{tmp_path / 'abort.db'}"
    args = ["--upstream-override", upstream.url, "--mode", "tito", "--tokenizer", "demo"]
    it = intercept_factory(db, *args, "--tito-endpoint", "generate", "--policy-refresh", "0.05")
    via(it)
    upstream.fake.weight_version = "v1"
    time.sleep(0.5)  # the version polled
    client = _client("abort")
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 64}
    client.chat.completions.create(**body)  # type: ignore[call-overload]
    upstream.fake.abort_next = (2, "v2")
    text = client.chat.completions.create(**body).choices[0].message.content  # type: ignore[call-overload]
    assert text and "abort" not in text
    assert it.stop() == 0
    _, cont = Store(db).calls("abort")
    m = len(cont.completion_ids or ())
    assert m > 2 and cont.finish_reason == "stop"
    assert cont.metadata["tito"]["parts"] == [
        {"tokens": 2, "finish": "abort"},
        {"tokens": m - 2, "finish": "stop"},
    ]
    assert cont.policy_versions == (("v1", 0, 2), ("v2", 2, m))
    sent = [b for p, b in upstream.fake.log if p == "/inference/v1/generate"]
    assert sent[-1]["token_ids"] == list(cont.prompt_ids) + list((cont.completion_ids or ())[:2])
    assert sent[-1]["sampling_params"]["max_tokens"] == 62


def test_routing_header_and_routed_experts_as_serve_has_them(
    upstream, moe_upstream, intercept_factory, via, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """``--routing-header`` carries the session id to the server; ``--routed-experts`` records the
    MoE routing the server answered (``orchard_rec.routing``), token mode."""
    db = f"sqlite:///{tmp_path / 'moe.db'}"
    it = intercept_factory(
        db, "--upstream-override", moe_upstream, "--routing-header", "X-SMG-Routing-Key", "--routed-experts"
    )
    via(it)
    _ask(_client("moe"), "hi")
    assert upstream.fake.headers[-1]["x-smg-routing-key"] == "moe"
    assert it.stop() == 0
    [c] = Store(db).calls("moe")
    ids = list(c.prompt_ids or ()) + list(c.completion_ids or ())
    assert routing.unpack(c.routed_experts or b"").to_lists() == moe._experts(ids).tolist()
