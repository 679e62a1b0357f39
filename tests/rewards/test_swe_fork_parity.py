"""The ``swe`` rule set against Orchard's fork, on the same trajectories.

Expected values are what MSR-Orchard/slime at 331efaaeef75c98aad6ba1a2f5f50bd8149f6ab9 computed,
running its own ``examples/orchard_swe/swe_reward.py`` ``compute_process_shaped_reward`` and
``combine_process_rewards`` (with ``swe_prm.parse_trajectory_from_sample``) on the messages and
outcome fields of ``fork_cases``; only its Docker grader was stubbed, returning each case's report.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from orchard_rec.rewards import SweProcessReward
from orchard_rec.steps import steps_of_messages

from . import fork_cases as fc

# The fork's components (its names: f2p_rate, p2p_rate) and its scalar, per case.
FORK: dict[str, tuple[dict[str, float], float]] = {
    "repro_test_deleted": (
        {
            "resolved": 1.0,
            "f2p_rate": 1.0,
            "p2p_rate": 1.0,
            "localization": 1.0,
            "read_before_edit": 1.0,
            "anchored_flip": 0.5,
            "extra_files": 0.0,
            "no_progress": 1 / 6,
            "error_rate": 1 / 6,
            "integrity_gate": 1.0,
        },
        23.366666666666667,
    ),
    "no_gold_patch": (
        {
            "resolved": 0.0,
            "f2p_rate": 1.0,
            "p2p_rate": 1.0,
            "localization": 0.0,
            "read_before_edit": 0.0,
            "anchored_flip": 0.0,
            "extra_files": 0.0,
            "no_progress": 0.0,
            "error_rate": 0.0,
            "integrity_gate": 1.0,
        },
        7.0,
    ),
    "read_without_edit": (
        {
            "resolved": 0.0,
            "f2p_rate": 0.0,
            "p2p_rate": 0.0,
            "localization": 0.0,
            "read_before_edit": 1.0,
            "anchored_flip": 0.0,
            "extra_files": 0.0,
            "no_progress": 0.0,
            "error_rate": 0.0,
            "integrity_gate": 1.0,
        },
        1.0,
    ),
    "flip_without_f2p_list": (
        {
            "resolved": 0.0,
            "f2p_rate": 1.0,
            "p2p_rate": 1.0,
            "localization": 1.0,
            "read_before_edit": 0.0,
            "anchored_flip": 1.0,
            "extra_files": 0.0,
            "no_progress": 1 / 3,
            "error_rate": 1 / 3,
            "integrity_gate": 1.0,
        },
        13.733333333333333,
    ),
    "unknown_exit_codes": (
        {
            "resolved": 0.0,
            "f2p_rate": 0.0,
            "p2p_rate": 1.0,
            "localization": 1.0,
            "read_before_edit": 1.0,
            "anchored_flip": 0.0,
            "extra_files": 0.0,
            "no_progress": 0.0,
            "error_rate": 0.5,
            "integrity_gate": 1.0,
        },
        6.85,
    ),
    "empty_pass_to_pass": (
        {
            "resolved": 0.0,
            "f2p_rate": 0.0,
            "p2p_rate": 1.0,
            "localization": 1.0,
            "read_before_edit": 0.0,
            "anchored_flip": 0.0,
            "extra_files": 0.0,
            "no_progress": 1 / 3,
            "error_rate": 2 / 3,
            "integrity_gate": 1.0,
        },
        5.633333333333334,
    ),
}
# The fork's integrity gate on the clean run plus one command, or with another submitted patch.
FORK_GATE_COMMANDS = {
    "git_checkout_file": 0.0, "chmod_R": 0.0, "chown_R": 0.0, "dev_sd": 0.0, "mkfs": 0.0, "dd": 0.0,
    "rm_rf": 0.0, "git_reset_hard": 0.0, "rm_r_f": 1.0, "rm_fr": 1.0, "git_status": 1.0,
}  # fmt: skip
FORK_GATE_PATCHES = {
    "hardcoded_return": 0.0, "skip_marker": 1.0, "assert_true": 0.0, "edits_test_file": 0.0, "plain_return": 1.0,
}  # fmt: skip
OURS = {"f2p_rate": "f2p", "p2p_rate": "p2p"}


def score(actions: list[fc.Action], meta: dict[str, Any]) -> Any:
    steps = steps_of_messages(fc.messages(actions))
    return SweProcessReward().score(steps, meta, n_turns=len(actions) + 1)


@pytest.mark.parametrize("name", FORK)
def test_components_and_total_equal_the_forks(name: str) -> None:
    actions, meta, grader = fc.CASES[name]
    if grader:  # the fork's grader report, as the outcome's grader rates
        meta = {**meta, "f2p_rate": grader["fail_to_pass_rate"], "p2p_rate": grader["pass_to_pass_rate"]}
    r = score(actions, meta)
    components, total = FORK[name]
    for k, v in components.items():
        assert math.isclose(r.components[OURS.get(k, k)], v), (k, r.components[OURS.get(k, k)], v)
    assert math.isclose(r.total, total)
    assert math.isclose(sum(r.step_values), r.total)


@pytest.mark.parametrize("name", ["no_gold_patch", "flip_without_f2p_list", "empty_pass_to_pass"])
def test_without_grader_rates_the_lists_grade_as_the_fork_did(name: str) -> None:
    """No f2p_rate / p2p_rate in the outcome: an empty list is all passing (the fork's grading),
    a non-empty one is read from the run's test output, which here agrees with the grader."""
    actions, meta, _grader = fc.CASES[name]
    r = score(actions, meta)
    assert math.isclose(r.total, FORK[name][1])


@pytest.mark.parametrize("name", FORK_GATE_COMMANDS)
def test_gate_on_commands_equals_the_forks(name: str) -> None:
    r = score([*fc.CLEAN, (fc.GATE_COMMANDS[name], "", 0)], {**fc.BASE, "final_output": fc.FIX})
    assert r.components["integrity_gate"] == FORK_GATE_COMMANDS[name]
    assert bool(r.notes) == (FORK_GATE_COMMANDS[name] == 0.0)


@pytest.mark.parametrize("name", FORK_GATE_PATCHES)
def test_gate_on_the_submitted_patch_equals_the_forks(name: str) -> None:
    r = score(fc.CLEAN, {**fc.BASE, "final_output": fc.GATE_PATCHES[name]})
    assert r.components["integrity_gate"] == FORK_GATE_PATCHES[name]
    if FORK_GATE_PATCHES[name] == 0.0:
        assert r.total == 0.0 and all(v == 0.0 for v in r.step_values)
