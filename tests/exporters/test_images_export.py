"""Every format writes a sample's images; each consumer's loader gets them back pixel-equal.

A GUI-like session (screenshots made by Pillow, the harness keeping its last two, so the
prefix breaks and reconstruction splits per turn) and a text session are built as call
records (``tests.factories``), reconstructed with the image token known, exported to every
format, and read back the way the consumer reads them: jsonl rows + the sidecar files with PIL; parquet / trl / trl-grpo with
``datasets.load_dataset``; slime with ``torch.load`` (slime's ``--load-debug-rollout-data``);
verl and verl-sft with pandas / pyarrow and verl's ``process_image`` bytes branch
(``Image.open(BytesIO(image["bytes"]))``, verl/utils/dataset/vision_utils.py; its
``qwen_vl_utils.fetch_image`` then resizes to multiples of 28, which these sizes already are).
Images must equal the screenshots the sample's prompt showed, in order (mode, size, pixels),
and tokens must equal the jsonl export's.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from PIL import Image

from orchard_rec.exporters import get, read_jsonl
from orchard_rec.exporters.contracts import SLIME_FIELDS, SlimeSample, agent_loop_fields
from orchard_rec.exporters.conversation import conversation_of
from orchard_rec.reconstruct import reconstruct
from orchard_rec.reconstruct.generation import generations_of
from tests.factories import call

PAD = 99  # the image token


def _encoded(color: tuple[int, int, int], size: tuple[int, int], fmt: str = "PNG") -> tuple[bytes, str]:
    im = Image.new("RGB", size, color)
    for x in range(0, size[0], 7):  # some structure, so pixel equality means something
        im.putpixel((x, x * size[1] // size[0]), (x % 256, 255 - x % 256, 17))
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue(), "image/jpeg" if fmt == "JPEG" else "image/png"


# 112x84 -> 12 image tokens, 224x168 -> 48 (Qwen2-VL: one pad per 2x2 merged 14-px patch)
SHOTS = [
    _encoded((200, 30, 30), (112, 84)),
    _encoded((30, 200, 30), (224, 168)),
    _encoded((30, 30, 200), (112, 84), "JPEG"),
    _encoded((90, 90, 90), (112, 84)),
]
RUN = {(112, 84): 12, (224, 168): 48}


def _pixels(b: bytes) -> Image.Image:
    with Image.open(io.BytesIO(b)) as im:
        return im.convert("RGB")


def _same(a: Image.Image, b: Image.Image) -> bool:
    return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()


def _user(k: int, shots: list[int]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": f"step {k}"}]
    for i in shots:
        data, mime = SHOTS[i]
        url = f"data:{mime};base64," + base64.b64encode(data).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def _image_ids(i: int) -> list[int]:
    size = _pixels(SHOTS[i][0]).size
    return [3, *([PAD] * RUN[size]), 4]


def _gui_calls(session: str, t0: float) -> list[Any]:
    """Turn k shows screenshot k; the harness keeps the last two screenshots in its history."""
    calls = []
    history: list[tuple[int, list[int]]] = []  # (screenshot, the assistant's ids after it)
    for k in range(4):
        history.append((k, []))
        kept = history[-2:]
        messages: list[dict[str, Any]] = [{"role": "system", "content": "navigate"}]
        prompt = [1]
        for j, (shot, answer) in enumerate(kept):
            messages.append(_user(shot, [shot]))
            prompt += [10 + shot, *_image_ids(shot)]
            if j < len(kept) - 1:
                messages.append({"role": "assistant", "content": f"click {shot}"})
                prompt += answer
        completion = [50 + k, 60 + k, 2]
        history[-1] = (k, completion)
        calls.append(
            call(
                session,
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=[-0.5, -0.25, -0.125],
                request={"model": "vlm", "messages": messages},
                response={
                    "id": f"r{k}",
                    "object": "chat.completion",
                    "model": "vlm",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": f"click {k}"},
                            "finish_reason": "stop",
                        }
                    ],
                },
                received_at=t0 + k,
            )
        )
    return calls


def _text_calls(session: str, t0: float) -> list[Any]:
    return [
        call(
            session,
            prompt_ids=[1, 7, 8],
            completion_ids=[9, 2],
            logprobs=[-0.1, -0.2],
            request={"model": "vlm", "messages": [{"role": "user", "content": "hi"}]},
            response={
                "id": "t",
                "object": "chat.completion",
                "model": "vlm",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}
                ],
            },
            received_at=t0,
        )
    ]


def _samples() -> list[Any]:
    """The samples ``iter_samples`` would give (running index, messages attached), reconstructed
    from the call records with the image token known."""
    out = []
    for calls in (_text_calls("a-text", 1000.0), _gui_calls("b-gui", 2000.0)):
        gens, _ = generations_of(calls)
        by_id = {c.call_id: c for c in calls}
        for s in reconstruct(gens, session_id=calls[0].session_id or "", image_token=PAD):
            s.index = len(out)
            s.messages, s.tools = conversation_of(by_id[s.turns[-1].call_id])
            _shots_of_call.update({c.call_id: _shots(c) for c in calls})
            out.append(s)
    return out


def _shots(c: Any) -> list[int]:
    urls = [
        p["image_url"]["url"]
        for m in c.request["messages"]
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image_url"
    ]
    encoded = [f"data:{m};base64," + base64.b64encode(d).decode() for d, m in SHOTS]
    return [encoded.index(u) for u in urls]


_shots_of_call: dict[str, list[int]] = {}


def _expected(s: Any) -> list[Image.Image]:
    """The screenshots the sample's prompt showed (its last call's request), in order."""
    return [_pixels(SHOTS[i][0]) for i in _shots_of_call[s.metadata["call_ids"][-1]]]


def _export(fmt: str, out: Path, samples: list[Any] | None = None) -> Any:
    options = {"processor": "demo"} if fmt == "slime" else {}
    return get(fmt, **options).write(iter(samples if samples is not None else _samples()), out)


def _reference(tmp: Path) -> list[Any]:
    _export("jsonl", tmp / "ref.jsonl")
    return list(read_jsonl(tmp / "ref.jsonl"))


def test_reconstruction_gives_per_turn_samples_with_their_screenshots(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = _reference(tmp_path)
    gui = [r for r in ref if r.session_id == "b-gui"]
    # turns 0+1 merge (the history keeps both screenshots); turns 2 and 3 drop the oldest: one sample each
    assert [len(r.turns) for r in gui] == [2, 1, 1]
    assert [bool(r.metadata.get("images_dropped")) for r in gui] == [False, True, True]
    assert [len(r.images) for r in gui] == [2, 2, 2]
    for r in gui:
        spans = r.metadata["image_spans"]
        assert [e - s for s, e in spans] == [RUN[(im.width, im.height)] for im in r.images]


def test_jsonl_sidecar_files_written_once_and_read_with_pil(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ref = _reference(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "ref.jsonl").read_text().splitlines()]
    folder = tmp_path / "ref.jsonl.images"
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 4 and not [
        f for f in files if f.startswith(".")
    ]  # 4 distinct screenshots, once each
    assert sum(f.endswith(".jpg") for f in files) == 1
    for row, r in zip(rows, ref):
        assert row["tokens"] == r.tokens
        got = []
        for entry in row.get("images", []):
            assert not Path(entry["path"]).is_absolute()
            with Image.open(tmp_path / entry["path"]) as im:
                got.append(im.convert("RGB"))
        want = _expected(r)
        assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))
    # read back, the samples carry the sidecar's bytes: they export again with their images
    again = list(read_jsonl(tmp_path / "ref.jsonl"))
    assert [[im.data for im in s.images] for s in again] == [[im.data for im in s.images] for s in _samples()]
    assert all(im.data is None for s in read_jsonl(tmp_path / "ref.jsonl", images=False) for im in s.images)
    # a second export into the same folder rewrites nothing (names are content hashes)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    _export("jsonl", tmp_path / "ref.jsonl")
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


@pytest.mark.slow  # importing datasets: 1-2 s (test_text_only_exports_have_no_images_column stays fast)
@pytest.mark.parametrize("fmt", ["parquet", "trl", "trl-grpo"])
def test_columnar_images_load_as_pil_with_datasets(tmp_path, fmt) -> None:  # type: ignore[no-untyped-def]
    import datasets

    ref = _reference(tmp_path)
    _export(fmt, tmp_path / "x.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "x.parquet"), split="train")
    assert isinstance(ds.features["images"], datasets.List)
    assert isinstance(ds.features["images"].feature, datasets.Image)
    assert len(ds) == len(ref)
    for ex, r in zip(ds, ref):
        tokens = {
            "parquet": lambda e: e["tokens"],
            "trl": lambda e: e["input_ids"],
            "trl-grpo": lambda e: e["prompt_ids"] + e["completion_ids"],
        }[fmt](ex)
        assert tokens == r.tokens
        got = [im.convert("RGB") for im in ex["images"]]
        want = _expected(r)
        assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))


def test_text_only_exports_have_no_images_column(tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = [s for s in _samples() if not s.images]
    for fmt in ("parquet", "trl", "trl-grpo", "verl", "verl-sft"):
        _export(fmt, tmp_path / f"{fmt}.parquet", text)
        schema = pq.read_schema(tmp_path / f"{fmt}.parquet")
        assert "images" not in schema.names, fmt
        assert schema.metadata is None or b"huggingface" not in schema.metadata


@pytest.mark.slow  # importing torch: 2-3 s
def test_slime_multimodal_inputs_and_runs_as_orchard_gui_builds_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    ref = _reference(tmp_path)
    _export("slime", tmp_path / "r.pt")
    data = torch.load(tmp_path / "r.pt", weights_only=False)  # slime/ray/rollout.py
    assert b"orchard_rec" not in (tmp_path / "r.pt").read_bytes()
    samples = data["samples"]
    # one sample per turn, as Orchard's GUI generator writes them: the merged turns 0+1 are split
    turns = [(r, k) for r in ref for k in range(len(r.turns))]
    assert len(samples) == len(turns)
    gui = []
    for d, (r, k) in zip(samples, turns):
        assert set(d) == set(SLIME_FIELDS)
        s = SlimeSample.from_dict(d)
        t = r.turns[k]
        assert s.tokens == r.tokens[: r.prompt_length + t.end]
        assert s.loss_mask == r.loss_mask[t.start : t.end]
        if not r.images:
            assert s.multimodal_inputs is None and s.multimodal_train_inputs is None
            continue
        gui.append(s)
        want = _expected(r)[: len(s.metadata["image_spans"])]
        got = s.multimodal_inputs["images"]
        assert all(isinstance(im, Image.Image) for im in got)
        assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))
        # the processor's output for exactly those images: one grid per image, t*h*w/4 = its run of pads
        grid = s.multimodal_train_inputs["image_grid_thw"].tolist()
        assert [t * h * w // 4 for t, h, w in grid] == [e - b for b, e in s.metadata["image_spans"]]
        assert s.tokens.count(PAD) == sum(t * h * w // 4 for t, h, w in grid)
    # one run: every per-turn sample shares the run's id; Orchard's turn-level metadata on each
    assert len({s.group_id for s in gui}) == 1 and gui[0].group_id == gui[0].index
    assert {s.group_index for s in gui} == {gui[0].group_id}  # vanilla slime's grouping key, set too
    assert [s.metadata["turn_index"] for s in gui] == [0, 1, 2, 3]  # the step numbers
    assert [s.metadata["is_last_turn"] for s in gui] == [False, False, False, True]
    assert {s.metadata["num_turns_in_trajectory"] for s in gui} == {4}
    text = [SlimeSample.from_dict(d) for d in samples if d["session_id"] == "a-text"]
    assert text[0].group_id == text[0].index and "turn_index" not in text[0].metadata


def test_slime_images_need_the_processor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from orchard_rec.errors import ExportError

    with pytest.raises(ExportError, match="--processor"):
        get("slime").write(iter(_samples()), tmp_path / "r.pt")


def _verl_image(image: Any) -> Image.Image:
    """verl/utils/dataset/vision_utils.py ``process_image``: a dict with ``bytes`` is opened
    with PIL (``fetch_image`` then only resizes to multiples of 28: these sizes already are)."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    assert "bytes" in image
    return Image.open(io.BytesIO(image["bytes"])).convert("RGB")


