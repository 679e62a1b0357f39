from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from orchard_rec.selection import FilterChain
from orchard_rec.selection.filters import FILTERS


@dataclass
class Run:
    reward: Any
    status: str = "completed"
    metadata: dict[str, Any] = field(default_factory=dict)


def keep(name: str, group: list[Run], seed: int = 0) -> bool:
    return FILTERS[name](group, random.Random(seed)).keep


def test_nonzero_std() -> None:
    assert keep("nonzero-std", [Run(1.0), Run(0.0)])
    assert not keep("nonzero-std", [Run(1.0), Run(1.0)])
    assert not keep("nonzero-std", [Run(1.0)])  # torch.std of one value is nan: never kept


def test_no_aborted_and_no_truncated() -> None:
    assert not keep("no-aborted", [Run(1.0), Run(0.0, "aborted")])
    assert keep("no-aborted", [Run(1.0), Run(0.0, "truncated")])
    assert not keep("no-truncated", [Run(1.0), Run(0.0, "truncated")])


def test_pass_rate_drops_bad_groups_and_keeps_hard_ones() -> None:
    assert not keep("pass-rate", [Run(1.0), Run(0.0, "aborted")])
    assert not keep("pass-rate", [Run(0.0), Run(0.0)])
    # pass rate 1/4 -> kept with probability 0.75, the seeded draw decides
    group = [Run(1.0), Run(0.0), Run(0.0), Run(0.0)]
    draws = [random.Random(s).random() < 0.75 for s in range(50)]
    assert [keep("pass-rate", group, s) for s in range(50)] == draws
    assert not keep("pass-rate", [Run(1.0), Run(2.0)])  # pass rate 1: keep probability 0


def test_positive_only_marks_but_keeps() -> None:
    group = [Run(1.0), Run(0.0), Run(None), Run(2.0, "aborted")]
    assert keep("positive-only", group)
    assert [r.metadata.get("remove_sample", False) for r in group] == [False, True, True, True]


def test_chain_counts_and_order() -> None:
    chain = FilterChain(["no-aborted", "nonzero-std"], seed=1)
    groups = [[Run(1.0), Run(0.0)], [Run(1.0), Run(1.0)], [Run(1.0), Run(0.0, "aborted")]]
    kept = [g for g in groups if chain.keep(g)]
    assert kept == [groups[0]]
    assert chain.dropped == {"no-aborted": 1, "nonzero-std": 1}
    assert "kept 1 groups" in chain.summary()


def test_unknown_filter() -> None:
    with pytest.raises(ValueError, match="unknown filter"):
        FilterChain(["nope"])
