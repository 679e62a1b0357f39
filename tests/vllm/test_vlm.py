"""orchard-rec token mode in front of a real vLLM serving a vision-language model (issue 21).

A tiny random Qwen2-VL (``vlm_model.py``) on vLLM CPU; clients send Pillow screenshots as
chat ``image_url`` data URLs (the openai SDK, a browser agent keeping its last 3 screenshots
as Orchard-GUI does), Anthropic ``image`` blocks (one inside a ``tool_result``) and Responses
``input_image`` items (one in a ``function_call_output``). The judge is what vLLM itself sent
(the ``Tap``): every recorded prompt/completion id and logprob is vLLM's, clients get vLLM's
answer, and reconstruction finds each image's run of ``<|image_pad|>`` (as long as Qwen2-VL's
processor makes it for that image's size), masks it 0, and gives every sample the screenshots
its prompt showed, in order; when the agent drops an old screenshot the sample splits per turn.
"""

from __future__ import annotations

import base64
import hashlib
import io
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
from factories import data_url
from PIL import Image

from orchard_rec.dialects import assemble
from orchard_rec.pipeline import iter_samples
from orchard_rec.reconstruct import Sample, image_runs, image_token_id, reconstruct_session
from orchard_rec.records import CallOutcome, Dialect
from orchard_rec.storage import Store

from .conftest import (
    VLM_MODEL,
    Exchange,
    Tap,
    VLLMServer,
    sse_events,
    strip_injected,
    vllm_answer,
    vllm_tokens,
)

MAX = 48  # tokens per turn; the model ends turns after ~40 on average
KEEP = 3  # screenshots the browser agent keeps in its history (older ones become a note)
SIZES = [(112, 84), (224, 168)]
COLOURS = [(200, 40, 40), (40, 160, 60), (50, 70, 210), (220, 200, 40), (40, 190, 200), (170, 60, 180)]
NOTE = "[screenshot omitted]"
Pads = dict[tuple[int, int], int]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "click",
            "description": "Click the page at (x, y)",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            },
        },
    }
]


