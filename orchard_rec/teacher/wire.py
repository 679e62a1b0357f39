"""Teacher requests and answers, per server: what to send for a sample, what comes back.

- vLLM: ``POST {url}/v1/completions`` with ``prompt`` = the token ids, ``max_tokens: 1``
  (vLLM rejects 0), ``prompt_logprobs: K`` (0 without top-k), ``temperature: 0``. vLLM
  0.32 answers ``choices[0].prompt_logprobs = [null, {"<id>": {"logprob", "rank",
  "decoded_token"}, ...}, ...]``: one entry per prompt position (the first is null), each
  holding the actual token plus up to K others.
- SGLang: ``POST {url}/generate`` with ``input_ids``, ``sampling_params:
  {"max_new_tokens": 0}``, ``return_logprob: true``, ``logprob_start_len`` one before
  the response, ``top_logprobs_num: K``; ``meta_info.input_token_logprobs`` holds
  ``[logprob, token_id, text]`` from that start (its first entry has no logprob), and
  ``meta_info.input_top_logprobs`` the top-k per position. The response positions are
  read from the tail, as Orchard's ``on_policy_distillation.py`` does, so the boundary
  convention does not matter.

Truncation (``--max-len``): ``prefix`` drops tokens from the left (prompt first: every
response position keeps its log-prob while the response fits), ``suffix`` from the right
(response tail first). Positions that are not scored get ``valid = 0`` and log-prob 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TeacherResult", "Window", "parse", "request_for", "window"]


@dataclass(frozen=True)
class Window:
    """Which slice ``tokens[start:end]`` is sent, for a sample of ``n`` tokens whose
    response starts at ``prompt_length``."""

    start: int
    end: int
    prompt_length: int
    n: int

    @property
    def response_length(self) -> int:
        return self.n - self.prompt_length

    def scored(self, j: int) -> bool:
        """Response position ``j`` gets a log-prob: it was sent and is not the first sent token."""
        pos = self.prompt_length + j
        return self.start < pos < self.end


def window(n: int, prompt_length: int, max_len: int | None, truncation: str = "prefix") -> Window:
    if truncation not in ("prefix", "suffix"):
        raise ValueError(f"truncation is prefix or suffix (got {truncation!r})")
    if max_len is None or n <= max_len:
        return Window(0, n, prompt_length, n)
    if max_len < 2:
        raise ValueError(f"--max-len must be at least 2 (got {max_len})")
    over = n - max_len
    if truncation == "prefix":
        return Window(over, n, prompt_length, n)
    return Window(0, n - over, prompt_length, n)


@dataclass
class TeacherResult:
    log_probs: list[float]
    """len = response_length; 0.0 where ``valid_mask`` is 0."""
    valid_mask: list[int]
    topk_ids: list[list[int]] | None = None
    topk_logprobs: list[list[float]] | None = None
    model: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def request_for(
    kind: str, tokens: Sequence[int], w: Window, top_k: int, model: str | None = None
) -> tuple[str, dict[str, Any]]:
    """``(path, JSON body)`` of the teacher request for one sample."""
    sent = list(tokens[w.start : w.end])
    if kind == "vllm":
        body: dict[str, Any] = {
            "prompt": sent,
            "max_tokens": 1,
            "prompt_logprobs": top_k,
            "temperature": 0.0,
        }
        if model:
            body["model"] = model
        return "/v1/completions", body
    if kind == "sglang":
        first_response = max(w.prompt_length - w.start, 0)
        body = {
            "input_ids": sent,
            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0, "skip_special_tokens": False},
            "return_logprob": True,
            "logprob_start_len": max(first_response - 1, 0),
        }
        if top_k:
            body["top_logprobs_num"] = top_k
        return "/generate", body
    raise ValueError(f"teacher kind is vllm or sglang (got {kind!r})")


def _empty(w: Window, top_k: int) -> TeacherResult:
    n = w.response_length
    return TeacherResult(
        [0.0] * n,
        [0] * n,
        [[] for _ in range(n)] if top_k else None,
        [[] for _ in range(n)] if top_k else None,
    )


def parse(kind: str, answer: dict[str, Any], tokens: Sequence[int], w: Window, top_k: int) -> TeacherResult:
    """The teacher's log-prob of each response token (and top-k), aligned to the response."""
    out = _empty(w, top_k)
    if kind == "vllm":
        choices = answer.get("choices") or []
        plp = choices[0].get("prompt_logprobs") if choices else None
        if not isinstance(plp, list) or len(plp) != w.end - w.start:
            raise ValueError(
                f"teacher answered {len(plp) if isinstance(plp, list) else 'no'} prompt_logprobs for "
                f"{w.end - w.start} tokens"
            )
        for j in range(w.response_length):
            if not w.scored(j):
                continue
            pos = w.prompt_length + j
            entry = plp[pos - w.start]
            if not isinstance(entry, dict):
                continue
            tok = entry.get(str(tokens[pos]))
            if not isinstance(tok, dict) or tok.get("logprob") is None:
                continue
            out.log_probs[j] = float(tok["logprob"])
            out.valid_mask[j] = 1
            if top_k and out.topk_ids is not None and out.topk_logprobs is not None:
                ranked = sorted(
                    ((int(v.get("rank") or 10**9), int(k), float(v["logprob"])) for k, v in entry.items()),
                    key=lambda t: t[0],
                )
                best = [t for t in ranked if t[0] <= top_k][:top_k]
                out.topk_ids[j] = [t[1] for t in best]
                out.topk_logprobs[j] = [t[2] for t in best]
        out.model = answer.get("model")
        return out
    if kind == "sglang":
        meta = answer.get("meta_info") or {}
        entries = meta.get("input_token_logprobs") or []
        tops = meta.get("input_top_logprobs") or []
        scored = [j for j in range(w.response_length) if w.scored(j)]
        # the scored response positions are the tail of what came back
        usable = [(e, tops[i] if i < len(tops) else None) for i, e in enumerate(entries)]
        tail = usable[-len(scored) :] if scored else []
        if len(tail) < len(scored):
            scored = scored[len(scored) - len(tail) :]
        for j, (e, top) in zip(scored, tail):
            if not isinstance(e, (list, tuple)) or not e or e[0] is None:
                continue
            if len(e) > 1 and e[1] is not None and int(e[1]) != tokens[w.prompt_length + j]:
                raise ValueError(
                    f"teacher scored token {e[1]} where the sample has {tokens[w.prompt_length + j]}"
                )
            out.log_probs[j] = float(e[0])
            out.valid_mask[j] = 1
            if top_k and out.topk_ids is not None and out.topk_logprobs is not None and top:
                pairs = [(float(t[0]), int(t[1])) for t in top if t and t[0] is not None][:top_k]
                out.topk_ids[j] = [p[1] for p in pairs]
                out.topk_logprobs[j] = [p[0] for p in pairs]
        return out
    raise ValueError(f"teacher kind is vllm or sglang (got {kind!r})")
