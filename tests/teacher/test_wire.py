"""Teacher wire contracts on answers shaped as vLLM 0.32 and SGLang send them."""

from __future__ import annotations

from typing import Any

import pytest

from orchard_rec.teacher import parse, request_for, window

TOKENS = [11, 12, 13, 21, 22, 23, 24]  # prompt 3, response 4
P = 3


def lp(pos: int, tok: int) -> float:
    return -(pos * 0.1 + tok * 0.001)


def vllm_answer(sent_from: int, sent: list[int], k: int) -> dict[str, Any]:
    plp: list[Any] = [None]
    for q in range(1, len(sent)):
        pos = sent_from + q
        entry = {str(sent[q]): {"logprob": lp(pos, sent[q]), "rank": 3, "decoded_token": "x"}}
        for r in range(1, k + 1):
            entry[str(900 + r)] = {"logprob": -0.01 * r, "rank": r, "decoded_token": "y"}
        plp.append(entry)
    return {"model": "teach", "choices": [{"index": 0, "text": "", "prompt_logprobs": plp}]}


def sglang_answer(sent_from: int, sent: list[int], start: int, k: int) -> dict[str, Any]:
    entries: list[Any] = [[None, sent[start], None]]
    tops: list[Any] = [None]
    for q in range(start + 1, len(sent)):
        entries.append([lp(sent_from + q, sent[q]), sent[q], None])
        tops.append([[-0.01 * r, 900 + r, None] for r in range(1, k + 1)])
    return {"text": "", "meta_info": {"input_token_logprobs": entries, "input_top_logprobs": tops}}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize(
    ("max_len", "trunc", "valid"),
    [
        (None, "prefix", [1, 1, 1, 1]),
        (5, "prefix", [1, 1, 1, 1]),  # drops 2 prompt tokens: every response position still scored
        (3, "prefix", [0, 0, 1, 1]),  # drops into the response: its first sent token has no log-prob
        (5, "suffix", [1, 1, 0, 0]),  # drops the response tail
    ],
)
def test_response_positions_are_aligned(kind: str, max_len: int | None, trunc: str, valid: list[int]) -> None:
    w = window(len(TOKENS), P, max_len, trunc)
    path, body = request_for(kind, TOKENS, w, top_k=2, model="teach")
    sent = TOKENS[w.start : w.end]
    if kind == "vllm":
        assert path == "/v1/completions" and body["prompt"] == sent and body["max_tokens"] == 1
        assert body["prompt_logprobs"] == 2 and body["temperature"] == 0.0
        answer = vllm_answer(w.start, sent, 2)
    else:
        assert path == "/generate" and body["input_ids"] == sent
        assert body["sampling_params"]["max_new_tokens"] == 0 and body["top_logprobs_num"] == 2
        assert body["logprob_start_len"] == max(P - w.start - 1, 0)
        answer = sglang_answer(w.start, sent, body["logprob_start_len"], 2)
    r = parse(kind, answer, TOKENS, w, top_k=2)
    assert r.valid_mask == valid
    assert r.log_probs == [lp(P + j, TOKENS[P + j]) if v else 0.0 for j, v in enumerate(valid)]
    assert r.topk_ids == [[901, 902] if v else [] for v in valid]
    assert r.topk_logprobs == [[-0.01, -0.02] if v else [] for v in valid]


def test_vllm_without_top_k_and_bad_answers() -> None:
    w = window(len(TOKENS), P, None)
    _, body = request_for("vllm", TOKENS, w, top_k=0)
    assert body["prompt_logprobs"] == 0 and "model" not in body
    r = parse("vllm", vllm_answer(0, TOKENS, 0), TOKENS, w, top_k=0)
    assert r.valid_mask == [1, 1, 1, 1] and r.topk_ids is None
    with pytest.raises(ValueError, match="prompt_logprobs"):
        parse("vllm", {"choices": [{"prompt_logprobs": [None]}]}, TOKENS, w, top_k=0)


def test_sglang_token_mismatch_is_an_error() -> None:
    w = window(len(TOKENS), P, None)
    answer = sglang_answer(0, [*TOKENS[:-1], 99], P - 1, 0)
    with pytest.raises(ValueError, match="scored token 99"):
        parse("sglang", answer, TOKENS, w, top_k=0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        window(10, 3, 5, "middle")
    with pytest.raises(ValueError):
        request_for("tgi", TOKENS, window(7, 3, None), 0)
