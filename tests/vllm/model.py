"""A tiny random-weight model vLLM can serve, built offline in a few seconds.

The demo tokenizer (ChatML + Hermes tools template, ``orchard_rec.demo.tokenizer.save_tokenizer``,
written into the folder first) and a random ``Qwen2ForCausalLM`` saved with
``save_pretrained`` by this script, run with the vLLM venv's own ``transformers`` so vLLM
reads the config it writes (it imports nothing of orchard_rec). Facts that shape it (issue 17):
vLLM's CPU attention kernel needs head_dim 32, 64, 80, ... (hidden 128 / 4 heads = 32);
random weights almost never emit ``<|im_end|>``, so its ``lm_head`` row is scaled so turns
end on their own after a few dozen tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["build_model"]


def build_model(directory: str | Path, *, seed: int = 0, eos_rate: float = 1 / 40) -> Path:
    """Write the weights into ``directory`` (which holds the tokenizer already).

    ``eos_rate``: the mean probability of ``<|im_end|>`` per generated token, so sampled
    turns end on their own after ~1/eos_rate tokens (scaling its row alone did not on this
    model: its logit is near 0 with either sign). Its ``lm_head`` row is set along the mean
    direction of the final hidden states, scaled to that rate on random inputs.
    """
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    d = Path(directory)
    tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        ids = torch.randint(10, len(tok), (8, 96), generator=torch.Generator().manual_seed(seed))
        h = model(ids, output_hidden_states=True).hidden_states[-1][:, 16:, :].reshape(-1, cfg.hidden_size)
        mu = h.mean(0)
        row = mu / mu.norm()
        lo, hi = 0.0, 200.0
        for _ in range(40):  # the scale whose mean eos probability is eos_rate
            k = (lo + hi) / 2
            logits = h @ model.lm_head.weight.T
            logits[:, eos] = h @ (k * row)
            rate = torch.softmax(logits, -1)[:, eos].mean().item()
            lo, hi = (k, hi) if rate < eos_rate else (lo, k)
        model.lm_head.weight[eos] = k * row
    model.save_pretrained(str(d), safe_serialization=True)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": True}))
    return d


if __name__ == "__main__":
    import sys

    print(build_model(sys.argv[1]))
