"""slime exports against what Orchard's fork needs to train on them (issue 41).

MSR-Orchard/slime at 331efaaeef75c98aad6ba1a2f5f50bd8149f6ab9 was run on these exports while
developing: ``slime/utils/types.py`` ``Sample.from_dict`` on every row of the ``.pt`` file (as
``slime/ray/rollout.py`` ``_get_rollout_data`` does for ``--load-debug-rollout-data``), then
``RolloutManager._convert_samples_to_train_data`` (default reward post-processing, and
``examples/orchard_swe/swe_opd_reward.py`` ``post_process_rewards``). Only the Ray actor around
them was stubbed. It read every file without error; what it produced is kept below
(``FORK_*``), and ``slime_contract_errors`` (our code, written from those lines) checks the same
requirements on each export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard_rec.exporters import get
from orchard_rec.exporters.contracts import slime_contract_errors, to_slime_dict
from orchard_rec.reconstruct import Sample, Turn
from orchard_rec.records import Outcome

pytestmark = pytest.mark.slow  # torch (and transformers for the GUI file): several seconds

# The fork's train_data on the GUI export (tests/exporters/test_images_export.py samples):
FORK_GUI_GROUP_IDS = [0, 1, 1, 1, 1]
FORK_GUI_PIXEL_ROWS = [None, 48, 240, 240, 96]  # multimodal_train_inputs["pixel_values"].shape[0]
FORK_GUI_GRIDS = [None, 1, 2, 2, 2]  # image_grid_thw rows: one per image
FORK_GUI_TURNS = ([None, 0, 1, 2, 3], [None, 4, 4, 4, 4])  # turn_index, num_turns_in_trajectory
# ... and on the partial-teacher export (tests/teacher/test_exports.py samples), with teacher_fill:
FORK_TEACHER_LENGTHS = [4, 1]  # train_data["teacher_log_probs"]: float32 tensors
FORK_TEACHER_MASKS = [[1, 1, 1, 0], [0]]


def _load(path: Path) -> list[dict[str, Any]]:
    import torch

    return list(torch.load(path, weights_only=False)["samples"])


def test_gui_export_carries_the_processor_output_the_fork_trains_on(tmp_path: Path) -> None:
    from tests.exporters.test_images_export import _samples

    get("slime", processor="demo").write(iter(_samples()), tmp_path / "g.pt")
    rows = _load(tmp_path / "g.pt")
    assert slime_contract_errors(rows) == []
    assert [d["group_id"] for d in rows] == FORK_GUI_GROUP_IDS
    mti = [d["multimodal_train_inputs"] for d in rows]
    assert [None if m is None else m["pixel_values"].shape[0] for m in mti] == FORK_GUI_PIXEL_ROWS
    assert [None if m is None else m["image_grid_thw"].shape[0] for m in mti] == FORK_GUI_GRIDS
    assert all(m is None or set(m) == {"pixel_values", "image_grid_thw"} for m in mti)
    turns = (
        [d["metadata"].get("turn_index") for d in rows],
        [d["metadata"].get("num_turns_in_trajectory") for d in rows],
    )
    assert turns == FORK_GUI_TURNS
    # without the processor output the fork would train on the tokens and never see the images
    for d in rows:
        d["multimodal_train_inputs"] = None
    assert any("never sees them" in e for e in slime_contract_errors(rows))


def test_partial_teacher_coverage_is_filled_as_the_forks_post_processing(tmp_path: Path) -> None:
    from tests.teacher.test_exports import _samples

    for order in (list(_samples()), list(reversed(_samples()))):
        get("slime", teacher_fill=True).write(iter(order), tmp_path / "t.pt")
        rows = _load(tmp_path / "t.pt")
        assert slime_contract_errors(rows) == []
        by_len = sorted(rows, key=lambda d: -d["response_length"])
        assert [len(d["teacher_log_probs"]) for d in by_len] == FORK_TEACHER_LENGTHS
        assert [d["teacher_valid_mask"] for d in by_len] == FORK_TEACHER_MASKS
        assert by_len[1]["teacher_log_probs"].tolist() == [0.0]
    # unfilled, the fork fails: KeyError 'teacher_log_probs' or a None among the tensors
    get("slime").write(iter(_samples()), tmp_path / "u.pt")
    assert any(
        e.startswith("teacher_log_probs: set on 1 of 2")
        for e in slime_contract_errors(_load(tmp_path / "u.pt"))
    )


def test_outcome_metadata_and_group_index_reach_the_slime_sample() -> None:
    s = Sample("s", [1, 2, 3], 1, [1], [-0.5], [Turn("c", 0, 1)], index=7, metadata={"call_ids": ["c"]})
    s.outcome = Outcome(
        reward=1.0, metadata={"exit_status": "TimeExceeded", "instance_id": "x__y-1", "call_ids": "no"}
    )
    d = to_slime_dict(s, group_id=7)
    # the fork's BAR and reward read these from sample.metadata; the sample's own keys win
    assert d["metadata"]["exit_status"] == "TimeExceeded" and d["metadata"]["instance_id"] == "x__y-1"
    assert d["metadata"]["call_ids"] == ["c"]
    assert d["group_index"] == 7 and d["group_id"] == 7  # vanilla slime groups by group_index
    s.group_index = 2
    assert to_slime_dict(s, group_id=7)["group_index"] == 2


def test_contract_errors_name_what_the_fork_would_fail_on() -> None:
    ok = {"status": "completed", "loss_mask": [1], "response_length": 1, "rollout_log_probs": [0.0]}
    assert slime_contract_errors([ok]) == []
    assert "status" in slime_contract_errors([{**ok, "status": "weird"}])[0]
    assert "loss mask length 2" in slime_contract_errors([{**ok, "loss_mask": [1, 1]}])[0]
    assert "rollout_log_probs" in slime_contract_errors([ok, {**ok, "rollout_log_probs": None}])[0]
    bad_mti = {
        **ok,
        "multimodal_inputs": {"images": [object()]},
        "multimodal_train_inputs": {"pixel_values": [[0.0]]},
    }
    assert "not a tensor" in slime_contract_errors([bad_mti])[0]
