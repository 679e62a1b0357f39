"""The comparison on lists (``orchard_rec.verify.compare``): verdicts, realigned context, skips.
No model: the trainer's log-probs are given, as a trainer calling ``check_batch`` gives them."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from orchard_rec.reconstruct import Sample, Turn
from orchard_rec.verify import check_batch, check_sample

TOL = 1e-3


def sample(lps: list[float], mask: list[int], **meta) -> Sample:  # type: ignore[no-untyped-def]
    n = len(lps)
    turns = [Turn("c1", 0, n // 2), Turn("c2", n // 2 + 1, n)]
    return Sample("s", list(range(3 + n)), n, mask, lps, turns, metadata=dict(meta))


def test_equal_log_probs_pass_and_numerics_are_told_apart() -> None:
    lps = [-0.5, -1.0, -2.0, 0.0, -0.25, -3.0]
    mask = [1, 1, 1, 0, 1, 1]
    c = check_sample(sample(lps, mask), [x + 1e-5 for x in lps], tolerance=TOL)
    assert (c.status, c.checked, c.over) == ("ok", 5, 0)
    assert c.max_abs == pytest.approx(1e-5) and c.kl_k3 == pytest.approx(0.5e-10, rel=0.01)
    # one position of 20 off by 5e-3, the mean within tolerance: what kernels do
    long = [-1.0] * 20
    trainer = list(long)
    trainer[7] += 5e-3
    c = check_sample(sample(long, [1] * 20), trainer, tolerance=TOL)
    assert (c.status, c.over, c.worst) == ("numerics", 1, 3 + 7)


def test_an_off_by_one_is_misaligned_and_says_so() -> None:
    lps = [-0.1, -4.0, -0.2, -5.0, -0.3, -6.0, -0.4, -7.0]
    mask = [1] * 8
    trainer = lps[1:] + [-1.0]  # the recorded log-probs sit one position late
    c = check_sample(sample(lps, mask), trainer, tolerance=TOL)
    assert c.status == "misaligned" and c.mean_abs > 1
    assert c.hint is not None and "-1 position" in c.hint


def test_realigned_context_is_reported_apart_never_misaligned() -> None:
    lps = [-1.0] * 10
    s = sample(lps, [1] * 5 + [0] + [1] * 4, realigned=["c2"], realign_points=[5])
    trainer = lps[:6] + [-9.0] * 4  # the server scored c2 on another context
    c = check_sample(s, trainer, tolerance=TOL)
    assert (c.status, c.checked, c.realigned_trained, c.realign_point) == ("ok", 5, 4, 3 + 6)
    assert c.realigned_max_abs == pytest.approx(8.0)
    report = check_batch([s], [trainer], tolerance=TOL)
    assert report.misaligned == 0 and report.totals()["realigned_trained"] == 4
    assert "4 trained tokens on a context the sampler never saw" in report.summary()


def test_samples_without_log_probs_or_training_are_skipped_and_counted() -> None:
    a = sample([0.0] * 4, [1] * 4, missing_logprobs=True)
    b = sample([-1.0] * 4, [0] * 4)
    report = check_batch([a, b], [[-1.0] * 4] * 2, tolerance=TOL)
    assert [c.status for c in report.checks] == ["skipped", "skipped"] and report.skipped == 2


def test_slime_dicts_and_tensors_are_taken_as_they_come() -> None:
    torch = pytest.importorskip("torch")
    d = {
        "session_id": "s",
        "index": 4,
        "tokens": [1, 2, 3, 4],
        "response_length": 2,
        "loss_mask": [1, 1],
        "rollout_log_probs": [-1.0, -2.0],
        "metadata": {"turns": [["c", 0, 2]], "branch": 1},
    }
    c = check_sample(d, torch.tensor([-1.0, -2.0 + 1e-6]), tolerance=TOL)
    assert (c.status, c.index, c.branch) == ("ok", 4, 1)
    assert math.isfinite(c.kl_k3)


def test_the_cli_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, orchard_rec.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_slime_samples_as_a_trainer_holds_them() -> None:
    """slime's ``Sample`` (the contracts' stand-in when slime is not installed), made from our export."""
    from orchard_rec.exporters.contracts import slime_sample_class, to_slime_dict

    lps = [-1.0, -2.0, 0.0, -0.5]
    s = sample(lps, [1, 1, 0, 1], realigned=["c2"])
    slime = slime_sample_class().from_dict(to_slime_dict(s, group_id=0))
    c = check_sample(slime, lps[:3] + [-7.0], tolerance=TOL)
    assert (c.status, c.checked, c.realigned_trained) == ("ok", 2, 1)
