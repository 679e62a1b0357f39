"""The filters against Orchard's fork: what its own filter functions decided on the same groups.

``fork_filter_cases.json``: 150 random groups of attempts, each attempt split into 1-3 per-turn
samples (reward, status), and the verdicts of MSR-Orchard/slime at
331efaaeef75c98aad6ba1a2f5f50bd8149f6ab9: ``examples/orchard_swe/swe_filters.py``
``keep_group_by_pass_rate`` on the nested groups (Python's global ``random`` seeded with 5 first),
and ``slime/rollout/filter_hub/dynamic_sampling_filters.py``
``check_no_aborted_nonzero_std_and_pos_reward`` on one sample per attempt.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard_rec.selection import FilterChain
from orchard_rec.selection.filters import FILTERS

DATA = json.loads((Path(__file__).parent / "fork_filter_cases.json").read_text())


@dataclass
class Turn:
    reward: Any
    status: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Attempt:  # as orchard_rec.pipeline.Attempt: the first sample's reward, the last one's status
    samples: list[Turn]
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> Any:
        return self.samples[0].reward

    @property
    def status(self) -> str:
        return self.samples[-1].status


def groups() -> list[list[Attempt]]:
    return [[Attempt([Turn(r, s) for r, s in a]) for a in g] for g in DATA["groups"]]


def test_pass_rate_counts_samples_of_the_flattened_group_as_the_fork() -> None:
    chain = FilterChain(["pass-rate"], seed=5)
    assert [chain.keep(g) for g in groups()] == DATA["pass_rate_seed5"]


def test_has_positive_after_no_aborted_and_nonzero_std_is_the_forks_combined_filter() -> None:
    rng = random.Random(0)
    for g, (keep, reason) in zip(groups(), DATA["no_aborted_nonzero_std_has_positive"], strict=True):
        for name in ("no-aborted", "nonzero-std", "has-positive"):
            verdict = FILTERS[name](g, rng)
            if not verdict.keep:
                break
        assert (verdict.keep, verdict.reason) == (keep, reason), g