def test_verl_images_column_and_multi_modal_data(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd

    ref = _reference(tmp_path)
    _export("verl", tmp_path / "v.parquet")
    df = pd.read_parquet(tmp_path / "v.parquet")
    assert len(df) == len(ref)
    for (_, row), r in zip(df.iterrows(), ref):
        assert list(row["prompt_ids"]) + list(row["response_ids"]) == r.tokens
        got = [_verl_image(dict(i)) for i in row["images"]]
        want = _expected(r)
        assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))
    # in process (trainers.verl): AgentLoopOutput.multi_modal_data = {"images": [PIL ...]}
    for s in _samples():
        mm = agent_loop_fields(s)["multi_modal_data"]
        want = _expected(s)
        if not want:
            assert mm is None
        else:
            assert len(mm["images"]) == len(want) and all(_same(a, b) for a, b in zip(mm["images"], want))


def test_verl_sft_image_placeholders_pair_with_images(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import re

    import pandas as pd

    ref = _reference(tmp_path)
    _export("verl-sft", tmp_path / "s.parquet")
    df = pd.read_parquet(tmp_path / "s.parquet")  # verl/utils/dataset/multiturn_sft_dataset.py
    assert len(df) == len(ref)
    for (_, row), r in zip(df.iterrows(), ref):
        images = list(row["images"])
        # MultiTurnSFTDataset._build_messages: each <image> segment takes the next image, in order
        k = 0
        got = []
        for m in row["messages"]:
            for seg in re.split("(<image>|<video>)", m["content"] or ""):
                if seg == "<image>":
                    got.append(_verl_image(dict(images[k])))
                    k += 1
        assert k == len(images)
        want = _expected(r)
        assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))


