"""The ``verify`` loop: score each sample with a ``Scorer`` and compare (``compare``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice

from orchard_rec.verify.compare import DEFAULT_MAX_OVER, SampleCheck, SampleView, VerifyReport, check_sample
from orchard_rec.verify.scorer import Scorer

__all__ = ["DEFAULT_TOLERANCE", "verify_samples"]

DEFAULT_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.2, "float16": 0.1}
"""Per-token tolerance (nats) by the trainer's dtype. float32: with the same weights, vLLM's CPU
kernels against transformers' differ by at most ~1e-6 on the tiny Qwen2 (``tests/vllm/
test_verify_vllm.py``), ~2e-4 in an independent check; a changed prompt token moves later
positions by 1e-2 and more. bfloat16/float16: the rounding of a 7/10-bit mantissa in the logits."""


def verify_samples(
    samples: Iterable[SampleView],
    scorer: Scorer,
    *,
    tolerance: float,
    max_samples: int | None = None,
    max_over: float = DEFAULT_MAX_OVER,
    on_check: Callable[[SampleCheck], None] | None = None,
) -> VerifyReport:
    """Score and check every sample (at most ``max_samples`` of those with log-probs); samples
    without recorded log-probs are skipped and counted, never scored."""
    report = VerifyReport(tolerance)
    scored = 0
    for view in samples if max_samples is None else _limit(samples, max_samples):
        if view.rollout_log_probs is None or view.metadata.get("missing_logprobs") or not any(view.loss_mask):
            check = check_sample(view, [0.0] * view.response_length, tolerance=tolerance, max_over=max_over)
        else:
            check = check_sample(view, scorer.log_probs(view), tolerance=tolerance, max_over=max_over)
            scored += 1
        report.add(check)
        if on_check is not None:
            on_check(check)
    return report


def _limit(samples: Iterable[SampleView], n: int) -> Iterable[SampleView]:
    return islice(samples, n)
