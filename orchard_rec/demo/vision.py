"""The demo's vision side: how many ``<|image_pad|>`` tokens an image becomes, as Qwen2-VL says.

Qwen2-VL's image processor (transformers ``Qwen2VLImageProcessor``, ``smart_resize``) resizes
an image so that both sides are multiples of ``factor = patch_size * merge_size`` (14 * 2 = 28)
and its area lies within ``[min_pixels, max_pixels]``, keeping the aspect ratio as closely as
it can; it is cut into 14×14 patches (``grid_thw = (1, h / 14, w / 14)`` for one image: the
frame is repeated to the temporal patch size 2, which makes one temporal patch), and every 2×2
block of patches is merged into one token: ``t * h * w / merge_size**2`` pads. vLLM replaces
the one ``<|image_pad|>`` the chat template writes per image with that many, and returns the
expanded ids as ``prompt_token_ids``; ``expand`` does the same here.

Written from transformers' source (``models/qwen2_vl/image_processing_qwen2_vl.py``), not
imported from it: the tests compare the two. Defaults are the test model's (issue 21): min/max
pixels 56²/224², so a screenshot costs 4 to 64 tokens; ``VisionConfig.qwen2_vl()`` has Qwen2-VL's
real defaults (56² .. 28²·1280).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ImageError", "VisionConfig", "expand", "image_size", "smart_resize"]


class ImageError(ValueError):
    """An image the demo server cannot read (bad base64, not an image, a remote URL)."""


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 224 * 224
) -> tuple[int, int]:
    """``(height, width)`` of the resized image: multiples of ``factor``, area within the bounds."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VisionConfig:
    """A Qwen2-VL image processor's geometry (``preprocessor_config.json``)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 224 * 224
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2

    @classmethod
    def qwen2_vl(cls) -> VisionConfig:
        """Qwen2-VL's released defaults (``min_pixels`` 56², ``max_pixels`` 28²·1280)."""
        return cls(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)

    @classmethod
    def from_preprocessor_config(cls, path: str | Path) -> VisionConfig:
        """Read a model folder's ``preprocessor_config.json`` (or the file itself)."""
        p = Path(path)
        cfg = json.loads((p / "preprocessor_config.json" if p.is_dir() else p).read_text())
        size = cfg.get("size") or {}
        return cls(
            min_pixels=int(cfg.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
            max_pixels=int(cfg.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
            patch_size=int(cfg.get("patch_size", 14)),
            merge_size=int(cfg.get("merge_size", 2)),
            temporal_patch_size=int(cfg.get("temporal_patch_size", 2)),
        )

    def preprocessor_config(self) -> dict[str, Any]:
        """This geometry as the ``preprocessor_config.json`` of a Qwen2-VL model folder."""
        return {
            "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2VLProcessor",
            "do_resize": True,
            "do_rescale": True,
            "do_normalize": True,
            "do_convert_rgb": True,
            "resample": 3,
            "rescale_factor": 1 / 255,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
        }

    def grid_thw(self, width: int, height: int) -> tuple[int, int, int]:
        """The image's patch grid ``(t, h, w)`` after ``smart_resize``."""
        h, w = smart_resize(
            height,
            width,
            factor=self.patch_size * self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )
        return 1, h // self.patch_size, w // self.patch_size

    def tokens(self, width: int, height: int) -> int:
        """How many ``<|image_pad|>`` tokens the image becomes."""
        t, h, w = self.grid_thw(width, height)
        return t * h * w // (self.merge_size**2)


def image_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of image bytes (Pillow); ``ImageError`` when they are not an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ImageError(f"cannot identify image file: {exc}") from None
    if w < 1 or h < 1:
        raise ImageError("an image of zero size")
    return int(w), int(h)


def expand(ids: Sequence[int], pad: int, counts: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """``ids`` with the k-th ``pad`` repeated ``counts[k]`` times, and each run's ``(offset, length)``.

    The number of pads in ``ids`` must equal ``len(counts)`` (one placeholder per image, as the
    chat template writes them): otherwise ``ImageError``, as vLLM refuses a prompt whose
    placeholders and images differ in number.
    """
    n = sum(1 for i in ids if i == pad)
    if n != len(counts):
        raise ImageError(
            f"the prompt has {n} image placeholder(s) for {len(counts)} image(s): "
            "render it with the model's chat template (one <|image_pad|> per image)"
        )
    out: list[int] = []
    runs: list[tuple[int, int]] = []
    k = 0
    for i in ids:
        if i == pad:
            runs.append((len(out), counts[k]))
            out.extend([pad] * counts[k])
            k += 1
        else:
            out.append(i)
    return out, runs
