"""Token-in/token-out with a vision-language model, against the demo upstream in VLM mode.

tito renders one ``<|image_pad|>`` per image and sends the ids with the images to vLLM's
token-in endpoint (``/inference/v1/generate``, ``content_parts``); the server expands the pads
and its expanded ids are recorded. Judged by the upstream's own log (what it was sent), by the
same session in token mode (the server rendering it itself), and by reconstruction.
"""

from __future__ import annotations

import base64
import hashlib
import io

import pytest
from PIL import Image

from orchard_rec.demo.gui import run_gui_agent
from orchard_rec.demo.tokenizer import IMAGE_PAD, build_tokenizer
from orchard_rec.demo.vision import VisionConfig
from orchard_rec.reconstruct import image_runs, reconstruct_session
from orchard_rec.records import CallOutcome

pytestmark = [pytest.mark.slow]  # sessions through the proxy with a Hugging Face tokenizer: 3-8 s each

PAD = build_tokenizer().token_to_id(IMAGE_PAD)
VC = VisionConfig()


def _size(png: bytes) -> int:
    return VC.tokens(*Image.open(io.BytesIO(png)).size)


def _png(size: tuple[int, int], color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def _url(b: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(b).decode()


def test_gui_session_through_tito_equals_token_mode(
    upstream_factory, proxy_factory, sqlite_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(vlm=True)
    tito = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo")
    run = run_gui_agent(f"{tito.url}/s/gui/v1", keep=3)
    assert len(run.sent) == 5 and not run.messages[-1].get("tool_calls")
    sent = [(p, b) for p, b in up.fake.log if p == "/inference/v1/generate"]
    assert len(sent) == 5
    for (_, body), shots in zip(sent, run.sent):  # one pad per image, the images in prompt order
        assert body["token_ids"].count(PAD) == len(shots)
        assert [part["url"] for part in body["content_parts"]] == [_url(s) for s in shots]
    tito.flush()
    calls = tito.store().calls("gui")
    assert all(c.outcome is CallOutcome.OK for c in calls)
    for c, shots in zip(calls, run.sent):  # the server's expanded ids are what was recorded
        assert [b - a for a, b in image_runs(c.prompt_ids, PAD)] == [_size(s) for s in shots]
        assert c.metadata["tito"]["images"] == len(shots)
    # turns 2-3 extend the branch; 4 and 5 dropped the oldest screenshot: rendered fresh
    assert [c.metadata["tito"]["fresh"] for c in calls] == [True, False, False, True, True]
    # the same session in token mode (the server renders it): the same prompt ids, call by call
    token = proxy_factory(up.url, f"sqlite:///{tmp_path / 'token.db'}", mode="token")
    run_gui_agent(f"{token.url}/s/gui/v1", keep=3)
    token.flush()
    assert [list(c.prompt_ids) for c in token.store().calls("gui")] == [list(c.prompt_ids) for c in calls]
    samples = reconstruct_session(calls, tokenizer=build_tokenizer())
    assert len(samples) == 3 and [s.metadata.get("images_dropped") for s in samples] == [None, 1, 1]
    for s, k in zip(samples, [2, 3, 4]):
        assert s.tokens == list(calls[k].prompt_ids) + list(calls[k].completion_ids)
        assert [im.digest for im in s.images] == [hashlib.sha256(b).hexdigest() for b in run.sent[k]]
        assert [b - a for a, b in s.metadata["image_spans"]] == [_size(b) for b in run.sent[k]]


def test_a_restarted_proxy_continues_a_vlm_branch(upstream_factory, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    import openai

    up = upstream_factory(vlm=True)
    a, b = _png((112, 84), (200, 0, 0)), _png((224, 168), (0, 0, 200))
    msgs: list[dict] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": _url(a)}}],
        }
    ]
    first = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo")
    c1 = openai.OpenAI(base_url=f"{first.url}/s/r/v1", api_key="x", max_retries=0)
    msgs.append(
        {
            "role": "assistant",
            "content": c1.chat.completions.create(model="m", messages=msgs).choices[0].message.content,
        }
    )  # type: ignore[arg-type]
    msgs.append(
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": _url(b)}},
                {"type": "text", "text": "now?"},
            ],
        }
    )
    second = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo")  # another replica, empty memory
    c2 = openai.OpenAI(base_url=f"{second.url}/s/r/v1", api_key="x", max_retries=0)
    c2.chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
    second.flush()
    calls = second.store().calls("r")
    assert [c.metadata["tito"]["fresh"] for c in calls] == [True, False]  # rebuilt from the database
    assert list(calls[1].prompt_ids[: len(calls[0].prompt_ids) + len(calls[0].completion_ids)]) == list(
        calls[0].prompt_ids
    ) + list(calls[0].completion_ids)
    assert [e - s for s, e in image_runs(calls[1].prompt_ids, PAD)] == [12, 48]
    # the same text with another image in its place is not the same history
    msgs[0]["content"][1]["image_url"]["url"] = _url(b)
    c2.chat.completions.create(model="m", messages=msgs)  # type: ignore[arg-type]
    second.flush()
    assert second.store().calls("r")[-1].metadata["tito"]["fresh"] is True


def test_responses_and_messages_with_images_and_sglang_refused(
    upstream_factory, proxy_factory, sqlite_url
) -> None:  # type: ignore[no-untyped-def]
    import anthropic
    import openai

    up = upstream_factory(vlm=True)
    proxy = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo")
    a = _png((112, 84), (10, 200, 10))
    oc = openai.OpenAI(base_url=f"{proxy.url}/s/resp/v1", api_key="x", max_retries=0)
    oc.responses.create(
        model="m",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "hi"},
                    {"type": "input_image", "image_url": _url(a)},
                ],
            }
        ],  # type: ignore[list-item]
    )
    ac = anthropic.Anthropic(base_url=f"{proxy.url}/s/msg", api_key="x", max_retries=0)
    img = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(a).decode()},
    }
    with ac.messages.stream(
        model="m",
        max_tokens=64,
        messages=[{"role": "user", "content": [img, {"type": "text", "text": "see?"}]}],
    ) as s:  # type: ignore[list-item]
        assert s.get_final_message().content
    proxy.flush()
    for sid in ("resp", "msg"):
        [c] = proxy.store().calls(sid)
        assert [e - s for s, e in image_runs(c.prompt_ids, PAD)] == [12]
        [sample] = reconstruct_session([c], tokenizer=build_tokenizer())
        assert [im.digest for im in sample.images] == [hashlib.sha256(a).hexdigest()]
    sg = proxy_factory(up.url, sqlite_url, mode="tito", tokenizer="demo", upstream_kind="sglang")
    bad = openai.OpenAI(base_url=f"{sg.url}/s/sg/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="tito sends images only to vLLM"):
        bad.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _url(a)}}]}],
        )