def test_formats_without_images_say_so(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    for fmt, name in (("openrlhf", "o.jsonl"), ("value", "v.parquet")):
        caplog.clear()
        with caplog.at_level("WARNING"):
            _export(fmt, tmp_path / name)
        assert [r for r in caplog.records if "does not carry images" in r.getMessage()], fmt


@pytest.mark.slow  # a fresh interpreter for the stdout case
def test_images_column_added_after_text_row_groups(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Row groups of text samples already written when the first image comes are rewritten once."""
    import datasets

    from orchard_rec.exporters.columnar import write_parquet
    from orchard_rec.exporters.parquet import SCHEMA, _row

    samples = _samples()
    assert not samples[0].images and samples[1].images  # text first
    write_parquet(iter(samples), tmp_path / "p.parquet", SCHEMA, _row, batch=1, images=True)
    assert pq.ParquetFile(tmp_path / "p.parquet").metadata.num_row_groups == len(samples)
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "p.parquet"), split="train")
    assert ds[0]["images"] == [] and ds[0]["tokens"] == samples[0].tokens
    for ex, s in zip(ds, samples):
        want = _expected(s)
        got = [im.convert("RGB") for im in ex["images"]]
        assert ex["tokens"] == s.tokens
        assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))
    # to stdout (no rewrite possible) the column is there from the start
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, '.');"
        "from tests.exporters.test_images_export import _samples;"
        "from orchard_rec.exporters import get; from pathlib import Path;"
        "get('parquet').write(iter([s for s in _samples() if not s.images]), Path('-'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    (tmp_path / "stdout.parquet").write_bytes(out)
    assert "images" in pq.read_schema(tmp_path / "stdout.parquet").names


@pytest.mark.slow  # its slime export imports torch: 2-3 s (the last fast-tier test that did)
def test_exports_from_the_database_carry_the_recorded_screenshots(db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Through ``Store.write_batch`` (images stored once) and ``export``: the same samples, images
    and per-turn runs as reconstructing the call records directly."""
    import torch

    from orchard_rec.exporters.pipeline import export
    from orchard_rec.storage import Store

    url = db_url
    store = Store(url)
    store.upgrade()
    store.write_batch(_text_calls("a-text", 1000.0) + _gui_calls("b-gui", 2000.0))
    store.close()
    want = _samples()
    export(url, "jsonl", tmp_path / "db.jsonl", image_token=PAD)
    rows = [json.loads(line) for line in (tmp_path / "db.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [s.tokens for s in want]
    for row, s in zip(rows, want):
        assert [i["digest"] for i in row.get("images", [])] == [im.digest for im in s.images]
        assert row["metadata"].get("images_dropped") == s.metadata.get("images_dropped")
        got = []
        for entry in row.get("images", []):
            with Image.open(tmp_path / entry["path"]) as im:
                got.append(im.convert("RGB"))
        assert all(_same(a, b) for a, b in zip(got, (_pixels(im.data) for im in s.images)))
    export(url, "slime", tmp_path / "db.pt", image_token=PAD, format_options={"processor": "demo"})
    gui = [d for d in torch.load(tmp_path / "db.pt", weights_only=False)["samples"] if d["multimodal_inputs"]]
    assert [d["metadata"]["turn_index"] for d in gui] == [0, 1, 2, 3] and len(
        {d["group_id"] for d in gui}
    ) == 1
    assert all(
        d["multimodal_train_inputs"]["image_grid_thw"].shape[0] == len(d["multimodal_inputs"]["images"])
        for d in gui
    )


@pytest.mark.slow  # importing transformers takes ~15 s on a loaded machine
def test_the_trainers_processor_gives_grids_that_match_the_image_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """slime's trainer computes ``multimodal_train_inputs`` from ``multimodal_inputs["images"]`` with
    the model's processor: Qwen2-VL's image processor (min/max pixels 56²/224², as the tiny VLM
    of issue 21) gives each image a grid whose t·h·w/4 is exactly its run of image tokens."""
    import torch
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=224 * 224)
    _export("slime", tmp_path / "r.pt")
    for d in torch.load(tmp_path / "r.pt", weights_only=False)["samples"]:
        if not d["multimodal_inputs"]:
            continue
        out = processor(images=d["multimodal_inputs"]["images"], return_tensors="pt")
        runs = [e - s for s, e in d["metadata"]["image_spans"]]
        assert [int(t * h * w) // 4 for t, h, w in out["image_grid_thw"].tolist()] == runs
        assert out["pixel_values"].shape[0] == sum(runs) * 4


def test_verl_sft_places_tool_result_screenshots_of_messages_calls(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Computer-use screenshots inside an Anthropic ``tool_result`` land in the tool message."""
    import re

    import pandas as pd

    from orchard_rec.records import Dialect

    b64 = [base64.b64encode(SHOTS[i][0]).decode() for i in (0, 1)]
    image = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b}} for b in b64
    ]
    request = {
        "model": "vlm",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "open the cart"}, image[0]]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "computer", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "ok"}, image[1]],
                    }
                ],
            },
        ],
    }
    response = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": "vlm",
        "content": [{"type": "text", "text": "done"}],
        "stop_reason": "end_turn",
    }
    c = call(
        "anthropic",
        prompt_ids=[1, *_image_ids(0), 5, 6, *_image_ids(1), 7],
        completion_ids=[8, 2],
        logprobs=[-0.1, -0.2],
        dialect=Dialect.MESSAGES,
        request=request,
        response=response,
    )
    [s] = reconstruct(generations_of([c])[0], session_id="anthropic", image_token=PAD)
    s.messages, s.tools = conversation_of(c)
    _export("verl-sft", tmp_path / "a.parquet", [s])
    row = pd.read_parquet(tmp_path / "a.parquet").iloc[0]
    placed = [
        (m["role"], seg)
        for m in row["messages"]
        for seg in re.split("(<image>)", m["content"] or "")
        if seg == "<image>"
    ]
    assert [r for r, _ in placed] == ["user", "tool"]
    got = [_verl_image(dict(i)) for i in row["images"]]
    assert all(_same(a, _pixels(SHOTS[i][0])) for a, i in zip(got, (0, 1))) and len(got) == 2
