"""Asynchronous RL against a real vLLM's own RL endpoints (issue 38): the test plays the trainer.

One vLLM for the module, started with ``VLLM_SERVER_DEV_MODE=1 --enable-scale-out`` (``/pause``,
``/resume``, ``/update_weight_version``, ``/weight_info``, ``/inference/v1/generate``) on a tiny
random Qwen2 whose turns rarely end on their own (so a generation is still running when the
trainer pauses it). Generation progress is read from vLLM's own ``/metrics``.

- tito: the spans recorded equal the ``weight_versions`` vLLM answered (``pause(keep)`` ->
  ``update_weight_version`` -> ``resume`` mid-generation and between turns); an abort
  (``pause(abort)``) is continued after ``/resume``, one answer to the client, exact ids, the
  versions split where vLLM split them; exports carry the versions, staleness masks exactly the
  stale tokens.
- token mode: fences (the trainer tells the proxy too) are right, a straddle is ``unknown``; an
  abort the client saw is recorded as such and kept out of samples unless ``--aborted keep``.
- ``--cache-salt policy``: vLLM accepts ``cache_salt``, and a new version's salt misses the prefix
  cache the old one filled (``vllm:prefix_cache_hits`` from ``/metrics``).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from typer.testing import CliRunner

from orchard_rec import rlwire
from orchard_rec.cli import app as cli_app
from orchard_rec.demo.tokenizer import save_tokenizer
from orchard_rec.exporters import read_jsonl
from orchard_rec.policy import UNKNOWN

from .conftest import HERE, VENV, Tap, VLLMServer, _served, _tap_on, _vllm_process

MODEL_NAME = "tiny-qwen2-rl"


_NEVER_ENDS = """
import json, sys
sys.path.insert(0, {here!r})
from model import build_model
from safetensors.torch import load_file, save_file
build_model({d!r})
w = load_file({d!r} + "/model.safetensors")
eos = json.load(open({d!r} + "/generation_config.json"))["eos_token_id"]
w["lm_head.weight"][eos] = -w["lm_head.weight"][eos]  # its logit far below every other: turns run to max_tokens
save_file(w, {d!r} + "/model.safetensors", metadata={{"format": "pt"}})
"""
"""The test model, whose turns never end on their own: a generation is long enough (vLLM on CPU
samples this model at ~2,500 tokens/s) for the trainer to pause it in the middle."""

LONG = 2500
"""Tokens of a generation the trainer interrupts (~1 s)."""


@pytest.fixture(scope="module")
def rl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    running = os.environ.get("ORCHARD_VLLM_RL_URL")  # "http://HOST:PORT;MODEL_DIR" while developing
    if running:
        url, _, folder = running.partition(";")
        yield _served(url, Path(folder), 0.0)
        return
    subprocess.run(["bash", str(HERE / "install.sh"), str(VENV)], check=True)
    model_dir = tmp_path_factory.mktemp("rl-model")
    save_tokenizer(model_dir)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(VENV / "bin" / "python"), "-c", _NEVER_ENDS.format(here=str(HERE), d=str(model_dir))],
        check=True,
        env=env,
    )
    args = ["--max-model-len", "8192", "--enable-scale-out"]
    old = os.environ.get("VLLM_SERVER_DEV_MODE")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    try:
        with _vllm_process(model_dir, MODEL_NAME, args, model_dir) as (url, startup):
            yield _served(url, model_dir, startup)
    finally:
        if old is None:
            os.environ.pop("VLLM_SERVER_DEV_MODE", None)
        else:
            os.environ["VLLM_SERVER_DEV_MODE"] = old


@pytest.fixture
def rl_tap(rl_server: VLLMServer) -> Iterator[Tap]:
    with _tap_on(rl_server) as t:
        yield t


# -- the trainer ---------------------------------------------------------------------------------


def _root(server: VLLMServer) -> str:
    return rlwire.server_root(server.url)


def _trainer(server: VLLMServer, *steps: tuple[str, Any]) -> None:
    """The trainer's calls to vLLM, in order, through ``rlwire`` (``pause`` with its mode,
    ``update`` with a version, ``resume``)."""

    async def run() -> None:
        async with aiohttp.ClientSession() as s:
            for what, arg in steps:
                if what == "pause":
                    await rlwire.pause(s, _root(server), arg)
                elif what == "update":
                    await rlwire.update_weight_version(s, _root(server), arg)
                elif what == "resume":
                    await rlwire.resume(s, _root(server))
                elif what == "sleep":
                    await asyncio.sleep(arg)

    asyncio.run(run())


def _metric(server: VLLMServer, name: str) -> float:
    with urllib.request.urlopen(_root(server) + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    )


def _when_generating(server: VLLMServer, before: float, n: int = 40, timeout: float = 120) -> None:
    """Return once vLLM generated ``n`` more tokens than ``before`` (its own counter)."""
    deadline = time.monotonic() + timeout
    while _metric(server, "vllm:generation_tokens_total") < before + n:
        assert time.monotonic() < deadline, "vLLM generated nothing"
        time.sleep(0.02)


def _post(url: str, body: dict[str, Any], timeout: float = 300) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class _Call(threading.Thread):
    """A client call running while the trainer acts."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.result: tuple[int, bytes] | None = None

    def run(self) -> None:
        self.result = _post(self.url, self.body)

    def answer(self) -> tuple[int, bytes]:
        self.join(300)
        assert self.result is not None, "the call did not finish"
        return self.result


