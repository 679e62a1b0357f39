"""``verify`` on a vision sample: the scorer runs the model's image processor on the sample's own
images (a tiny random Qwen2-VL built here, its PIL image processor: no torchvision). The
recorded log-probs come from this test's own forward pass; another image is caught."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.demo.tokenizer import save_tokenizer
from orchard_rec.exporters import get
from orchard_rec.protocol.images import image_ref
from orchard_rec.reconstruct import Sample, Turn

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vllm"))
from vlm_model import VISION_TOKENS, _add_vision_tokens  # noqa: E402

MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112  # 112x84 -> a 6x8 patch grid -> 12 image pads


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    torch = pytest.importorskip("torch")
    t = pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("tiny-qwen2-vl")
    save_tokenizer(d)
    _add_vision_tokens(d)
    tok = t.AutoTokenizer.from_pretrained(str(d))
    ids = {k: tok.convert_tokens_to_ids(k) for k in ["<|im_end|>", *VISION_TOKENS]}
    text = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1}
    text |= {"num_attention_heads": 4, "num_key_value_heads": 4, "bos_token_id": None, "eos_token_id": None}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}
    vision = {
        "depth": 1,
        "embed_dim": 32,
        "hidden_size": 64,
        "mlp_ratio": 2,
        "num_heads": 2,
        "patch_size": 14,
    }
    cfg = t.Qwen2VLConfig(
        text_config=text,
        vision_config=vision | {"spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    t.Qwen2VLForConditionalGeneration(cfg).save_pretrained(str(d))
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS).save_pretrained(str(d))
    return d, ids


def _png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (112, 84), color).save(buf, format="PNG")
    return buf.getvalue()


def _sample(d: Path, ids: dict[str, int]) -> Sample:
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    png = _png((200, 30, 30))
    prompt = [1, 10, 207, ids["<|vision_start|>"], *[ids["<|image_pad|>"]] * 12, ids["<|vision_end|>"]]
    prompt += [40, 41, 2, 207, 1, 11, 207]
    gen = [60, 61, 62, 63, ids["<|im_end|>"]]
    tokens = prompt + gen
    model = AutoModelForImageTextToText.from_pretrained(str(d), dtype=torch.float32).eval()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    pix = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)(
        images=[image], return_tensors="pt"
    )
    ids_t = torch.tensor([tokens])
    kinds = (ids_t == ids["<|image_pad|>"]).long()  # the processor's mm_token_type_ids: 1 on image pads
    with torch.no_grad():
        logp = model(input_ids=ids_t, mm_token_type_ids=kinds, **pix).logits[0].log_softmax(-1)
    n = len(prompt)
    lps = [float(logp[n + r - 1, tokens[n + r]]) for r in range(len(gen))]
    meta: dict[str, Any] = {"branch": 0}
    s = Sample("vis", tokens, len(gen), [1] * len(gen), lps, [Turn("c1", 0, len(gen))], metadata=meta)
    s.images = [image_ref(png, "image/png")]
    return s


def _verify(d: Path, path: Path) -> tuple[int, list[dict[str, Any]]]:
    r = CliRunner().invoke(app, ["verify", "--model", str(d), "-i", str(path), "--json"])
    return r.exit_code, [orjson.loads(x) for x in r.output.splitlines() if x.startswith("{")]


def test_a_vision_sample_is_scored_with_its_own_images(vlm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    d, ids = vlm
    s = _sample(d, ids)
    get("jsonl").write([s], tmp_path / "v.jsonl")  # the image goes to the sidecar folder
    code, rows = _verify(d, tmp_path / "v.jsonl")
    assert code == 0 and rows[0]["status"] == "ok" and rows[0]["max_abs"] < 1e-5, rows
    other = image_ref(_png((10, 200, 10)), "image/png")  # another screenshot, same size
    s.images = [other]
    get("jsonl").write([s], tmp_path / "w.jsonl")
    code, rows = _verify(d, tmp_path / "w.jsonl")
    assert code == 1 and rows[0]["status"] == "misaligned", rows
