"""Prompt log-probs for the demo upstream, as a teacher server answers them (deterministic).

The demo model's "distribution" at position ``p`` after token ``prev``: the actual next token
``t`` has log-prob ``teacher_logprob(p, prev, t)``; the top-K alternatives are K fixed ids
with log-probs ``-0.01·r``. vLLM's ``prompt_logprobs`` entry holds the actual token plus the
top K, each with its ``rank`` (1 = most likely); SGLang's ``input_token_logprobs`` holds
``[logprob, id, None]`` from ``logprob_start_len`` (the first entry has no log-prob) and
``input_top_logprobs`` the top K per position.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sglang_input_logprobs", "teacher_logprob", "vllm_prompt_logprobs"]


def teacher_logprob(position: int, prev: int, token: int) -> float:
    return -round(((token * 7919 + prev * 31 + position * 104729) % 997) / 100.0 + 0.05, 6)


def _top(position: int, k: int, vocab: int) -> list[tuple[int, float]]:
    return [((position * 131 + r * 17) % vocab, -0.01 * r) for r in range(1, k + 1)]


def _rank(lp: float, top: list[tuple[int, float]], token: int) -> int:
    for r, (tid, _v) in enumerate(top, 1):
        if tid == token:
            return r
    return 1 + sum(1 for _t, v in top if v >= lp)


def vllm_prompt_logprobs(ids: list[int], k: int, vocab: int, decode: Any) -> list[Any]:
    out: list[Any] = [None]
    for p in range(1, len(ids)):
        tok = ids[p]
        top = _top(p, k, vocab)
        lp = dict(top).get(tok, teacher_logprob(p, ids[p - 1], tok))
        entry = {str(tok): {"logprob": lp, "rank": _rank(lp, top, tok), "decoded_token": decode([tok])}}
        for r, (tid, v) in enumerate(top, 1):
            entry.setdefault(str(tid), {"logprob": v, "rank": r, "decoded_token": decode([tid])})
        out.append(entry)
    return out


def sglang_input_logprobs(ids: list[int], start: int, k: int, vocab: int) -> tuple[list[Any], list[Any]]:
    start = max(0, min(start, len(ids) - 1)) if ids else 0
    tokens: list[Any] = []
    tops: list[Any] = []
    for p in range(start, len(ids)):
        if p == start:
            tokens.append([None, ids[p], None])
            tops.append(None)
            continue
        top = _top(p, k, vocab)
        lp = dict(top).get(ids[p], teacher_logprob(p, ids[p - 1], ids[p]))
        tokens.append([lp, ids[p], None])
        tops.append([[v, tid, None] for tid, v in top] if k else None)
    return tokens, tops