def screenshot(i: int, size: tuple[int, int]) -> bytes:
    """A page-like PNG: a coloured background, a header bar and a 'button' that moves per step."""
    im = Image.new("RGB", size, COLOURS[i % len(COLOURS)])
    w, h = size
    im.paste((250, 250, 250), (0, 0, w, h // 6))
    im.paste((20, 20, 20), ((i * 13) % (w - 20), h // 2, (i * 13) % (w - 20) + 20, h // 2 + 10))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def digest(png: bytes) -> str:
    return hashlib.sha256(png).hexdigest()


def _pads_per_image(model_dir: Path) -> Pads:
    """``<|image_pad|>`` tokens per image size, from Qwen2-VL's own processor (grid t·h·w / merge²)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))
    out = {}
    for size in SIZES:
        grid = proc(images=[Image.new("RGB", size)], return_tensors="np")["image_grid_thw"][0]
        out[size] = int(grid.prod()) // proc.merge_size**2
    return out


def _check_recorded(proxy: Any, sid: str, exes: list[Exchange]) -> list[Any]:
    """Every call of the session recorded with exactly vLLM's ids and logprobs; returns the calls."""
    proxy.flush()
    calls = proxy.store().calls(sid)
    assert len(calls) == len(exes) and all(c.outcome is CallOutcome.OK for c in calls)
    for call, ex in zip(calls, exes):
        assert ex.request["return_token_ids"] is True and ex.request["logprobs"] is True
        prompt, ids, lps = vllm_tokens(ex)
        assert list(call.prompt_ids) == prompt
        assert list(call.completion_ids) == ids
        assert list(call.completion_logprobs) == lps
    return calls


def _check_images(s: Sample, pad: int, pads: Pads, shown: list[tuple[bytes, tuple[int, int]]]) -> None:
    """The sample's images are the screenshots its prompt showed, in order, each one run of pads
    as long as the processor makes it, all masked 0."""
    assert [im.digest for im in s.images] == [digest(b) for b, _ in shown]
    assert [im.data for im in s.images] == [b for b, _ in shown]
    assert [(im.width, im.height) for im in s.images] == [size for _, size in shown]
    spans = s.metadata["image_spans"]
    assert "image_spans_mismatch" not in s.metadata
    assert [e - b for b, e in spans] == [pads[size] for _, size in shown]
    assert all(s.tokens[i] == pad for b, e in spans for i in range(b, e))
    assert sum(1 for t in s.tokens if t == pad) == sum(pads[size] for _, size in shown)
    prompt_len = len(s.tokens) - s.response_length
    assert spans and spans[-1][1] <= len(s.tokens)
    for b, e in spans:  # observation: never trained on
        for i in range(max(b, prompt_len), e):
            assert s.loss_mask[i - prompt_len] == 0


def _samples(proxy: Any, sid: str, tokenizer: Any) -> list[Sample]:
    """The session's samples as exports get them (``iter_samples`` over the store, the image token
    derived from the VLM tokenizer), checked equal, images included, to reconstructing the
    session's full records directly."""
    proxy.flush()
    store = Store(proxy.config.db)
    piped = list(iter_samples(store, sessions=[sid], tokenizer=tokenizer))
    full = reconstruct_session(store.calls(sid), tokenizer=tokenizer)
    assert [s.to_dict() for s in piped] == [s.to_dict() for s in full]
    for a, b in zip(piped, full):
        assert [im.data for im in a.images] == [im.data for im in b.images]
    return piped


@pytest.fixture(scope="module")
def pads(vlm_server: VLLMServer) -> Pads:
    got = _pads_per_image(vlm_server.model_dir)
    assert got == {(112, 84): 12, (224, 168): 48}  # issue 21's facts, from the processor itself
    return got


@pytest.fixture(scope="module")
def pad(vlm_server: VLLMServer) -> int:
    pad = vlm_server.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert image_token_id(vlm_server.tokenizer) == pad
    return int(pad)


# -- (a) a browser agent: the real openai SDK, screenshots every turn, the last 3 kept ------------


def _browser_messages(shots: list[bytes], replies: list[str]) -> list[dict[str, Any]]:
    """The agent's history: each step's observation (text + screenshot), its reply; screenshots
    older than the last ``KEEP`` replaced by a text note, as Orchard-GUI's browser loop does."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a web agent. Look at the screenshot and act."}
    ]
    for i, png in enumerate(shots):
        kept = i >= len(shots) - KEEP
        image = (
            {"type": "image_url", "image_url": {"url": data_url(png)}}
            if kept
            else {"type": "text", "text": NOTE}
        )
        msgs.append(
            {"role": "user", "content": [{"type": "text", "text": f"Step {i + 1}: the page now."}, image]}
        )
        if i < len(replies):
            msgs.append({"role": "assistant", "content": replies[i]})
    return msgs


def test_browser_session_keeping_last_screenshots(
    vlm_server: VLLMServer, vlm_tap: Tap, proxy_factory: Any, sqlite_url: str, pads: Pads, pad: int
) -> None:
    proxy = proxy_factory(vlm_tap.url, sqlite_url)
    sid = "vlm-browser"
    oc = openai.OpenAI(base_url=f"{proxy.url}/s/{sid}/v1", api_key="x", max_retries=0, timeout=300)
    turns = 6
    shots = [screenshot(i, SIZES[i % 2]) for i in range(turns)]
    replies: list[str] = []
    first = len(vlm_tap.log)
    for t in range(turns):
        msgs = _browser_messages(shots[: t + 1], replies)
        n = len(vlm_tap.log)
        kwargs: dict[str, Any] = {
            "model": VLM_MODEL,
            "messages": msgs,
            "tools": CHAT_TOOLS,
            "max_tokens": MAX,
            "seed": t,
        }
        if t % 2:  # streamed turns: the SDK's own stream, every event vLLM's less the injected fields
            with oc.chat.completions.with_streaming_response.create(**kwargs, stream=True) as r:
                raw = r.read()
            [ex] = vlm_tap.log[n:]
            assert sse_events(raw) == [strip_injected(e) for e in ex.events()]
            text = assemble(Dialect.CHAT, [(None, e) for e in sse_events(raw)])["choices"][0]["message"][
                "content"
            ]
        else:
            resp = oc.chat.completions.with_raw_response.create(**kwargs)
            [ex] = vlm_tap.log[n:]
            assert orjson.loads(resp.http_response.content) == strip_injected(ex.json())
            text = resp.parse().choices[0].message.content
        assert ex.request["messages"] == msgs  # the screenshots reached vLLM untouched
        replies.append(text or "")
    calls = _check_recorded(proxy, sid, vlm_tap.log[first:])
    # 6 screenshots, sent 3+3+3+3+2+1 = 15 times: each stored once
    stored = proxy.store()
    assert stored.image_stats() == {"images": turns, "bytes": sum(len(b) for b in shots)}
    assert all(stored.image(digest(b)) == ("image/png", b) for b in shots)
    sizes = [SIZES[i % 2] for i in range(turns)]
    samples = _samples(proxy, sid, vlm_server.tokenizer)
    # turns 1-3 keep every screenshot: one sample; from turn 4 on the oldest is dropped each turn,
    # the prefix breaks there, and every turn is a sample of its own (Orchard-GUI's per-turn samples)
    assert len(samples) == 1 + turns - KEEP
    head, *rest = samples
    assert len(head.turns) == KEEP and "images_dropped" not in head.metadata
    assert head.tokens == list(calls[KEEP - 1].prompt_ids) + list(calls[KEEP - 1].completion_ids)
    _check_images(head, pad, pads, list(zip(shots[:KEEP], sizes[:KEEP])))
    for k, s in enumerate(rest, start=KEEP):
        call = calls[k]
        assert len(s.turns) == 1 and s.metadata["images_dropped"] == 1
        assert s.tokens == list(call.prompt_ids) + list(call.completion_ids)
        assert s.metadata["split_from"] == (0 if k == KEEP else k - KEEP)
        _check_images(s, pad, pads, list(zip(shots[k - KEEP + 1 : k + 1], sizes[k - KEEP + 1 : k + 1])))
        # the generated ids are the trained part, with vLLM's logprobs
        assert s.loss_mask[-len(call.completion_ids) :] == [1] * len(call.completion_ids)
        assert s.rollout_log_probs[-len(call.completion_ids) :] == list(call.completion_logprobs)


# -- (b) Anthropic Messages: image blocks, one inside a tool_result -------------------------------

ANTH_TOOL = {
    "name": "computer",
    "description": "Act on the screen and return a screenshot",
    "input_schema": {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]},
}


def _image_block(png: bytes) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()},
    }


def test_anthropic_image_blocks_and_tool_result_screenshot(
    vlm_server: VLLMServer, vlm_tap: Tap, proxy_factory: Any, sqlite_url: str, pads: Pads, pad: int
) -> None:
    proxy = proxy_factory(vlm_tap.url, sqlite_url)
    sid = "vlm-anthropic"
    ac = anthropic.Anthropic(base_url=f"{proxy.url}/s/{sid}", api_key="x", max_retries=0, timeout=300)
    a, b, c = screenshot(10, SIZES[0]), screenshot(11, SIZES[1]), screenshot(12, SIZES[0])
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Open the settings page."}, _image_block(a)]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "computer", "input": {"action": "screenshot"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "Took a screenshot."}, _image_block(b)],
                },
                {"type": "text", "text": "What do you see?"},
            ],
        },
    ]
    first = len(vlm_tap.log)
    texts = []
    for t, extra in enumerate([None, c]):
        if extra is not None:
            history = history + [
                {"role": "assistant", "content": [{"type": "text", "text": texts[-1]}]},
                {"role": "user", "content": [_image_block(extra), {"type": "text", "text": "And now?"}]},
            ]
        if t:
            with ac.messages.stream(
                model=VLM_MODEL, max_tokens=MAX, messages=history, tools=[ANTH_TOOL]
            ) as m:  # type: ignore[arg-type]
                list(m)
                final = m.get_final_message()
        else:
            final = ac.messages.create(model=VLM_MODEL, max_tokens=MAX, messages=history, tools=[ANTH_TOOL])  # type: ignore[arg-type]
        ex = vlm_tap.log[-1]
        msg = vllm_answer(ex)["choices"][0]["message"]
        text = "".join(blk.text for blk in final.content if blk.type == "text")
        assert text == (msg.get("content") or "") and not msg.get("tool_calls")
        assert final.usage.input_tokens == len(vllm_tokens(ex)[0])
        texts.append(text)
    # the tool result's screenshot reached the model where the result sits
    tool_msg = next(m for m in vlm_tap.log[first].request["messages"] if m["role"] == "tool")
    assert [p["type"] for p in tool_msg["content"]] == ["text", "image_url"]
    _check_recorded(proxy, sid, vlm_tap.log[first:])
    [s] = _samples(proxy, sid, vlm_server.tokenizer)  # the second turn extends the first
    assert len(s.turns) == 2
    _check_images(s, pad, pads, [(a, SIZES[0]), (b, SIZES[1]), (c, SIZES[0])])


# -- (c) Responses: input_image items, one in a function_call_output -----------------------------


def test_responses_input_images(
    vlm_server: VLLMServer, vlm_tap: Tap, proxy_factory: Any, sqlite_url: str, pads: Pads, pad: int
) -> None:
    proxy = proxy_factory(vlm_tap.url, sqlite_url)
    sid = "vlm-responses"
    oc = openai.OpenAI(base_url=f"{proxy.url}/s/{sid}/v1", api_key="x", max_retries=0, timeout=300)
    d, e, f = screenshot(20, SIZES[1]), screenshot(21, SIZES[0]), screenshot(22, SIZES[1])
    tool = {
        "type": "function",
        "name": "screenshot",
        "parameters": {"type": "object", "properties": {}},
    }
    items: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Find the search box."},
                {"type": "input_image", "image_url": data_url(d), "detail": "auto"},
            ],
        },
        {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_image", "image_url": data_url(e), "detail": "auto"}],
        },
    ]
    first = len(vlm_tap.log)
    text = ""
    for t, extra in enumerate([None, f]):
        if extra is not None:
            items = items + [
                {"role": "assistant", "content": [{"type": "output_text", "text": text}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": data_url(extra), "detail": "auto"},
                        {"type": "input_text", "text": "Scrolled. Next?"},
                    ],
                },
            ]
        if t:
            with oc.responses.stream(model=VLM_MODEL, input=items, tools=[tool], max_output_tokens=MAX) as st:  # type: ignore[arg-type]
                events = list(st)
            # response.incomplete when the random model runs to max_output_tokens
            assert events[-1].type in ("response.completed", "response.incomplete")
            text = events[-1].response.output_text  # type: ignore[union-attr]
        else:
            text = oc.responses.create(
                model=VLM_MODEL, input=items, tools=[tool], max_output_tokens=MAX
            ).output_text  # type: ignore[arg-type]
        msg = vllm_answer(vlm_tap.log[-1])["choices"][0]["message"]
        assert text == (msg.get("content") or "") and not msg.get("tool_calls")
    _check_recorded(proxy, sid, vlm_tap.log[first:])
    [s] = _samples(proxy, sid, vlm_server.tokenizer)
    assert len(s.turns) == 2
    _check_images(s, pad, pads, [(d, SIZES[1]), (e, SIZES[0]), (f, SIZES[1])])


# -- (d) tito: the proxy renders, vLLM's token-in endpoint expands the images ----------------------


def test_tito_browser_session_against_vllms_token_in_endpoint(
    vlm_server: VLLMServer, vlm_tap: Tap, proxy_factory: Any, sqlite_url: str, pads: Pads, pad: int
) -> None:
    """tito with a VLM: the proxy renders the conversation with the model's template (one pad per
    image), sends ids + images to ``/inference/v1/generate``, and records vLLM's expanded prompt;
    each turn extends the last exactly while the screenshots stay, a dropped one starts a branch."""
    proxy = proxy_factory(vlm_tap.url, sqlite_url, mode="tito", tokenizer=str(vlm_server.model_dir))
    sid = "vlm-tito"
    oc = openai.OpenAI(base_url=f"{proxy.url}/s/{sid}/v1", api_key="x", max_retries=0, timeout=300)
    turns = KEEP + 1
    shots = [screenshot(10 + i, SIZES[i % 2]) for i in range(turns)]
    replies: list[str] = []
    first = len(vlm_tap.log)
    for t in range(turns):
        msgs = _browser_messages(shots[: t + 1], replies)
        r = oc.chat.completions.create(model=VLM_MODEL, messages=msgs, max_tokens=MAX, seed=t)  # type: ignore[arg-type]
        replies.append(r.choices[0].message.content or "")
    proxy.flush()
    calls = proxy.store().calls(sid)
    exes = vlm_tap.log[first:]
    assert len(calls) == len(exes) == turns
    sizes = [SIZES[i % 2] for i in range(turns)]
    for t, (call, ex) in enumerate(zip(calls, exes)):
        shown = list(range(max(0, t + 1 - KEEP), t + 1))
        assert ex.path == "/inference/v1/generate" and ex.status == 200
        sent = ex.request["token_ids"]
        assert sent.count(pad) == len(shown)  # one placeholder per image, as the template writes it
        assert [p["url"] for p in ex.request["content_parts"]] == [data_url(shots[i]) for i in shown]
        answer = ex.json()
        assert list(call.prompt_ids) == answer["prompt_token_ids"]  # the server's expanded prompt
        assert list(call.completion_ids) == answer["choices"][0]["token_ids"]
        runs = image_runs(list(call.prompt_ids), pad)
        assert [e - s for s, e in runs] == [pads[sizes[i]] for i in shown]
        assert call.metadata["tito"]["images"] == len(shown)
    for t in range(1, KEEP):  # the screenshots stay: the exact history, then the new turn
        prev = calls[t - 1]
        head = list(prev.prompt_ids) + list(prev.completion_ids)
        assert list(calls[t].prompt_ids)[: len(head)] == head and calls[t].metadata["tito"]["fresh"] is False
    assert calls[KEEP].metadata["tito"]["fresh"] is True  # the oldest screenshot dropped: a new branch
    samples = _samples(proxy, sid, vlm_server.tokenizer)
    assert len(samples) == 2 and samples[1].metadata["images_dropped"] == 1
    _check_images(samples[0], pad, pads, [(shots[i], sizes[i]) for i in range(KEEP)])
    _check_images(samples[1], pad, pads, [(shots[i], sizes[i]) for i in range(1, KEEP + 1)])