def _chat(messages: list[dict[str, Any]], max_tokens: int, stream: bool = False, **kw: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": stream,
        "seed": 1,
        **kw,
    }


def _client_text(raw: bytes, stream: bool) -> tuple[str, str | None]:
    """(content, finish_reason) the client got."""
    if not stream:
        c = orjson.loads(raw)["choices"][0]
        return c["message"].get("content") or "", c["finish_reason"]
    text, finish = "", None
    for line in raw.split(b"\n"):
        if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
            for c in orjson.loads(line[6:]).get("choices") or ():
                text += (c.get("delta") or {}).get("content") or ""
                finish = c.get("finish_reason") or finish
    return text, finish


def _spans(choice: dict[str, Any]) -> tuple[tuple[str, int, int], ...]:
    return tuple((s["version"], s["start"], s["end"]) for s in choice["weight_versions"])


# -- tito: vLLM's own spans ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_tito_records_vllms_spans_across_keep_and_abort(
    rl_server, rl_tap, proxy_factory, sqlite_url, tmp_path, stream
) -> None:  # type: ignore[no-untyped-def]
    srv = rl_server
    proxy = proxy_factory(
        rl_tap.url,
        sqlite_url,
        mode="tito",
        tokenizer=str(srv.model_dir),
        tito_endpoint="generate",
        policy_refresh=0.2,
    )
    url = f"{proxy.url}/s/rl-{stream}/v1/chat/completions"
    numbers = iter(range(1, 100))  # versions s<stream>-1 < s<stream>-2 < ...

    def version() -> str:
        return f"s{stream:d}-{next(numbers)}"

    def generations() -> list[Any]:
        return [e for e in rl_tap.log if e.path == "/inference/v1/generate"]

    now = version()
    _trainer(srv, ("update", now))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Tell me a long story."}]
    # A random tiny model ends its turn on its own now and then, at times before the trainer's act
    # lands: each turn is tried again (the same messages: a fork of the session) until it does.

    # turn 1: pause(keep) -> update -> resume while it generates
    calls_made = 0
    for _ in range(4):
        seen = len(generations())
        before = _metric(srv, "vllm:generation_tokens_total")
        call = _Call(url, _chat(messages, LONG, stream))
        call.start()
        _when_generating(srv, before)
        was, now = now, version()
        _trainer(srv, ("pause", "keep"), ("update", now), ("resume", None))
        status, raw = call.answer()
        calls_made += 1
        assert status == 200, raw
        new = generations()[seen:]
        assert len(new) == 1, len(new)
        if len(new[0].json()["choices"][0]["weight_versions"]) == 2:
            break
    c1 = new[0].json()["choices"][0]
    assert [sp[0] for sp in _spans(c1)] == [was, now], _spans(c1)
    first_index = calls_made - 1
    text1, _ = _client_text(raw, stream)
    messages += [{"role": "assistant", "content": text1}, {"role": "user", "content": "Go on."}]

    # between turns: an update while nothing runs
    now = version()
    _trainer(srv, ("pause", "keep"), ("update", now), ("resume", None))

    # turn 2: pause(abort) -> update -> resume while it generates: continued, one answer
    for _ in range(4):
        seen = len(generations())
        before = _metric(srv, "vllm:generation_tokens_total")
        call = _Call(url, _chat(messages, LONG, stream))
        call.start()
        _when_generating(srv, before)
        was, now = now, version()
        _trainer(srv, ("pause", "abort"), ("sleep", 0.3), ("update", now), ("resume", None))
        status, raw = call.answer()
        calls_made += 1
        assert status == 200, raw
        new = generations()[seen:]
        if new[0].json()["choices"][0]["finish_reason"] == "abort":
            break
    text2, finish2 = _client_text(raw, stream)

    proxy.flush()
    calls = proxy.store().calls(f"rl-{stream}")
    assert len(calls) == calls_made
    first, second = calls[first_index], calls[-1]
    assert len(new) == 2, [g.json()["choices"][0]["finish_reason"] for g in new]
    # turn 1: exactly vLLM's spans, the update inside the generation
    assert first.policy_versions == _spans(c1)
    assert list(first.completion_ids or ()) == c1["token_ids"]
    # turn 2: two parts; the second sent from prompt + the first part's tokens
    a, b = new[0].json()["choices"][0], new[1].json()["choices"][0]
    assert a["finish_reason"] == "abort" and b["finish_reason"] != "abort"
    assert new[1].request["token_ids"] == new[0].request["token_ids"] + a["token_ids"]
    assert list(second.completion_ids or ()) == a["token_ids"] + b["token_ids"]
    k = len(a["token_ids"])
    assert _spans(a) == ((was, 0, k),) and _spans(b) == ((now, 0, len(b["token_ids"])),)
    assert second.policy_versions == ((was, 0, k), (now, k, k + len(b["token_ids"])))
    assert second.metadata["tito"]["parts"][0] == {"tokens": k, "finish": "abort"}
    assert second.finish_reason == finish2 == ("length" if b["finish_reason"] == "length" else "stop")
    assert "abort" not in raw.decode()  # the client saw one answer, never the abort
    assert text2  # one answer over both parts (its text is the decoded ids: tito's own tests)

    # every export carries the versions; staleness masks exactly the stale tokens
    out = tmp_path / "s.jsonl"
    r = CliRunner().invoke(
        cli_app, ["export", "--db", sqlite_url, "--out", str(out), "--session", f"rl-{stream}"]
    )
    assert r.exit_code == 0, r.output
    # the sample holding the second call: its tokens carry the recorded spans of the calls in it. A
    # retried turn is a fork of the session, a sample of its own whose earlier turns are its prompt
    # (and a retry that generated what the turn's first try did continues either): turn 1's versions
    # are in it when turn 1's kept call is.
    [sample] = [x for x in read_jsonl(out) if second.call_id in x.metadata["call_ids"]]
    per = sample.versions_per_token()
    held = [c for c in calls if c.call_id in sample.metadata["call_ids"]]
    assert per is not None and {x for x in per if x is not None} == {
        sp[0] for c in held for sp in (c.policy_versions or ())
    }
    assert {was, now} <= set(per)
    if first.call_id in sample.metadata["call_ids"]:
        assert {sp[0] for sp in _spans(c1)} <= set(per)
    top = int(now.rsplit("-", 1)[1])  # the trainer's V; K = 0: versions below V are stale
    r = CliRunner().invoke(
        cli_app,
        ["export", "--db", sqlite_url, "--out", str(tmp_path / "m.jsonl"), "--session", f"rl-{stream}",
         "--policy-version", str(top), "--max-staleness", "0", "--stale", "mask"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    [masked] = [x for x in read_jsonl(tmp_path / "m.jsonl") if second.call_id in x.metadata["call_ids"]]
    stale = [i for i, x in enumerate(per) if x is not None and int(x.rsplit("-", 1)[1]) < top]
    assert stale and all(masked.loss_mask[i] == 0 for i in stale)
    assert [i for i, (m0, m1) in enumerate(zip(sample.loss_mask, masked.loss_mask)) if m0 != m1] == stale
    if calls_made == 2:  # no retried turn: this one sample is all the export holds
        assert f"{len(stale)} tokens masked in 1 samples" in r.output


# -- token mode: fences --------------------------------------------------------------------------


def test_token_mode_fences_and_aborts(rl_server, rl_tap, proxy_factory, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    srv = rl_server
    proxy = proxy_factory(rl_tap.url, sqlite_url, mode="token", policy_refresh=0.2)
    url = f"{proxy.url}/s/fence/v1/chat/completions"
    tell = f"{proxy.url}/v1/orchard/policy"

    def update(version: str, mode: str = "keep") -> None:
        # the exact way: the proxy hears of the new weights before any token of them is sampled
        _trainer(srv, ("pause", mode), ("update", version))
        assert _post(tell, {"version": version})[0] == 200
        _trainer(srv, ("resume", None))

    update("t5")
    messages = [{"role": "user", "content": "Count to one hundred."}]
    status, raw = _post(url, _chat(messages, 20, stream=True))
    assert status == 200
    # A random tiny model ends its turn on its own now and then, at times before the trainer's act:
    # each act is tried again (a new call) until it lands while the call is still generating.
    straddle_tries, version = 0, "t5"
    for k in range(4):
        straddle_tries += 1
        before = _metric(srv, "vllm:generation_tokens_total")
        call = _Call(url, _chat(messages, LONG, stream=True))
        call.start()
        _when_generating(srv, before)
        version = f"t{6 + k}"
        update(version)
        landed = call.is_alive()  # still streaming once the update was done: it straddled it
        assert call.answer()[0] == 200
        if landed:
            break
    assert landed, "every long generation ended before the update"
    status, raw = _post(url, _chat(messages, 20, stream=False))
    assert status == 200
    abort_tries = 0
    for _ in range(4):
        abort_tries += 1
        before = _metric(srv, "vllm:generation_tokens_total")
        call = _Call(url, _chat(messages, LONG, stream=True))
        call.start()
        _when_generating(srv, before)
        _trainer(srv, ("pause", "abort"))
        status, raw = call.answer()
        _trainer(srv, ("resume", None))
        assert status == 200
        if _client_text(raw, True)[1] == "abort":  # the client saw the abort
            break
    assert _client_text(raw, True)[1] == "abort", "every long generation ended before the pause"

    proxy.flush()
    calls = proxy.store().calls("fence")
    assert len(calls) == 1 + straddle_tries + 1 + abort_tries
    plain, straddle, after, aborted = calls[0], calls[straddle_tries], calls[straddle_tries + 1], calls[-1]
    n = len(plain.completion_ids or ())
    assert n and plain.policy_versions == (("t5", 0, n),)
    m = len(straddle.completion_ids or ())
    assert straddle.policy_versions == ((UNKNOWN, 0, m),)  # the boundary is not known: never a guess
    previous = "t5" if straddle_tries == 1 else f"t{4 + straddle_tries}"
    assert straddle.metadata["policy"] == {"sent": previous, "done": version}
    assert after.policy_versions == ((version, 0, len(after.completion_ids or ())),)
    assert aborted.finish_reason == "abort" and 0 < len(aborted.completion_ids or ()) < LONG
    assert aborted.policy_versions == ((version, 0, len(aborted.completion_ids or ())),)

    out = tmp_path / "f.jsonl"
    r = CliRunner().invoke(cli_app, ["export", "--db", sqlite_url, "--out", str(out), "--session", "fence"])
    assert r.exit_code == 0, r.output
    kept_calls = [c for s in read_jsonl(out) for c in s.metadata["call_ids"]]
    assert aborted.call_id not in kept_calls and straddle.call_id in kept_calls
    r = CliRunner().invoke(
        cli_app, ["export", "--db", sqlite_url, "--out", str(out), "--session", "fence", "--aborted", "keep"]
    )
    assert aborted.call_id in [c for s in read_jsonl(out) for c in s.metadata["call_ids"]]


# -- cache salt ------------------------------------------------------------------------------------


def test_cache_salt_misses_the_prefix_cache_of_older_weights(
    rl_server, rl_tap, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    srv = rl_server
    proxy = proxy_factory(rl_tap.url, sqlite_url, mode="token", policy_refresh=0, cache_salt="policy")
    url = f"{proxy.url}/s/salt/v1/chat/completions"
    long_system = " ".join(f"rule {k}: be concise." for k in range(60))  # many cache blocks
    messages = [{"role": "system", "content": long_system}, {"role": "user", "content": "hi"}]

    def hits_of_one_call() -> float:
        before = _metric(srv, "vllm:prefix_cache_hits_total")
        status, raw = _post(url, _chat(messages, 2))
        assert status == 200, raw  # vLLM accepted the cache_salt
        return _metric(srv, "vllm:prefix_cache_hits_total") - before

    _post(f"{proxy.url}/v1/orchard/policy", {"version": "c1"})
    hits_of_one_call()  # fills the cache under salt c1
    assert hits_of_one_call() > 0  # same weights, same salt: the prefix is reused
    _post(f"{proxy.url}/v1/orchard/policy", {"version": "c2"})
    assert hits_of_one_call() == 0  # new weights: nothing computed by c1 is reused
    sent = [e.request.get("cache_salt") for e in rl_tap.log if e.path == "/v1/chat/completions"]
    assert sent == ["c1", "c1", "c2"]
