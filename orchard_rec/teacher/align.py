"""A teacher with another tokenizer: map the student's response tokens onto the teacher's by text.

The sample's ids are decoded with the student's tokenizer; the text is encoded with the
teacher's. A student token and a teacher token align when they cover exactly the same
characters; only those positions get the teacher's log-prob (``valid = 1``), every other
position is marked invalid. Student ids that do not round-trip through their own tokenizer
(decode then encode) align only in the matching prefix and suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchard_rec.teacher.wire import TeacherResult

__all__ = ["Alignment", "align", "map_back"]


def _backend(tok: Any) -> Any:
    return getattr(tok, "backend_tokenizer", tok)


@dataclass(frozen=True)
class Alignment:
    teacher_ids: list[int]
    teacher_prompt_length: int
    """Teacher tokens before the first one that starts inside the student's response."""
    positions: list[int | None]
    """Per student response position: the teacher index covering exactly its characters, or None."""


def align(student: Any, teacher: Any, ids: Sequence[int], response_length: int) -> Alignment:
    s, t = _backend(student), _backend(teacher)
    ids = list(ids)
    text = s.decode(ids, skip_special_tokens=False)
    enc = s.encode(text, add_special_tokens=False)
    spans: list[tuple[int, int] | None] = [None] * len(ids)
    if list(enc.ids) == ids:
        spans = [tuple(o) for o in enc.offsets]
    else:
        k = 0
        while k < min(len(ids), len(enc.ids)) and enc.ids[k] == ids[k]:
            spans[k] = tuple(enc.offsets[k])
            k += 1
        k = 1
        while k <= min(len(ids), len(enc.ids)) and enc.ids[-k] == ids[-k]:
            spans[-k] = tuple(enc.offsets[-k])
            k += 1
    tenc = t.encode(text, add_special_tokens=False)
    by_span = {tuple(o): k for k, o in enumerate(tenc.offsets)}
    p = len(ids) - response_length
    start = next((sp[0] for sp in spans[p:] if sp is not None), len(text))
    t_prompt = next((k for k, o in enumerate(tenc.offsets) if o[0] >= start), len(tenc.ids))
    positions = [by_span.get(sp) if sp is not None else None for sp in spans[p:]]
    return Alignment(list(tenc.ids), t_prompt, positions)


def map_back(a: Alignment, result: TeacherResult) -> TeacherResult:
    """The teacher's result over its own response, as one over the student's response."""
    n = len(a.positions)
    out = TeacherResult(
        [0.0] * n,
        [0] * n,
        [[] for _ in range(n)] if result.topk_ids is not None else None,
        [[] for _ in range(n)] if result.topk_logprobs is not None else None,
        result.model,
        {"aligned": 0},
    )
    for j, k in enumerate(a.positions):
        if k is None or k < a.teacher_prompt_length:
            continue
        r = k - a.teacher_prompt_length
        if r >= len(result.valid_mask) or not result.valid_mask[r]:
            continue
        out.log_probs[j] = result.log_probs[r]
        out.valid_mask[j] = 1
        if out.topk_ids is not None and result.topk_ids is not None:
            out.topk_ids[j] = result.topk_ids[r]
        if out.topk_logprobs is not None and result.topk_logprobs is not None:
            out.topk_logprobs[j] = result.topk_logprobs[r]
        out.meta["aligned"] += 1
    return out
