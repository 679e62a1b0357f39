"""Issue 17 bug 5: ``realign`` after a turn cut by ``max_tokens`` finds the turn boundary from
the chat template (the cut turn's last token is arbitrary, so it is no end-of-turn marker)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from orchard_rec.reconstruct.generation import Generation
from orchard_rec.reconstruct.merge import reconstruct, template_turn_end
from orchard_rec.tokenizer import load_hf_tokenizer as _load

load_hf_tokenizer: Any = functools.lru_cache(maxsize=1)(_load)

# a Hugging Face tokenizer: the only fast-tier test that loaded transformers (1-4 s)
pytestmark = pytest.mark.slow


def _session(tok):  # type: ignore[no-untyped-def]
    """Turn 1 cut mid-answer, its text re-tokenized by the server in turn 2's prompt."""
    sys_user = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "list files"}]
    p1 = tok.apply_chat_template(sys_user, add_generation_prompt=True, tokenize=False)
    text = "The files are README.md and the files are"  # the model's words, cut by max_tokens
    # generated one character at a time (not how the tokenizer would write it): turn 2's
    # re-rendered prompt holds other ids, and the cut's last token (" are"'s "e") recurs in them
    gen1 = [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]
    ids1 = tok.encode(p1, add_special_tokens=False)
    convo = sys_user + [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    p2 = tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
    ids2 = tok.encode(p2, add_special_tokens=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    gens = [
        Generation("c1", tuple(ids1), tuple(gen1), tuple([-0.5] * len(gen1)), "length"),
        Generation("c2", tuple(ids2), (5, 6, end), (-0.1, -0.2, -0.3), "stop"),
    ]
    # the template's delta after the cut text: <|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n
    delta = tok.encode(p2[len(p1) + len(text) :], add_special_tokens=False)
    return gens, ids1, gen1, delta


def test_realign_after_a_cut_turn_splices_the_templates_delta() -> None:
    tok = load_hf_tokenizer("demo")
    gens, ids1, gen1, delta = _session(tok)
    assert tok.decode(delta, skip_special_tokens=False).startswith("<|im_end|>\n<|im_start|>user")
    [s] = reconstruct(gens, session_id="s", on_mismatch="realign", turn_end=template_turn_end(tok))
    assert s.metadata["realigned"] == ["c2"]
    assert s.tokens == ids1 + gen1 + delta + [5, 6, tok.convert_tokens_to_ids("<|im_end|>")]
    assert s.loss_mask == [1] * len(gen1) + [0] * len(delta) + [1, 1, 1]


def test_the_template_names_its_end_of_turn_token() -> None:
    tok = load_hf_tokenizer("demo")
    assert template_turn_end(tok) == tok.convert_tokens_to_ids("<|im_end|>")


def test_without_the_template_the_boundary_comes_from_the_prompts() -> None:
    """Issue 42: the cut turn's resent text is drift inside a generated turn; its end in the
    prompt is learned from the ending both prompts share (``realign._boundary``)."""
    tok = load_hf_tokenizer("demo")
    gens, ids1, gen1, delta = _session(tok)
    [s] = reconstruct(gens, session_id="s", on_mismatch="realign")
    assert s.tokens == ids1 + gen1 + delta + [5, 6, tok.convert_tokens_to_ids("<|im_end|>")]
    assert s.metadata["realign_spans"] == [[len(ids1), len(ids1) + len(gen1)]]
