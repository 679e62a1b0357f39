"""BAR against a straightforward reference implementation of the rule in issue 19."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_rec.selection import bar_select


@dataclass
class Run:
    i: int
    reward: Any
    status: str
    metadata: dict[str, Any] = field(default_factory=dict)


def reference(runs: list[Run], n: int, lo: float, hi: float) -> list[int]:
    """The rule written out plainly: classify, rank, search the window, relax, fall back."""

    def cls(r: Run) -> str:
        timeout = r.metadata.get("exit_status") == "TimeExceeded"  # under any status, as the fork
        if r.reward is None or r.status == "aborted" or timeout:
            return "backfill"
        return "pos" if r.reward > 0 else "neg"

    def rank(r: Run) -> int:
        if r.status == "completed":
            return 0
        if r.status == "truncated":
            return 2 if r.metadata.get("exit_status") == "TimeExceeded" else 1
        return 3

    lists: dict[str, list[Run]] = {"pos": [], "neg": [], "backfill": []}
    for r in runs:
        lists[cls(r)].append(r)
    for k in lists:  # insertion sort by rank keeps recorded order among equals
        ranked: list[Run] = []
        for r in lists[k]:
            j = len(ranked)
            while j > 0 and rank(ranked[j - 1]) > rank(r):
                j -= 1
            ranked.insert(j, r)
        lists[k] = ranked
    pos, neg = lists["pos"], lists["neg"]

    def attempt(a: float, b: float) -> list[Run] | None:
        if len(pos) + len(neg) < n:
            return None
        ideal = round((a + b) / 2 * n)
        best = None
        for k in range(math.ceil(a * n), math.floor(b * n) + 1):
            if k <= len(pos) and n - k <= len(neg) and (best is None or abs(k - ideal) < abs(best - ideal)):
                best = k
        return None if best is None else pos[:best] + neg[: n - best]

    got = attempt(lo, hi) or attempt(0.0, 1.0)
    if got is None:
        got = (pos + neg + lists["backfill"])[:n]
    return [r.i for r in got]


run_st = st.builds(
    lambda reward, status, timeout: (reward, status, {"exit_status": "TimeExceeded"} if timeout else {}),
    st.one_of(st.none(), st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0])),
    st.sampled_from(["completed", "truncated", "aborted", "failed"]),
    st.booleans(),
)


@pytest.mark.slow  # 400 hypothesis examples against the reference: ~20 s on a loaded machine
@settings(max_examples=400, deadline=None)
@given(
    st.lists(run_st, min_size=0, max_size=24),
    st.integers(1, 16),
    st.integers(0, 10),
    st.integers(0, 10),
)
def test_bar_equals_reference(specs: list[tuple[Any, str, dict[str, Any]]], n: int, a: int, b: int) -> None:
    lo, hi = sorted((a / 10, b / 10))
    runs = [Run(i, r, s, m) for i, (r, s, m) in enumerate(specs)]
    chosen, _how = bar_select(runs, n, lo, hi)
    assert [r.i for r in chosen] == reference(runs, n, lo, hi)
    assert len(chosen) == min(n, len(runs))


def test_bar_worked_example() -> None:
    # 8 attempts, 3 positive; N=4 in [0.25, 0.75]: ideal round(0.5*4) = 2 positives.
    runs = [Run(i, 1.0 if i in (1, 4, 6) else 0.0, "completed") for i in range(8)]
    runs[1].status = "truncated"  # ranked after completed positives
    chosen, how = bar_select(runs, 4, 0.25, 0.75)
    assert how == "window"
    assert [r.i for r in chosen] == [4, 6, 0, 2]


def test_bar_backfill_and_fallback() -> None:
    runs = [
        Run(0, None, "completed"),
        Run(1, 1.0, "truncated", {"exit_status": "TimeExceeded"}),
        Run(2, 1.0, "aborted"),
        Run(3, 0.0, "completed"),
    ]
    chosen, how = bar_select(runs, 3, 0.0, 1.0)
    assert how == "fallback"
    # negatives first (no positive outside backfill), then backfill ranked completed, timed out, aborted
    assert [r.i for r in chosen] == [3, 0, 1]


def test_bar_relaxes_the_window() -> None:
    runs = [Run(i, 1.0, "completed") for i in range(5)]
    chosen, how = bar_select(runs, 4, 0.25, 0.5)  # needs a negative; none exist
    assert how == "relaxed" and [r.i for r in chosen] == [0, 1, 2, 3]


def test_bar_seed_is_deterministic() -> None:
    runs = [Run(i, float(i % 2), "completed") for i in range(10)]
    a, _ = bar_select(runs, 4, 0.5, 0.5, seed=7)
    b, _ = bar_select(runs, 4, 0.5, 0.5, seed=7)
    assert [r.i for r in a] == [r.i for r in b]
    assert sum(1 for r in a if r.reward > 0) == 2


@pytest.mark.parametrize("bad", [(0, 0.0, 1.0), (2, 0.8, 0.2), (2, -0.1, 0.5)])
def test_bar_rejects_bad_arguments(bad: tuple[int, float, float]) -> None:
    with pytest.raises(ValueError):
        bar_select([], *bad)
