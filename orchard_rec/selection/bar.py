"""Balanced Adaptive Rollout (BAR): choose exactly N of a task's G recorded attempts.

The rule is Orchard's ``progressive_generate_and_rm_group`` /
``_try_select_training_group`` (MSR-Orchard/slime, ``slime/rollout/sglang_rollout.py``),
applied after the fact to recorded runs:

1. Attempts that are aborted, have no reward, or timed out (``metadata["exit_status"] ==
   "TimeExceeded"``, whatever their status) are *backfill only*. The rest are positive
   (reward > 0) or negative. Each list is ranked completed, then truncated, then truncated
   by the time limit, then aborted (a stable sort: ties keep their recorded order).
2. If positives + negatives < N, no balanced group exists. Otherwise the ideal number of
   positives is ``round((lo + hi) / 2 * N)`` (Python's round: half to even) and the
   feasible count closest to it in ``[ceil(lo*N), floor(hi*N)]`` wins (ties: the order of
   a stable sort of that range by distance, so the smaller count first); feasible means
   enough positives and negatives. The group is the top positives then the top negatives.
3. Progressive, as the fork generates (``n_samples_per_prompt_stride``): with ``stride`` S,
   the window is tried on the first S attempts in recorded order, then the first 2S, ...;
   the first prefix that meets it wins. Without ``stride``, all attempts are one stride.
4. If no prefix meets the window, it is relaxed to [0, 1] over all attempts; if that fails
   too, the first N of positives + negatives + backfill in rank order are taken.

``seed`` shuffles the recorded order before anything else (a different tie order per seed);
the fork has no such seed (its order is generation order). Without it the recorded order
stands, as in the fork. The result is deterministic either way.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from orchard_rec.reconstruct.sample import numeric_reward

__all__ = ["Attempt", "BarSpec", "bar_select", "parse_bar", "rank_key"]

BarSpec = tuple[int, float, float] | tuple[int, float, float, int]
"""``(N, LO, HI)`` or ``(N, LO, HI, STRIDE)``: what ``--select bar:N:LO:HI[:STRIDE]`` says."""


def parse_bar(text: str) -> BarSpec:
    """``bar:N:LO:HI[:STRIDE]`` as ``export --select`` and the viewer's group page take it.

    Raises ValueError with a message that says what is accepted."""
    parts = text.strip().split(":")
    try:
        if len(parts) not in (4, 5) or parts[0] != "bar":
            raise ValueError
        n, lo, hi = int(parts[1]), float(parts[2]), float(parts[3])
        stride = int(parts[4]) if len(parts) == 5 else None
    except ValueError:
        raise ValueError(f"select takes bar:N:LO:HI[:STRIDE], e.g. bar:8:0.25:0.75 (got {text!r})") from None
    if n < 1 or not 0.0 <= lo <= hi <= 1.0 or (stride is not None and stride < 1):  # also nan
        raise ValueError("select bar:N:LO:HI[:STRIDE] needs N >= 1, 0 <= LO <= HI <= 1 and STRIDE >= 1")
    return (n, lo, hi) if stride is None else (n, lo, hi, stride)


class Attempt(Protocol):
    reward: Any
    status: str
    metadata: dict[str, Any]


A = TypeVar("A", bound=Attempt)


def _status(a: Attempt) -> str:
    return str(getattr(a.status, "value", a.status))


def timed_out(a: Attempt) -> bool:
    return (a.metadata or {}).get("exit_status") == "TimeExceeded"


def rank_key(a: Attempt) -> int:
    """0 completed, 1 truncated, 2 truncated by the time limit, 3 aborted or anything else."""
    s = _status(a)
    if s == "completed":
        return 0
    if s == "truncated":
        return 2 if timed_out(a) else 1  # the fork's _sample_sort_key
    return 3


def _split(attempts: Sequence[A], reward: Callable[[A], float | None]) -> tuple[list[A], list[A], list[A]]:
    pos: list[A] = []
    neg: list[A] = []
    backfill: list[A] = []
    for a in attempts:
        r = reward(a)
        if r is None or _status(a) == "aborted" or timed_out(a):
            backfill.append(a)
        elif r > 0:
            pos.append(a)
        else:
            neg.append(a)
    pos.sort(key=rank_key)
    neg.sort(key=rank_key)
    backfill.sort(key=rank_key)
    return pos, neg, backfill


def _try(pos: list[A], neg: list[A], n: int, lo: float, hi: float) -> list[A] | None:
    if len(pos) + len(neg) < n:
        return None
    ideal = round((lo + hi) / 2 * n)
    for n_pos in sorted(range(math.ceil(lo * n), math.floor(hi * n) + 1), key=lambda x: abs(x - ideal)):
        if n_pos <= len(pos) and n - n_pos <= len(neg):
            return pos[:n_pos] + neg[: n - n_pos]
    return None


def bar_select(
    attempts: Sequence[A],
    n: int,
    lo: float,
    hi: float,
    *,
    seed: int | None = None,
    stride: int | None = None,
    reward: Callable[[A], float | None] | None = None,
) -> tuple[list[A], str]:
    """``(chosen attempts, how)``: ``how`` is ``window``, ``relaxed`` or ``fallback``.

    ``reward`` maps an attempt to its scalar (default: ``numeric_reward(a.reward)``).
    ``stride``: try the window on growing prefixes of that many more attempts each.
    Fewer than N attempts in all gives all of them (``fallback``).
    """
    if n < 1:
        raise ValueError(f"BAR needs N >= 1 (got {n})")
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"BAR needs 0 <= LO <= HI <= 1 (got {lo}:{hi})")
    if stride is not None and stride < 1:
        raise ValueError(f"BAR needs a stride >= 1 (got {stride})")
    items = list(attempts)
    if seed is not None:
        random.Random(seed).shuffle(items)
    get = reward or (lambda a: numeric_reward(a.reward))
    step = stride or max(len(items), 1)
    for end in range(step, len(items) + step, step):
        pos, neg, _ = _split(items[:end], get)
        chosen = _try(pos, neg, n, lo, hi)
        if chosen is not None:
            return chosen, "window"
    pos, neg, backfill = _split(items, get)
    chosen = _try(pos, neg, n, 0.0, 1.0)
    if chosen is not None:
        return chosen, "relaxed"
    return (pos + neg + backfill)[:n], "fallback"
