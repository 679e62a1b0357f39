"""BAR against Orchard's fork: what its own ``progressive_generate_and_rm_group`` chose.

``fork_bar_cases.json``: 200 random groups (rewards, statuses, exit statuses, N, LO:HI, stride)
and the attempts MSR-Orchard/slime at 331efaaeef75c98aad6ba1a2f5f50bd8149f6ab9 selected, running
``slime/rollout/sglang_rollout.py`` ``progressive_generate_and_rm_group`` /
``_try_select_training_group`` with its generation stubbed to replay the recorded attempts in
order (``n_samples_per_prompt_max`` = the attempts recorded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard_rec.selection import bar_select
from tests.selection.test_bar import Run

CASES = json.loads((Path(__file__).parent / "fork_bar_cases.json").read_text())


def runs(attempts: list[list[Any]]) -> list[Run]:
    return [Run(i, r, s, {"exit_status": ex} if ex else {}) for i, (r, s, ex) in enumerate(attempts)]


def test_bar_equals_the_forks_choice_on_200_groups() -> None:
    for case in CASES:
        chosen, _how = bar_select(
            runs(case["attempts"]), case["n"], case["lo"], case["hi"], stride=case["stride"]
        )
        assert [r.i for r in chosen] == case["fork"], case


def test_time_exceeded_is_backfill_under_any_status() -> None:
    # attempt 0 is positive and completed, but ran out of time: the fork never counts it positive
    attempts = [[1.0, "completed", "TimeExceeded"], [1.0, "completed", None], [0.0, "completed", None]]
    attempts += [[0.0, "completed", None], [1.0, "completed", None]]
    chosen, how = bar_select(runs(attempts), 2, 0.5, 0.5)
    assert how == "window" and [r.i for r in chosen] == [1, 2]  # the fork: [1, 2]


def test_stride_selects_from_the_first_prefix_that_meets_the_window() -> None:
    attempts = [
        [1.0, "truncated", None],
        [0.0, "completed", None],
        [1.0, "completed", None],
        [0.0, "completed", None],
    ]
    assert [r.i for r in bar_select(runs(attempts), 2, 0.5, 0.5, stride=2)[0]] == [0, 1]  # the fork: [0, 1]
    assert [r.i for r in bar_select(runs(attempts), 2, 0.5, 0.5)[0]] == [2, 1]  # one stride: [2, 1]
    with pytest.raises(ValueError):
        bar_select(runs(attempts), 2, 0.5, 0.5, stride=0)
