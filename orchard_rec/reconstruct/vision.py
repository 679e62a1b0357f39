"""Where a vision-language prompt's images sit among its token ids.

A VLM server expands each image placeholder of the rendered prompt into a run of image
tokens (Qwen2-VL: ``<|vision_start|>`` then t·h·w/4 ``<|image_pad|>`` then ``<|vision_end|>``),
and returns those expanded ids. The runs are prompt/observation tokens, so reconstruction
masks them 0 like every other observation; ``image_runs`` finds them, given the image token's
id (``image_token_id`` reads it from a tokenizer; it lives with the image refs, ``dialects.images``,
where the proxy's tito reads it too), so a sample can say which positions belong to
which of its images (``metadata.image_spans``, one ``[start, end)`` per image, in order).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchard_rec.dialects.images import IMAGE_TOKENS, image_token_id

__all__ = ["IMAGE_TOKENS", "image_runs", "image_token_id"]


def image_runs(tokens: Sequence[int], image_token: int) -> list[list[int]]:
    """``[start, end)`` of every maximal run of ``image_token`` in ``tokens``, in order."""
    runs: list[list[int]] = []
    start = -1
    for i, t in enumerate(tokens):
        if t == image_token:
            if start < 0:
                start = i
        elif start >= 0:
            runs.append([start, i])
            start = -1
    if start >= 0:
        runs.append([start, len(tokens)])
    return runs
