from __future__ import annotations

import math
from typing import Any

import pytest

from orchard_rec.rewards import SweProcessReward, get, observed_tests
from orchard_rec.steps import parse_steps

from .trajectories import ACTIONS, EXPECTED, EXPECTED_TOTAL, GOLD, claude_code, codex, mini_swe_chat

DIALECTS = {"messages": claude_code, "responses": codex, "chat": mini_swe_chat}


def score(dialect: str, actions: list[Any] = ACTIONS, gold: dict[str, Any] = GOLD, **kw: Any) -> Any:
    request, response = DIALECTS[dialect](actions)
    steps = parse_steps(dialect, request, response)
    return SweProcessReward(**kw).score(steps, gold, n_turns=len(actions) + 1)


# Codex's apply_patch answers "Success." with no exit code: as in the fork, error_rate counts only
# steps whose exit code is known, 1 of 5 there (Claude Code flags errors: every answered step counts).
ERROR_RATE = {"messages": 1 / 7, "responses": 1 / 5, "chat": 1 / 7}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_term_and_total_match_the_hand_computation(dialect: str) -> None:
    r = score(dialect)
    expected = {**EXPECTED, "error_rate": ERROR_RATE[dialect]}
    for k, v in expected.items():
        assert math.isclose(r.components[k], v), (k, r.components[k], v)
    assert math.isclose(r.total, EXPECTED_TOTAL + 10 * 0.03 * (1 / 7 - ERROR_RATE[dialect]))
    assert math.isclose(sum(r.step_values), r.total)
    assert math.isclose(r.turn_values[-1], r.total)
    assert len(r.turn_values) == len(ACTIONS) + 1
    # the flip is earned where test_add first passes (step 5), the read at step 1
    assert r.step_values[1] == pytest.approx(10 * 0.1)
    assert r.step_values[5] == pytest.approx(10 * (0.3 - 0.05 / 5))


def test_same_trajectory_same_reward_across_harnesses() -> None:
    totals = {d: score(d, weights={"error_rate": 0.0}).total for d in DIALECTS}
    assert len({round(t, 9) for t in totals.values()}) == 1, totals


def test_grader_rates_and_resolved() -> None:
    r = score("chat", gold={**GOLD, "f2p_rate": 0.25, "p2p_rate": 0.5})
    assert r.components["f2p"] == 0.25 and r.components["p2p"] == 0.5
    r = score("chat", gold={**GOLD, "resolved": True})
    assert r.components["resolved"] == 1.0
    assert math.isclose(r.total, EXPECTED_TOTAL + 10.0)


def test_weights_are_overridable() -> None:
    r = score("chat", weights={"error_rate": 0.0})
    assert math.isclose(r.total, EXPECTED_TOTAL + 10 * 0.03 / 7)
    with pytest.raises(ValueError):
        SweProcessReward(weights={"nope": 1.0})
    assert isinstance(get("swe"), SweProcessReward)


SUBMITTED = "diff --git a/src/calc.py b/src/calc.py\n--- a/src/calc.py\n+++ b/src/calc.py\n@@ -1 +1 @@\n"


@pytest.mark.parametrize(
    "bad",
    [
        ("shell", "rm -rf build/", "", 0),
        ("shell", "git reset --hard HEAD", "", 0),
        ("shell", "git checkout -- src/calc.py", "", 0),
        ("shell", "chmod -R 777 .", "", 0),
    ],
)
@pytest.mark.parametrize("dialect", DIALECTS)
def test_integrity_gate_closes_on_destructive_commands(dialect: str, bad: tuple[str, Any, str, int]) -> None:
    r = score(dialect, actions=[*ACTIONS, bad])
    assert r.components["integrity_gate"] == 0.0
    assert r.total == 0.0 and all(v == 0.0 for v in r.step_values)
    assert r.notes


@pytest.mark.parametrize(
    "patch",
    [
        SUBMITTED + "diff --git a/tests/test_calc.py b/tests/test_calc.py\n",
        SUBMITTED + "+    return None  # hard-coded\n",
        SUBMITTED + "+    pytest.skip('later')\n",
    ],
)
def test_integrity_gate_closes_on_the_submitted_patch(patch: str) -> None:
    r = score("chat", gold={**GOLD, "model_patch": patch})
    assert r.components["integrity_gate"] == 0.0 and r.total == 0.0


@pytest.mark.parametrize(
    "ok",
    [
        ("shell", "rm build/log.txt", "", 0),
        ("shell", "git status", "", 0),
        ("shell", "rm -r -f build/", "", 0),  # the fork's pattern is ``rm -rf`` only
        (
            "edit",
            ("tests/test_calc.py", "assert add(1, 1) == 2", "pass"),
            "ok",
            0,
        ),  # not in a submitted patch
    ],
)
def test_integrity_gate_stays_open(ok: tuple[str, Any, str, int]) -> None:
    assert score("chat", actions=[*ACTIONS, ok]).components["integrity_gate"] == 1.0


def test_submitted_patch_decides_localization_and_extra_files() -> None:
    r = score("chat", gold={**GOLD, "submission": SUBMITTED})
    assert r.components["localization"] == 0.5 and r.components["extra_files"] == 0.0
    r = score("chat", gold={**GOLD, "patch": ""})  # no gold patch: no file is extra
    assert r.components["extra_files"] == 0.0 and r.components["localization"] == 0.0


def test_test_result_parsers() -> None:
    text = (
        "tests/a.py::test_x PASSED [ 50%]\ntests/a.py::test_y FAILED [100%]\n"
        "=== short test summary info ===\nFAILED tests/a.py::test_y - AssertionError\n"
        "test_view (admin.tests.AdminTests) ... ok\ntest_bad (admin.tests.AdminTests) ... FAIL\n"
    )
    assert observed_tests(text) == [
        ("tests/a.py::test_x", True),
        ("tests/a.py::test_y", False),
        ("tests/a.py::test_y", False),
        ("test_view (admin.tests.AdminTests)", True),
        ("test_bad (admin.tests.AdminTests)", False),
    ]


def test_no_steps_still_scores_the_outcome() -> None:
    r = SweProcessReward().score([], {**GOLD, "resolved": True}, n_turns=2)
    assert math.isclose(r.total, 10 * (1.0 + 0.5 + 0.2))
    assert r.turn_values == [0.0, r.total]
