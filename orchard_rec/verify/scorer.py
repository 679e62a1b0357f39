"""Per-token log-probs by teacher forcing with Hugging Face ``transformers``, as a trainer computes them.

``Scorer(model)`` loads the model once (``AutoModelForCausalLM``; a vision-language model
through ``AutoModelForImageTextToText`` when the causal-LM class does not take it) and gives,
for a sample, the log-prob of each response token given every token before it: one forward
pass over ``tokens``, ``log_softmax`` of the logits at positions ``prompt_length - 1 ...
len - 2`` (in float32, a chunk of rows at a time), gathered at the next token. A sample with
images gets the model's processor's image inputs (``pixel_values``, ``image_grid_thw`` for
Qwen2-VL) from the sample's own images, in order; the ids already hold the image tokens.

torch and transformers (the ``hf`` and ``train`` extras) are imported when a ``Scorer`` is made.
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import Any

from orchard_rec.errors import UsageError
from orchard_rec.verify.compare import SampleView

__all__ = ["DTYPES", "Scorer"]

DTYPES = ("float32", "bfloat16", "float16")
_ROWS = 1024
"""Logit rows turned into log-probs at once (bounds the float32 copy at rows x vocabulary)."""


def _pil(image: Any) -> Any:
    """A PIL image from a PIL image or an orchard ``ImageRef`` with its bytes."""
    data = getattr(image, "data", None)
    if data is None:
        if hasattr(image, "convert"):
            return image.convert("RGB")
        raise UsageError("a sample's image has no bytes (export with its images, or read from the database)")
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


class Scorer:
    """A model loaded once, scoring samples one at a time."""

    def __init__(self, model: str, *, dtype: str = "float32", device: str = "cpu") -> None:
        if dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}")
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise UsageError(
                "verify needs torch and transformers: pip install 'orchard-rec[hf,train]'"
            ) from exc
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UsageError("--device cuda, but torch sees no CUDA device: use --device cpu")
        self.torch = torch
        self.device = device
        self.name = model
        transformers.utils.logging.disable_progress_bar()  # the report is the output
        torch_dtype = getattr(torch, dtype)
        kw: dict[str, Any] = {"dtype": torch_dtype}
        if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().is_dir():
            raise UsageError(f"no model folder at {model}")
        try:
            try:
                self.model = transformers.AutoModelForCausalLM.from_pretrained(model, **kw)
            except ValueError:  # a vision-language model the causal-LM auto class does not map
                self.model = transformers.AutoModelForImageTextToText.from_pretrained(model, **kw)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot load model {model!r}: {exc}".splitlines()[0]) from exc
        self.model.to(device).eval()  # type: ignore[arg-type]
        self._processor: Any = None

    def image_processor(self) -> Any:
        """The model's image processor (the processor's image part; without the rest, which may
        need more than images do: Qwen2-VL's video processor wants torchvision)."""
        if self._processor is None:
            from transformers import AutoImageProcessor, AutoProcessor

            try:
                self._processor = AutoImageProcessor.from_pretrained(self.name)
            except (OSError, ValueError):
                proc = AutoProcessor.from_pretrained(self.name)
                self._processor = getattr(proc, "image_processor", proc)
        return self._processor

    def _image_inputs(self, images: list[Any], ids: Any) -> dict[str, Any]:
        out = self.image_processor()(images=[_pil(im) for im in images], return_tensors="pt")
        extra = {k: v.to(self.device) for k, v in out.items() if hasattr(v, "to")}
        if "mm_token_type_ids" in inspect.signature(self.model.forward).parameters:
            # multimodal RoPE (Qwen2-VL in transformers 5) wants each position's modality,
            # which its processor gives beside input_ids: 1 on image tokens, 2 on video tokens
            cfg = self.model.config
            kinds = self.torch.zeros_like(ids)
            for kind, name in ((1, "image_token_id"), (2, "video_token_id")):
                tid = getattr(cfg, name, None)
                if tid is not None:
                    kinds[ids == tid] = kind
            extra["mm_token_type_ids"] = kinds
        return extra

    def log_probs(self, view: SampleView) -> list[float]:
        """The model's log-prob of each response token of ``view`` (len = response_length)."""
        torch = self.torch
        if view.prompt_length < 1:
            raise ValueError(f"sample {view.index}: no prompt token to condition the first response token on")
        ids = torch.tensor([view.tokens], dtype=torch.long, device=self.device)
        extra = self._image_inputs(view.images, ids) if view.images else {}
        with torch.no_grad():
            logits = self.model(input_ids=ids, **extra).logits[0]
            rows = logits[view.prompt_length - 1 : len(view.tokens) - 1]
            target = ids[0, view.prompt_length :]
            out: list[float] = []
            for k in range(0, rows.shape[0], _ROWS):
                lp = torch.log_softmax(rows[k : k + _ROWS].float(), dim=-1)
                out += lp.gather(1, target[k : k + _ROWS, None])[:, 0].tolist()
        return out
