"""slime's dynamic-sampling filters, by name, over groups of attempts.

Each filter sees one group (a task's attempts) and keeps or drops it whole, with a reason,
as slime's ``DynamicFilterOutput`` does (``slime/rollout/filter_hub/dynamic_sampling_filters.py``
and Orchard's ``examples/orchard_swe/swe_filters.py``):

- ``nonzero-std``: keep groups whose rewards vary (sample standard deviation > 1e-6, as
  ``torch.std``; a group of one never varies).
- ``no-aborted``: drop a group with any aborted attempt.
- ``no-truncated``: drop a group with any truncated attempt.
- ``has-positive``: drop a group with no positive reward (reason
  ``no_positive_reward_max_R``); after ``no-aborted`` and ``nonzero-std`` it is the fork's
  ``check_no_aborted_nonzero_std_and_pos_reward``, the Orchard-SWE recipe's filter.
- ``pass-rate``: Orchard's ``keep_group_by_pass_rate``, over the group flattened to its
  samples (an attempt split into per-turn samples counts each): drop it if any sample is
  aborted or none is positive; otherwise keep it with probability ``min(1, 1 - pass_rate)``,
  pass_rate = positive samples / samples. The draw is seeded (``--seed``, default 0), so an
  export is repeatable; the fork draws from Python's global ``random`` (seeding it with the
  same number gives the same draws).
- ``positive-only``: keeps every group, but marks each non-positive attempt
  ``metadata["remove_sample"] = True`` (it stays for the group baseline; exporters zero
  its loss mask and slime gets ``remove_sample``).

``FilterChain`` composes them in the order given and counts what each dropped.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard_rec.reconstruct.sample import numeric_reward

__all__ = ["FILTERS", "FilterChain", "GroupFilter", "Verdict", "is_positive"]


@dataclass(frozen=True)
class Verdict:
    keep: bool
    reason: str | None = None


GroupFilter = Callable[[Sequence[Any], random.Random], Verdict]


def _status(a: Any) -> str:
    return str(getattr(a.status, "value", a.status))


def is_positive(a: Any) -> bool:
    if _status(a) == "aborted":
        return False
    r = numeric_reward(a.reward)
    return r is not None and r > 0


def nonzero_std(group: Sequence[Any], rng: random.Random) -> Verdict:
    rewards = [numeric_reward(a.reward) for a in group]
    values = [r if r is not None else 0.0 for r in rewards]
    keep = len(values) >= 2 and statistics.stdev(values) > 1e-6
    return Verdict(keep, None if keep else f"zero_std_{round(values[0], 1) if values else 0}")


def no_aborted(group: Sequence[Any], rng: random.Random) -> Verdict:
    bad = any(_status(a) == "aborted" for a in group)
    return Verdict(not bad, "aborted" if bad else None)


def no_truncated(group: Sequence[Any], rng: random.Random) -> Verdict:
    bad = any(_status(a) == "truncated" for a in group)
    return Verdict(not bad, "truncated" if bad else None)


def has_positive(group: Sequence[Any], rng: random.Random) -> Verdict:
    rewards = [numeric_reward(a.reward) for a in group]
    values = [r if r is not None else 0.0 for r in rewards]
    keep = any(r is not None and r > 0 for r in rewards)
    return Verdict(keep, None if keep else f"no_positive_reward_max_{round(max(values, default=0.0), 1)}")


def _flat(group: Sequence[Any]) -> list[Any]:
    """The group's samples: an attempt that carries ``samples`` counts each of them."""
    out: list[Any] = []
    for a in group:
        samples = getattr(a, "samples", None)
        out.extend(samples if samples else [a])
    return out


def pass_rate(group: Sequence[Any], rng: random.Random) -> Verdict:
    flat = _flat(group)
    if any(_status(a) == "aborted" for a in flat):
        return Verdict(False, "aborted")
    n_pos = sum(1 for a in flat if is_positive(a))
    if n_pos == 0:
        return Verdict(False, "no_positive")
    rate = n_pos / len(flat)
    keep = rng.random() < min(1.0, 1.0 - rate)
    return Verdict(keep, None if keep else f"pass_rate_drop_{round(rate, 3)}")


def positive_only(group: Sequence[Any], rng: random.Random) -> Verdict:
    for a in group:
        if not is_positive(a):
            a.metadata["remove_sample"] = True
    return Verdict(True)


FILTERS: dict[str, GroupFilter] = {
    "nonzero-std": nonzero_std,
    "no-aborted": no_aborted,
    "no-truncated": no_truncated,
    "has-positive": has_positive,
    "pass-rate": pass_rate,
    "positive-only": positive_only,
}


@dataclass
class FilterChain:
    """Filters applied in order; ``dropped[name]`` counts the groups each one dropped."""

    names: Sequence[str]
    seed: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    kept: int = 0

    def __post_init__(self) -> None:
        unknown = [n for n in self.names if n not in FILTERS]
        if unknown:
            raise ValueError(f"unknown filter {unknown[0]!r}; choose from {', '.join(FILTERS)}")
        self._rng = random.Random(self.seed)

    def keep(self, group: Sequence[Any]) -> bool:
        for name in self.names:
            verdict = FILTERS[name](group, self._rng)
            if not verdict.keep:
                self.dropped[name] += 1
                self.reasons[verdict.reason or name] += 1
                return False
        self.kept += 1
        return True

    def summary(self) -> str:
        parts = [f"{n} dropped {self.dropped[n]}" for n in self.names]
        return f"filters: kept {self.kept} groups; " + ", ".join(parts)
