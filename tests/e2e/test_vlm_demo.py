"""The demo upstream's VLM mode: image placeholders expanded as Qwen2-VL's processor does.

Pad counts are judged against transformers' own Qwen2-VL image processor (its PIL backend: the
torchvision one cannot be imported here) and the two facts measured on real vLLM (issue 21:
112×84 → 12 pads, 224×168 → 48 at min/max pixels 56²/224²). Sessions run through the recording
proxy in token mode with the real openai / anthropic SDKs: each sample's images are the
screenshots its prompt held, in order, and their runs are observation (mask 0) of the right length.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from factories import data_url
from PIL import Image

from orchard_rec.demo.gui import SIZES, run_gui_agent
from orchard_rec.demo.tokenizer import IMAGE_PAD, build_tokenizer
from orchard_rec.demo.vision import ImageError, VisionConfig, expand, smart_resize
from orchard_rec.reconstruct import image_runs, reconstruct_session
from orchard_rec.records import CallOutcome

PAD = build_tokenizer().token_to_id(IMAGE_PAD)
VC = VisionConfig()  # the test model's geometry: 56² .. 224²


def png(size: tuple[int, int], color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_pad_counts_the_facts_measured_on_vllm() -> None:
    assert VC.grid_thw(112, 84) == (1, 6, 8) and VC.tokens(112, 84) == 12
    assert VC.grid_thw(224, 168) == (1, 12, 16) and VC.tokens(224, 168) == 48
    assert VC.tokens(320, 200) == 60  # above max_pixels: scaled down to 168×280
    assert VC.tokens(10, 10) == 4  # below min_pixels: scaled up to 56×56
    assert smart_resize(84, 112) == (84, 112)
    ids, runs = expand([1, PAD, 2, PAD], PAD, [3, 2])
    assert ids == [1, PAD, PAD, PAD, 2, PAD, PAD] and runs == [(1, 3), (5, 2)]
    with pytest.raises(ImageError, match="1 image placeholder"):
        expand([1, PAD], PAD, [3, 2])


@pytest.mark.slow  # importing transformers' image processor: ~5-20 s on a loaded machine
def test_pad_counts_equal_transformers_qwen2_vl_image_processor(tmp_path: Path) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (  # "copied from" the torchvision one
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    rng = random.Random(21)
    sizes = [(112, 84), (224, 168), (320, 200), (10, 10), (1000, 30), (57, 57), (1280, 800), (29, 700)]
    sizes += [(rng.randint(8, 1500), rng.randint(8, 1500)) for _ in range(40)]
    for vc in (VC, VisionConfig.qwen2_vl(), VisionConfig(min_pixels=100 * 28 * 28, max_pixels=300 * 28 * 28)):
        proc = Qwen2VLImageProcessorPil(min_pixels=vc.min_pixels, max_pixels=vc.max_pixels)
        for w, h in sizes:
            assert smart_resize(h, w, 28, vc.min_pixels, vc.max_pixels) == hf_smart_resize(
                h, w, 28, vc.min_pixels, vc.max_pixels
            )
        for w, h in sizes[:14]:  # the processor itself, on real images
            out = proc(images=[Image.new("RGB", (w, h), (1, 2, 3))], return_tensors="np")
            t, gh, gw = (int(x) for x in out["image_grid_thw"][0])
            assert vc.grid_thw(w, h) == (t, gh, gw)
            assert vc.tokens(w, h) == t * gh * gw // proc.merge_size**2
    # the geometry round-trips through a model folder's preprocessor_config.json
    from orchard_rec.demo.tokenizer import save_tokenizer

    folder = save_tokenizer(tmp_path / "vlm", vision=VC)
    assert VisionConfig.from_preprocessor_config(folder) == VC
    loaded = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
    out = loaded(images=[Image.new("RGB", (224, 168))], return_tensors="np")
    assert [int(x) for x in out["image_grid_thw"][0]] == [1, 12, 16]


@pytest.mark.slow  # transformers' chat templating
def test_the_python_template_and_the_jinja_template_render_images_alike(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from orchard_rec.demo.template import IMAGE_MARKUP, render
    from orchard_rec.demo.tokenizer import save_tokenizer

    tok = AutoTokenizer.from_pretrained(str(save_tokenizer(tmp_path / "t")), local_files_only=True)
    conv: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": "S"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "c", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "content": [{"type": "text", "text": "o"}, {"type": "image"}]},
    ]
    text = render(conv)
    assert text == tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    assert text.count(IMAGE_MARKUP) == 3
    assert tok.convert_tokens_to_ids(IMAGE_PAD) == PAD


@dataclass
class Answer:
    status_code: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _post(url: str, body: dict[str, Any]) -> Answer:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return Answer(r.status, r.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read())


def test_demo_upstream_expands_images_in_every_dialect(upstream_factory) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(vlm=True)
    small, big = png((112, 84)), png((224, 168), (0, 90, 0))
    chat = _post(
        f"{up.url}/chat/completions",
        {
            "model": "m",
            "return_token_ids": True,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is on screen?"},
                        {"type": "image_url", "image_url": {"url": data_url(small)}},
                        {"type": "image_url", "image_url": {"url": data_url(big)}},
                    ],
                }
            ],
        },
    ).json()
    prompt = chat["prompt_token_ids"]
    assert [b - a for a, b in image_runs(prompt, PAD)] == [12, 48]
    n_chat = chat["usage"]["prompt_tokens"]
    resp = _post(
        f"{up.url}/responses",
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is on screen?"},
                        {"type": "input_image", "image_url": data_url(small)},
                        {"type": "input_image", "image_url": data_url(big)},
                    ],
                }
            ],
        },
    ).json()
    assert resp["usage"]["input_tokens"] == n_chat
    b64 = base64.b64encode(small).decode()
    msg = _post(
        f"{up.url}/messages",
        {
            "model": "m",
            "max_tokens": 64,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is on screen?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": b64},
                        },
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": base64.b64encode(big).decode(),
                            },
                        },
                    ],
                }
            ],
        },
    ).json()
    assert msg["usage"]["input_tokens"] == n_chat
    # vLLM's token-in endpoint: one pad per image in, the server expands
    unexpanded = [t for k, t in enumerate(prompt) if t != PAD or prompt[k - 1] != PAD]
    gen = _post(
        f"{up.server.url}/inference/v1/generate",
        {
            "token_ids": unexpanded,
            "content_parts": [
                {"type": "image_url", "url": data_url(small)},
                {"type": "image_url", "url": data_url(big)},
            ],
            "sampling_params": {"max_tokens": 64, "logprobs": 0},
            "return_token_ids": True,
        },
    ).json()
    assert gen["prompt_token_ids"] == prompt
    runs = image_runs(prompt, PAD)
    assert gen["mm_placeholders"] == {"image": [{"offset": a, "length": b - a} for a, b in runs]}
    assert gen["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]
    bad = _post(
        f"{up.server.url}/inference/v1/generate",
        {
            "token_ids": unexpanded,
            "content_parts": [{"type": "image_url", "url": data_url(small)}],
            "sampling_params": {},
        },
    )
    assert (
        bad.status_code == 400 and "2 image placeholder(s) for 1 image(s)" in bad.json()["error"]["message"]
    )
    remote = _post(
        f"{up.url}/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
            ],
        },
    )
    assert remote.status_code == 400 and "data: URLs" in remote.json()["error"]["message"]
    # without --vlm, an image is its markup, unexpanded (the text demo is unchanged)
    text_up = upstream_factory()
    plain = _post(
        f"{text_up.url}/chat/completions",
        {
            "model": "m",
            "return_token_ids": True,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(big)}}]}
            ],
        },
    ).json()
    assert [b - a for a, b in image_runs(plain["prompt_token_ids"], PAD)] == [1]


@pytest.mark.slow  # a GUI session through the proxy with the openai SDK: ~3 s
def test_gui_session_through_token_mode(upstream_factory, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    up = upstream_factory(vlm=True)
    proxy = proxy_factory(up.url, sqlite_url, mode="token")
    run = run_gui_agent(f"{proxy.url}/s/gui/v1", keep=3)
    assert not run.messages[-1].get("tool_calls") and len(run.sent) == 5
    assert [len(s) for s in run.sent] == [1, 2, 3, 3, 3]
    proxy.flush()
    calls = proxy.store().calls("gui")
    assert len(calls) == 5 and all(c.outcome is CallOutcome.OK for c in calls)
    for c, shots in zip(calls, run.sent):  # the server's expanded ids were recorded
        want = [VC.tokens(*Image.open(io.BytesIO(s)).size) for s in shots]
        assert [b - a for a, b in image_runs(c.prompt_ids, PAD)] == want
    samples = reconstruct_session(calls, tokenizer=build_tokenizer())
    # calls 1-3 extend each other; 4 and 5 each drop the oldest screenshot: a sample per turn
    assert len(samples) == 3
    assert [s.metadata.get("images_dropped") for s in samples] == [None, 1, 1]
    last_call_of = [2, 3, 4]
    for s, k in zip(samples, last_call_of):
        assert [im.digest for im in s.images] == [sha(b) for b in run.sent[k]]
        assert s.tokens == list(calls[k].prompt_ids) + list(calls[k].completion_ids)
        spans = s.metadata["image_spans"]
        assert [b - a for a, b in spans] == [VC.tokens(im.width, im.height) for im in s.images]
        assert "image_spans_mismatch" not in s.metadata
        for a, b in spans:  # image runs are observation
            lo, hi = a - s.prompt_length, b - s.prompt_length
            assert all(m == 0 for m in s.loss_mask[max(lo, 0) : max(hi, 0)])
            assert all(s.tokens[i] == PAD for i in range(a, b))
    assert {im.width for s in samples for im in s.images} == {w for w, _ in SIZES}


@pytest.mark.slow  # Responses and Anthropic clients through the proxy: ~3 s
def test_responses_and_messages_clients_with_images(upstream_factory, proxy_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    import anthropic
    import openai

    up = upstream_factory(vlm=True)
    proxy = proxy_factory(up.url, sqlite_url, mode="token")
    a, b = png((112, 84)), png((224, 168), (9, 9, 200))
    oc = openai.OpenAI(base_url=f"{proxy.url}/s/resp/v1", api_key="x", max_retries=0)
    first = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "hi"},
                {"type": "input_image", "image_url": data_url(a)},
            ],
        }
    ]
    r1 = oc.responses.create(model="m", input=first)  # type: ignore[arg-type]
    second = first + [
        {"role": "assistant", "content": r1.output_text},
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": data_url(b)},
                {"type": "input_text", "text": "and now?"},
            ],
        },
    ]
    oc.responses.create(model="m", input=second, stream=False)  # type: ignore[arg-type]
    ac = anthropic.Anthropic(base_url=f"{proxy.url}/s/msg", api_key="x", max_retries=0)
    img = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(b).decode()},
    }
    with ac.messages.stream(
        model="m",
        max_tokens=64,
        messages=[{"role": "user", "content": [img, {"type": "text", "text": "see?"}]}],  # type: ignore[list-item]
    ) as s:
        s.get_final_message()
    proxy.flush()
    store = proxy.store()
    rc = store.calls("resp")
    assert [[n for n in map(lambda r: r[1] - r[0], image_runs(c.prompt_ids, PAD))] for c in rc] == [
        [12],
        [12, 48],
    ]
    [sample] = reconstruct_session(rc, tokenizer=build_tokenizer())
    assert [im.digest for im in sample.images] == [sha(a), sha(b)]
    assert [e - s for s, e in sample.metadata["image_spans"]] == [12, 48]
    [mc] = store.calls("msg")
    assert [e - s for s, e in image_runs(mc.prompt_ids, PAD)] == [48]
    [ms] = reconstruct_session([mc], tokenizer=build_tokenizer())
    assert [im.digest for im in ms.images] == [sha(b)] and ms.metadata["image_spans"] == image_runs(
        mc.prompt_ids, PAD
    )


@pytest.mark.slow  # the whole demo loop, VLM variant: ~10 s on a loaded machine
def test_demo_vlm_runs_the_whole_loop(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchard_rec.cli import app

    r = CliRunner().invoke(app, ["demo", "--vlm", "--workdir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "The GUI agent sent 5 screenshots" in r.output
    assert "split: 1" in r.output
    assert (tmp_path / "samples.jsonl").is_file()
    bad = CliRunner().invoke(app, ["demo", "upstream", "--vlm", "--min-pixels", "900", "--max-pixels", "10"])
    assert bad.exit_code == 2 and "--min-pixels 900 is above --max-pixels 10" in bad.output


@pytest.mark.slow  # two real processes (the demo upstream, serve) and the export CLI: 15-45 s
def test_real_processes_demo_upstream_vlm_serve_token_and_export(tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def start(args: list[str], probe: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            [sys.executable, "-m", "orchard_rec.cli", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=tmp_path,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(probe, timeout=2):
                    return p
            except OSError:
                assert p.poll() is None, f"{args[0]} exited"
                time.sleep(0.3)
        p.kill()
        raise AssertionError(f"{args} did not start")

    up_port, proxy_port = port(), port()
    db = f"sqlite:///{tmp_path / 'o.db'}"
    up = start(["demo", "upstream", "--vlm", "--port", str(up_port)], f"http://127.0.0.1:{up_port}/v1/models")
    try:
        proxy = start(
            ["serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--port", str(proxy_port), "--db", db,
             "--mode", "token", "--spool", str(tmp_path / "o.spool")],
            f"http://127.0.0.1:{proxy_port}/healthz",
        )  # fmt: skip
        try:
            run = run_gui_agent(f"http://127.0.0.1:{proxy_port}/s/web/v1", keep=3)
        finally:
            proxy.send_signal(signal.SIGINT)  # drains: every call is in the database after this
            assert proxy.wait(60) == 0
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)
    out = tmp_path / "s.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "orchard_rec.cli", "export", "--db", db, "--format", "jsonl", "--tokenizer", "demo",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and [row["metadata"].get("images_dropped") for row in rows] == [None, 1, 1]
    for row, k in zip(rows, [2, 3, 4]):
        assert [im["digest"] for im in row["images"]] == [sha(b) for b in run.sent[k]]
        spans = row["metadata"]["image_spans"]
        assert [b - a for a, b in spans] == [VC.tokens(*Image.open(io.BytesIO(b)).size) for b in run.sent[k]]
        assert all(row["tokens"][i] == PAD for a, b in spans for i in range(a, b))
        plen = len(row["tokens"]) - row["response_length"]
        assert all(row["loss_mask"][i - plen] == 0 for a, b in spans for i in range(a, b) if i >= plen)
