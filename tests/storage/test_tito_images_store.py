"""tito with a vision-language model stores what is new in each call (issues 16 and 21).

The upstream body of a tito call with images (vLLM's ``/inference/v1/generate``) holds the whole
context as ``token_ids`` (the recorded, server-expanded prompt with each image run collapsed to
one pad) and every screenshot again as ``content_parts`` data URLs. Stored, the ids are derived
from the recorded prompt and the data URLs are cut into the ``images`` table like the request's,
so a GUI session's bytes per call stay flat; every upstream body comes back exactly as the demo
upstream received it.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson
import pytest
from sqlalchemy import create_engine, text

from orchard_rec.demo.gui import run_gui_agent
from orchard_rec.demo.tokenizer import IMAGE_PAD, build_tokenizer
from orchard_rec.storage import layout

PAD = build_tokenizer().token_to_id(IMAGE_PAD)
VERBS = ("click username", "type orchard", "click sign-in", "scroll down", "click cart")


def _task(actions: int) -> str:
    steps = " then ".join(f"run `{VERBS[k % len(VERBS)]} {k}`" for k in range(actions))
    return f"Work through the shop: {steps}"


def stored_bytes(url: str, session_id: str) -> dict[str, int]:
    """The bytes of the session's ``calls`` rows and its ``blobs`` (images are counted apart)."""
    eng = create_engine(url)
    out = {}
    try:
        with eng.connect() as c:
            for table in ("calls", "blobs"):
                rows = c.execute(text(f"SELECT * FROM {table} WHERE session_id = :s"), {"s": session_id})
                out[table] = sum(_size(v) for row in rows for v in row)
    finally:
        eng.dispose()
    return out


def _size(v: Any) -> int:
    if isinstance(v, (bytes, memoryview)):
        return len(bytes(v))
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, (dict, list)):
        return len(orjson.dumps(v))
    return 0 if v is None else 8


def _session(proxy, up, sid: str, calls: int):  # type: ignore[no-untyped-def]
    """The same 20-call task, stopped after ``calls`` calls: the first 10 calls of both are the same."""
    before = len(up.fake.log)
    run = run_gui_agent(f"{proxy.url}/s/{sid}/v1", task=_task(19), keep=3, max_steps=calls)
    assert len(run.sent) == calls and (calls < 20 or not run.messages[-1].get("tool_calls"))
    sent = [b for p, b in up.fake.log[before:] if p == "/inference/v1/generate"]
    assert len(sent) == calls
    return run, sent


@pytest.mark.slow  # two 10/20-call GUI sessions through tito with a HF tokenizer: ~8 s
def test_a_tito_gui_session_stores_flat_bytes_per_call_and_rebuilds_each_upstream_body(
    upstream_factory, proxy_factory, db_url
) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(vlm=True)
    proxy = proxy_factory(up.url, db_url, mode="tito", tokenizer="demo")
    runs = {}
    for sid, n in (("gui10", 10), ("gui20", 20)):
        runs[sid] = _session(proxy, up, sid, n)
    proxy.flush()
    store = proxy.store()
    try:
        for sid, (run, sent) in runs.items():
            recs = store.calls(sid)
            assert len(recs) == len(sent)
            # every upstream body exactly as the upstream received it
            assert [orjson.dumps(r.upstream_request) for r in recs] == [orjson.dumps(b) for b in sent]
            for r, body, shots in zip(recs, sent, run.sent):
                assert body["token_ids"] == layout.collapse_runs(list(r.prompt_ids or ()), PAD)
                assert [p["url"].split(",", 1)[1] for p in body["content_parts"]] == [
                    base64.b64encode(s).decode() for s in shots
                ]
        # stored as a recipe: the ids a marker on the prompt, the image parts blobs (no base64)
        for how in _recipes(db_url, "gui20"):
            assert how["token_ids"] == ["c", PAD] and how["content_parts"][0] == "b"
        # each distinct screenshot once in `images`
        distinct = {hashlib.sha256(s).hexdigest(): s for run, _ in runs.values() for s in run.shots}
        stats = store.image_stats()
        assert stats["images"] == len(distinct)
        assert stats["bytes"] == sum(len(s) for s in distinct.values())
        b10 = stored_bytes(db_url, "gui10")
        b20 = stored_bytes(db_url, "gui20")
        t10, t20 = sum(b10.values()), sum(b20.values())
        print(f"tito gui: 10 calls {b10} = {t10} B, 20 calls {b20} = {t20} B, ratio {t20 / t10:.2f}")
        # no base64 left in the rows: a few KB per call at most
        for used, n in ((b10, 10), (b20, 20)):
            assert used["calls"] + used["blobs"] < 6_000 * n, used
        assert t20 <= 2.2 * t10, (b10, b20)
    finally:
        store.close()


