"""A tiny real Hugging Face tokenizer, built offline in a few milliseconds.

A byte-level BPE trained on a fixed built-in corpus, with ChatML-style special tokens
(``<|im_start|>``, ``<|im_end|>``, ``<tool_call>`` ...) and Qwen2-VL's vision tokens
(``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``, added after the trained vocabulary,
so the text ids are those of a text-only build). Deterministic: the same ids
on every machine, so tests can spell expected values. ``save`` writes a
``tokenizer.json`` (plus ``tokenizer_config.json``) that ``tokenizers.Tokenizer.from_file``
and ``transformers.AutoTokenizer`` load.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from orchard_rec.demo.template import CHAT_TEMPLATE
from orchard_rec.demo.vision import VisionConfig

__all__ = ["IMAGE_PAD", "SPECIAL_TOKENS", "VISION_TOKENS", "build_tokenizer", "save_tokenizer"]

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

IMAGE_PAD = "<|image_pad|>"
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", IMAGE_PAD]
"""Qwen2-VL's image markers: the template writes ``<|vision_start|><|image_pad|><|vision_end|>``
per image, and the server repeats the pad once per merged patch (``demo.vision``)."""

_CORPUS = """\
You are a helpful coding agent. You can run shell commands with the tools you are given.
The user asks you to list the files in the repository, read a file, and write a marker file.
Call the tool with a JSON object of arguments. When the tool returns, answer the user.
{"name": "exec_command", "arguments": {"cmd": "ls -la"}} {"command": "echo hello > marker.txt"}
Done. The command printed: hello world. The files are README.md, setup.py and src/main.py.
system user assistant tool function arguments content role name type text output result
def main(): print("hello") return 0 import os, sys; for i in range(10): x = i * 2
The quick brown fox jumps over the lazy dog. 0123456789 ()[]{}<>:;,.!?"'`~@#$%^&*-+=/\\|_
cat ls echo grep sed awk python bash git diff status commit README marker file directory
"""


@functools.lru_cache(maxsize=1)
def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.add_special_tokens(VISION_TOKENS)
    return tok


def save_tokenizer(directory: str | Path, *, vision: VisionConfig | None = None) -> Path:
    """Write the tokenizer as a Hugging Face tokenizer folder; returns the folder.

    ``vision``: also write the ``preprocessor_config.json`` of a Qwen2-VL image processor with
    that geometry (what a VLM's model folder holds next to its tokenizer)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "additional_special_tokens": SPECIAL_TOKENS[3:] + VISION_TOKENS,
                "model_max_length": 131072,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    if vision is not None:
        (d / "preprocessor_config.json").write_text(json.dumps(vision.preprocessor_config(), indent=2))
    return d
