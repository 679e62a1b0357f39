"""A tiny random-weight Qwen2-VL vLLM can serve, built offline in seconds (issue 21's Facts).

The demo tokenizer (``orchard_rec.demo.tokenizer.save_tokenizer``, written into the folder
first) gains Qwen2-VL's vision tokens (``<|vision_start|>``, ``<|vision_end|>``,
``<|image_pad|>``, ``<|video_pad|>``) and a Qwen2-VL chat template (below); a random
``Qwen2VLForConditionalGeneration`` (text: hidden 128, 2 layers, 4 heads, mrope section
[4, 6, 6]; vision: depth 1, embed_dim 64, patch 14, spatial merge 2) and a
``Qwen2VLProcessor`` with min/max pixels 56²/224² are saved with ``save_pretrained``. Run with
the vLLM venv's own ``transformers`` (which has torchvision, see ``install.sh``), so vLLM reads
the config it writes; it imports nothing of orchard_rec. As in ``model.py``, the ``<|im_end|>``
row of ``lm_head`` is set so sampled turns end on their own after ~1/eos_rate tokens; unlike
there, the model speaks only tokens `` word`` that re-tokenize to themselves (``_speak_only``), so
a client that resends its history (text, not ids) extends the recorded prompt + completion ids.

With min/max pixels 56²/224², an image is resized to multiples of 28 within those bounds and
becomes t·h·w/4 ``<|image_pad|>`` (one per 2×2 merged 14-pixel patch): 112×84 → 12, 224×168 → 48.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "VISION_TOKENS", "build_vlm"]

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL's placeholder rendering (an image part → <|vision_start|><|image_pad|><|vision_end|>
# where it sits) with the Hermes tool format of Qwen2.5-VL / Qwen3-VL (tools in the system
# turn, <tool_call> in assistant turns, tool results as <tool_response> inside a user turn,
# images included). Content is iterated as parts: vLLM serves it with
# --chat-template-content-format openai (a string content becomes one text part).
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is not none -%}{%- for part in content -%}"
    "{%- if part is string -%}{{- part -}}"
    "{%- elif part.type == 'image' or part.type == 'image_url' or 'image' in part or 'image_url' in part -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part.type == 'video' or 'video' in part -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in part -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- render(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- elif messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + render(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + render(message.content) -}}"
    "{%- for tc in message.tool_calls or [] -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if loop.first and message.content -%}{{- '\\n' -}}{%- elif not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' -}}'
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

BIAS = 0.1
"""The constant hidden feature (see ``_speak_only``): small next to the rest of the residual stream."""
SUPPRESS = 30.0
"""``lm_head``'s weight on it for tokens the model must never emit (their logits drop by ~100)."""
MIN_PIXELS = 56 * 56
MAX_PIXELS = 224 * 224


def _add_vision_tokens(d: Path) -> None:
    """The vision tokens as special tokens of the saved tokenizer, and the VLM chat template."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(d / "tokenizer.json"))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["additional_special_tokens"] = list(cfg.get("additional_special_tokens") or []) + VISION_TOKENS
    cfg["chat_template"] = CHAT_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def _round_trip_words(tok: Any) -> list[int]:
    """Tokens `` word`` (a space and ASCII letters) that encode back to themselves: any sequence
    of them, rendered after ``assistant\\n`` and before ``<|im_end|>``, re-tokenizes to the same ids."""
    special = set(tok.all_special_ids)
    out = []
    for t in range(len(tok)):
        s = tok.decode([t])
        if (
            t not in special
            and re.fullmatch(r" [A-Za-z]+", s)
            and tok.encode(s, add_special_tokens=False) == [t]
        ):
            out.append(t)
    return out


def _speak_only(model: Any, words: list[int], eos: int, eos_rate: float, seed: int) -> None:
    """Random weights, but the model emits only ``words`` and ``<|im_end|>`` (mean rate ``eos_rate``).

    Hidden feature 0 is made a constant: every token embedding and the vision merger's output
    (what replaces an image's pads) write ``BIAS`` there, and no layer writes to it, so after the
    final RMSNorm it is positive at every position. ``lm_head``'s column 0 is then a per-token
    bias: strongly negative for every other token; ``<|im_end|>``'s row is that feature alone,
    scaled so sampled turns end after ~1/eos_rate tokens.
    """
    import torch

    lm = model.model.language_model
    merger_out = model.model.visual.merger.mlp[-1]
    head = model.lm_head.weight
    with torch.no_grad():
        lm.embed_tokens.weight[:, 0] = BIAS
        for layer in lm.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        merger_out.weight[0] = 0.0
        merger_out.bias[0] = BIAS
        allowed = torch.zeros(head.shape[0], dtype=torch.bool)
        allowed[words] = True
        allowed[eos] = True
        head[:, 0] = torch.where(allowed, 0.0, -SUPPRESS)
        head[eos] = 0.0
        gen = torch.Generator().manual_seed(seed)
        x = torch.tensor(words)[torch.randint(0, len(words), (8, 96), generator=gen)]
        h = model(x, output_hidden_states=True).hidden_states[-1][:, 8:, :].reshape(-1, head.shape[1])
        assert bool((h[:, 0] > 0).all()), "the bias feature must be positive everywhere"
        logits = h @ head.T
        lo, hi = -100.0, 100.0
        for _ in range(50):  # the eos weight whose mean probability is eos_rate
            k = (lo + hi) / 2
            logits[:, eos] = k * h[:, 0]
            rate = torch.softmax(logits, -1)[:, eos].mean().item()
            lo, hi = (k, hi) if rate < eos_rate else (lo, k)
        head[eos, 0] = k


def build_vlm(directory: str | Path, *, seed: int = 0, eos_rate: float = 1 / 40) -> Path:
    """Write the VLM into ``directory`` (which holds the demo tokenizer already)."""
    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
    )
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    d = Path(directory)
    _add_vision_tokens(d)
    tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    ids = {t: tok.convert_tokens_to_ids(t) for t in ["<|im_end|>", "<|endoftext|>", *VISION_TOKENS]}
    eos = ids["<|im_end|>"]
    cfg = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tok),
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": 8192,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
            "bos_token_id": None,
            "eos_token_id": eos,
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 1,
            "embed_dim": 64,
            "hidden_size": 128,  # the merger's output: the text hidden size
            "mlp_ratio": 2,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    words = _round_trip_words(tok)
    _speak_only(model, words, eos, eos_rate, seed)
    model.save_pretrained(str(d), safe_serialization=True)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": True}))
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(d))
    return d


if __name__ == "__main__":
    import sys

    print(build_vlm(sys.argv[1]))
