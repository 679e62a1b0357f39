"""Token and passthrough modes fence each call with the policy version the proxy knows
(``proxy.versions``): told by the trainer (``POST /v1/orchard/policy``) or a call's header.
A call that straddled an update gets one ``unknown`` span, never a guess."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

from orchard_rec.policy import UNKNOWN


@dataclass
class _Answer:
    status_code: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> _Answer:
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return _Answer(r.status, r.read())
    except urllib.error.HTTPError as e:
        return _Answer(e.code, e.read())


def _chat(url: str, content: str, *, stream: bool = False, headers: dict[str, str] | None = None) -> _Answer:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": 8,
    }
    return _http(f"{url}/s/run-1/v1/chat/completions", json.dumps(body).encode(), headers)


def _policy(url: str, version: object, headers: dict[str, str] | None = None) -> _Answer:
    return _http(f"{url}/v1/orchard/policy", json.dumps({"version": version}).encode(), headers)


@pytest.mark.parametrize(
    ("mode", "writer"), [("token", "thread"), ("passthrough", "thread"), ("token", "process")]
)
def test_calls_carry_the_version_the_trainer_set(upstream, proxy_factory, sqlite_url, mode, writer) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode=mode, policy_refresh=0, db_writer=writer)
    assert _chat(proxy.url, "before any version").status_code == 200
    assert _policy(proxy.url, "v1").json()["version"] == "v1"
    assert _chat(proxy.url, "hello").status_code == 200
    r = _chat(proxy.url, "by header", headers={"X-Orchard-Policy-Version": "v2"})
    assert r.status_code == 200
    assert _http(f"{proxy.url}/healthz").json()["policy"]["version"] == "v2"
    assert _http(f"{proxy.url}/v1/orchard/policy").json() == {
        "version": "v2",
        "source": "header",
        "learned_at": pytest.approx(time.time(), abs=60),
    }
    proxy.flush()
    calls = proxy.store().calls("run-1")
    assert calls[0].policy_versions is None  # nothing known: nothing said
    for c, v in zip(calls[1:], ["v1", "v2"], strict=True):
        if mode == "token":  # the spans say it all
            assert c.policy_versions == ((v, 0, len(c.completion_ids or ())),)
            assert "policy" not in c.metadata
        else:  # no ids yet: the fence, for reconstruction to put over the template's ids
            assert c.policy_versions is None and c.metadata["policy"] == {"sent": v, "done": v}
    # the header is the proxy's, not the server's
    assert all("x-orchard-policy-version" not in h for h in upstream.fake.headers)


@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_a_stream_that_straddles_an_update_is_unknown(upstream_factory, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(chunk_delay=0.05)
    proxy = proxy_factory(up.url, sqlite_url, mode="token", policy_refresh=0)
    _policy(proxy.url, 3)
    t = threading.Timer(0.15, _policy, (proxy.url, 4))
    t.start()
    r = _chat(proxy.url, "a long answer please", stream=True)
    t.join()
    assert r.status_code == 200
    proxy.flush()
    [c] = proxy.store().calls("run-1")
    n = len(c.completion_ids or ())
    assert n > 0
    assert c.policy_versions == ((UNKNOWN, 0, n),)
    assert c.metadata["policy"] == {"sent": "3", "done": "4"}


def test_the_policy_route_refuses_bad_bodies_and_needs_the_admin_key(
    upstream, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, policy_refresh=0, api_keys=("k",), admin_keys=("adm",))
    assert _policy(proxy.url, "v1").status_code == 401
    h = {"Authorization": "Bearer adm"}
    for bad in (b"nope", b"[]", b'{"version": ""}', b'{"version": true}', b'{"v": 1}'):
        r = _http(f"{proxy.url}/v1/orchard/policy", bad, h)
        assert r.status_code == 400 and "error" in r.json(), bad
    ok = _policy(proxy.url, 7, h)
    assert ok.json()["version"] == "7"


def _messages(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


@pytest.mark.slow  # 1-2.6 s of the fast tier (measured 2026-12-06)
@pytest.mark.parametrize("stream", [False, True])
def test_tito_records_the_servers_spans_and_continues_an_abort(
    upstream, proxy_factory, sqlite_url, stream
) -> None:  # type: ignore[no-untyped-def]
    """vLLM's ``/inference/v1/generate`` reports ``weight_versions``; an answer aborted for an
    update (``finish_reason: abort``) is continued from prompt + tokens so far, and the client
    gets one answer."""
    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo", tito_endpoint="generate")
    body = {"model": "m", "messages": _messages("hello there"), "stream": stream, "max_tokens": 64}
    upstream.fake.weight_version = "v1"
    assert _http(f"{proxy.url}/s/run-1/v1/chat/completions", json.dumps(body).encode()).status_code == 200
    upstream.fake.abort_next = (2, "v2")
    r = _http(f"{proxy.url}/s/run-1/v1/chat/completions", json.dumps(body).encode())
    assert r.status_code == 200
    proxy.flush()
    first, cont = proxy.store().calls("run-1")
    n = len(first.completion_ids or ())
    assert first.policy_versions == (("v1", 0, n),)
    m = len(cont.completion_ids or ())
    assert m > 2 and cont.policy_versions == (("v1", 0, 2), ("v2", 2, m))
    assert cont.metadata["tito"]["parts"] == [
        {"tokens": 2, "finish": "abort"},
        {"tokens": m - 2, "finish": "stop"},
    ]
    assert cont.finish_reason == "stop"
    assert len(cont.completion_logprobs or ()) == m
    sent = [b for p, b in upstream.fake.log if p == "/inference/v1/generate"]
    assert sent[-1]["token_ids"] == list(cont.prompt_ids) + list((cont.completion_ids or ())[:2])
    assert sent[-1]["sampling_params"]["max_tokens"] == 62
    text = r.body.decode()
    assert "abort" not in text  # one uninterrupted answer


@pytest.mark.parametrize("mode", ["token", "tito"])
def test_cache_salt_policy_sends_the_version_as_cache_salt(upstream, proxy_factory, sqlite_url, mode) -> None:  # type: ignore[no-untyped-def]
    extra = {"tokenizer": "demo"} if mode == "tito" else {}
    proxy = proxy_factory(upstream.url, sqlite_url, mode=mode, policy_refresh=0, cache_salt="policy", **extra)
    assert _chat(proxy.url, "no version yet").status_code == 200
    _policy(proxy.url, "step/7")  # vLLM refuses '/' in a salt: it becomes '_'
    assert _chat(proxy.url, "salted").status_code == 200
    own = {"model": "m", "messages": _messages("own salt"), "max_tokens": 4, "cache_salt": "mine"}
    assert _http(f"{proxy.url}/s/run-1/v1/chat/completions", json.dumps(own).encode()).status_code == 200
    salts = [
        b.get("cache_salt") for p, b in upstream.fake.log if p in ("/v1/chat/completions", "/v1/completions")
    ]
    assert salts == [None, "step_7", "mine"]
    proxy.flush()
    calls = proxy.store().calls("run-1")
    assert "cache_salt" not in calls[1].request  # the client did not send it
    if mode == "token":
        assert calls[1].upstream_request["cache_salt"] == "step_7"
        assert b"cache_salt" not in upstream.fake.sent[1]  # the server does not echo it: nothing to strip


def test_cache_salt_is_off_by_default(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="token", policy_refresh=0)
    _policy(proxy.url, "v1")
    assert _chat(proxy.url, "hello").status_code == 200
    assert all("cache_salt" not in b for _, b in upstream.fake.log)


def test_the_header_moves_the_version_only_for_a_trusted_caller(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, policy_refresh=0, api_keys=("k",), admin_keys=("adm",))
    adm = {"Authorization": "Bearer adm"}
    _policy(proxy.url, "v1", adm)
    r = _chat(proxy.url, "hello", headers={"Authorization": "Bearer k", "X-Orchard-Policy-Version": "v9"})
    assert r.status_code == 200
    assert (
        _http(f"{proxy.url}/v1/orchard/policy", headers=adm).json()["version"] == "v1"
    )  # a client's word is not the trainer's


def test_tito_with_sglang_records_its_weight_version(upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(upstream.url, sqlite_url, mode="tito", tokenizer="demo", upstream_kind="sglang")
    upstream.fake.weight_version = "12"
    assert _chat(proxy.url, "hello").status_code == 200
    proxy.flush()
    [c] = proxy.store().calls("run-1")
    assert c.policy_versions == (("12", 0, len(c.completion_ids or ())),)