def _recipes(url: str, session_id: str) -> list[dict[str, list[Any]]]:
    """Each call's stored upstream recipe, as ``{key: [how, value?]}``."""
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            rows = c.execute(
                text("SELECT upstream FROM calls WHERE session_id = :s ORDER BY seq"), {"s": session_id}
            ).all()
    finally:
        eng.dispose()
    out = []
    for (u,) in rows:
        u = orjson.loads(u) if isinstance(u, (str, bytes)) else u
        out.append({e[0]: e[1:] for e in u["k"]})
    return out


@pytest.mark.slow  # the first tito proxy of a process loads transformers: seconds
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_text_tito_upstream_bodies_are_derived_from_the_prompt_ids(
    upstream_factory, proxy_factory, sqlite_url, kind
) -> None:  # type: ignore[no-untyped-def]
    """The text-only tito shapes (vLLM ``/v1/completions`` with a token ``prompt``, SGLang
    ``/generate`` with ``input_ids``): the ids are the prompt-ids marker, never stored whole."""
    import openai

    up = upstream_factory()
    proxy = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo", upstream_kind=kind)
    client = openai.OpenAI(base_url=f"{proxy.url}/s/t/v1", api_key="x", max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "Say something about orchards, please."}]
    for k in range(4):
        answer = client.chat.completions.create(model="m", messages=msgs).choices[0].message.content
        msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"And then {k}?"}]
    proxy.flush()
    sent = [b for _p, b in up.fake.log]
    key = "input_ids" if kind == "sglang" else "prompt"
    store = proxy.store()
    try:
        recs = store.calls("t")
        assert [orjson.dumps(r.upstream_request) for r in recs] == [orjson.dumps(b) for b in sent]
        assert all(b[key] == list(r.prompt_ids or ()) for r, b in zip(recs, sent))
    finally:
        store.close()
    assert [how[key] for how in _recipes(sqlite_url, "t")] == [["p"]] * 4


def test_the_upstream_recipe_of_a_tito_images_body() -> None:
    """Unit: the ids as a collapsed-prompt marker (verified: a mismatch stays literal), the
    content parts as blobs whose images ``blob_rows`` cuts out."""
    prompt = [1, 2, PAD, PAD, PAD, 3, PAD, PAD, 4]
    url = "data:image/png;base64," + "iVBORw0KGgo" + "A" * 120
    up = {
        "model": "m",
        "token_ids": [1, 2, PAD, 3, PAD, 4],
        "content_parts": [{"type": "image_url", "url": url}, {"type": "image_url", "url": url}],
        "sampling_params": {"max_tokens": 8},
        "stream": False,
    }
    recipe, texts = layout.derive_upstream(up, {"model": "m", "messages": []}, prompt)
    assert [e[:2] for e in recipe["k"]] == [
        ["model", "r"],
        ["token_ids", "c"],
        ["content_parts", "b"],
        ["sampling_params", "v"],
        ["stream", "v"],
    ]
    assert texts is not None and len(texts) == 2
    assert orjson.dumps(layout.upstream_of(recipe, {"model": "m"}, prompt, texts)) == orjson.dumps(up)
    assert [(s, e) for s, e, _ in layout.image_spans(texts[0])] == [
        (texts[0].index("iVBOR"), len(texts[0]) - 2)
    ]
    # ids that are not the collapsed prompt (another pad count) stay literal
    odd = {**up, "token_ids": [1, 2, PAD, PAD, 3, PAD, 4]}
    recipe, texts = layout.derive_upstream(odd, {}, prompt)
    assert ["token_ids", "v", odd["token_ids"]] in recipe["k"]
    assert orjson.dumps(layout.upstream_of(recipe, {}, prompt, texts)) == orjson.dumps(odd)
    # two images side by side (one run in the expanded ids): not recoverable, stays literal
    side = {"token_ids": [1, PAD, PAD, 2]}
    recipe, _ = layout.derive_upstream(side, {}, [1, PAD, PAD, PAD, PAD, 2])
    assert recipe["k"] == [["token_ids", "v", [1, PAD, PAD, 2]]]
    # a translated message list and content parts together
    both = {"messages": [{"role": "user", "content": "hi"}], **up}
    recipe, texts = layout.derive_upstream(both, {}, prompt)
    assert texts is not None and len(texts) == 3
    assert orjson.dumps(layout.upstream_of(recipe, {}, prompt, texts)) == orjson.dumps(both)
    # the plain text tito shapes: the prompt ids themselves
    for body in (
        {"model": "m", "prompt": [1, 2, 3], "max_tokens": 8},
        {"input_ids": [1, 2, 3], "sampling_params": {}, "return_logprob": True},
    ):
        recipe, texts = layout.derive_upstream(body, {"model": "m"}, [1, 2, 3])
        assert texts is None and any(e[1] == "p" for e in recipe["k"])
