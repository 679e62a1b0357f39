"""The comparison itself: a trainer's log-probs against the sampler's, on trained positions.

Pure Python on lists (tensors are taken through ``tolist()``): no torch needed, so a trainer
can call ``check_sample`` / ``check_batch`` with the log-probs of its own forward pass.

Per sample, over every position the mask trains (``loss_mask == 1``) up to the first realign
point: the mean and max absolute difference, ``k3`` (the estimate of KL(sampler ‖ trainer)
from the sampled tokens: with ``r = p_trainer / p_sampler``, ``k3 = (r - 1) - log r``, which
is unbiased, never negative and of low variance; Schulman, "Approximating KL divergence"),
and how many positions exceed ``tolerance``. The verdict:

- ``ok``: no position over ``tolerance``;
- ``numerics``: a few positions over it (at most ``max_over`` of them) and a mean within it:
  what different kernels and precisions give;
- ``misaligned``: a mean over ``tolerance`` or more than ``max_over`` of the positions over it:
  the sampler scored other tokens or another context (a mask off by one, a changed or dropped
  prompt token); ``hint`` says when the log-probs fit one position off;
- ``skipped``: no recorded log-probs (``metadata.missing_logprobs``, or none at all) or
  nothing trained.

A realigned sample (``--on-mismatch realign``) is checked up to its first realign point: the
first turn of a realigned call (``metadata.realigned``, ``turns``). After it the server scored
the turns on the client's re-encoded text, not on the sample's ids, so those positions are
reported apart as "realigned context" (their count and their differences), never as
misaligned: ``realigned_trained`` is the number of trained tokens realign moved onto a context
the sampler never saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_MAX_OVER",
    "SampleCheck",
    "SampleView",
    "VerifyReport",
    "check_batch",
    "check_sample",
    "sample_view",
]

DEFAULT_MAX_OVER = 0.05
"""The share of checked positions over the tolerance that numerics may still explain."""


@dataclass
class SampleView:
    """What the check reads of a sample, whatever carried it (orchard ``Sample``, slime's
    ``Sample`` or its dict, a jsonl row)."""

    session_id: str
    index: int
    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float] | None
    metadata: dict[str, Any]
    turns: list[tuple[str, int, int]]
    images: list[Any] = field(default_factory=list)
    """PIL images, or orchard ``ImageRef`` with their bytes."""

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def branch(self) -> int:
        return int(self.metadata.get("branch", 0) or 0)

    def realign_start(self) -> int | None:
        """The first response position scored on a context the sample does not hold: the start
        of the first realigned call's turn; None when the sample was not realigned."""
        calls = set(self.metadata.get("realigned") or ())
        if not calls:
            return None
        starts = [s for c, s, _ in self.turns if c in calls]
        if starts:
            return min(starts)
        points = self.metadata.get("realign_points") or ()
        return min(points) - self.prompt_length if points else 0


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _list(v: Any) -> Any:
    return v.tolist() if hasattr(v, "tolist") else v


def sample_view(obj: Any) -> SampleView:
    """The fields the check needs, from an orchard ``Sample``, a slime ``Sample`` (or its
    ``to_dict()``) or a jsonl row."""
    meta = dict(_get(obj, "metadata") or {})
    turns_attr = _get(obj, "turns")
    if turns_attr is not None and not isinstance(obj, Mapping):
        turns = [(t.call_id, t.start, t.end) for t in turns_attr]
    else:
        turns = [(str(c), int(s), int(e)) for c, s, e in meta.get("turns") or ()]
    meta.pop("turns", None)
    lps = _get(obj, "rollout_log_probs")
    images = list(_get(obj, "images") or ())
    mm = _get(obj, "multimodal_inputs")
    if not images and isinstance(mm, Mapping):
        images = list(mm.get("images") or ())
    idx = _get(obj, "index")
    return SampleView(
        session_id=str(_get(obj, "session_id") or ""),
        index=int(idx) if idx is not None else 0,
        tokens=[int(t) for t in _list(_get(obj, "tokens"))],
        response_length=int(_get(obj, "response_length")),
        loss_mask=[int(m) for m in _list(_get(obj, "loss_mask") or ())],
        rollout_log_probs=None if lps is None else [float(x) for x in _list(lps)],
        metadata=meta,
        turns=turns,
        images=images,
    )


@dataclass
class SampleCheck:
    """One sample's comparison. Differences are ``trainer - sampler`` in nats."""

    session_id: str
    index: int
    branch: int
    status: str
    """ok | numerics | misaligned | skipped"""
    checked: int = 0
    mean_abs: float = 0.0
    max_abs: float = 0.0
    kl_k3: float = 0.0
    over: int = 0
    worst: int | None = None
    """Token index of the largest difference."""
    realigned_trained: int = 0
    """Trained positions after the first realign point (not checked)."""
    realigned_mean_abs: float | None = None
    realigned_max_abs: float | None = None
    realign_point: int | None = None
    """Token index of the first realign point."""
    hint: str | None = None
    abs_diffs: list[float] = field(default_factory=list, repr=False)
    k3s: list[float] = field(default_factory=list, repr=False)

    def line(self) -> str:
        head = f"{self.session_id}#{self.branch} (sample {self.index})"
        if self.status == "skipped":
            return f"{head}: skipped, {self.hint}"
        out = (
            f"{head}: {self.status}, {self.checked} positions, mean |d| {self.mean_abs:.2e}, "
            f"max {self.max_abs:.2e}, KL k3 {self.kl_k3:.2e}, {self.over} over tolerance"
        )
        if self.realign_point is not None:
            out += f"; realigned context after token {self.realign_point}: {self.realigned_trained} trained"
            if self.realigned_max_abs is not None:
                out += f" (mean |d| {self.realigned_mean_abs:.2e}, max {self.realigned_max_abs:.2e})"
        if self.hint:
            out += f"; {self.hint}"
        return out

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("abs_diffs", "k3s")}


def _k3(sampler: float, trainer: float) -> float:
    d = trainer - sampler
    if d > 50:  # exp overflows long before: the estimate is this large anyway
        return math.inf
    return math.expm1(d) - d


def _shift_hint(view: SampleView, trainer: Sequence[float], positions: list[int], mean: float) -> str | None:
    """Whether the recorded log-probs fit the trainer's one position off (an off-by-one)."""
    lps = view.rollout_log_probs or []
    for shift in (-1, 1):
        pairs = [(trainer[r + shift], lps[r]) for r in positions if 0 <= r + shift < len(trainer)]
        if pairs:
            m = sum(abs(t - s) for t, s in pairs) / len(pairs)
            if m < mean / 10:
                return f"the recorded log-probs fit the trainer's {shift:+d} position off (a shifted mask or log-probs)"
    return None


def check_sample(
    sample: Any,
    trainer_log_probs: Sequence[float] | Any,
    *,
    tolerance: float,
    max_over: float = DEFAULT_MAX_OVER,
) -> SampleCheck:
    """Compare ``trainer_log_probs`` (one per response position: the trainer's log-prob of
    ``tokens[prompt_length + r]`` given the tokens before it, as slime's ``log_probs``) with the
    sample's recorded ``rollout_log_probs`` on its trained positions."""
    view = sample if isinstance(sample, SampleView) else sample_view(sample)
    check = SampleCheck(view.session_id, view.index, view.branch, "ok")
    trainer = [float(x) for x in _list(trainer_log_probs)]
    lps = view.rollout_log_probs
    if lps is None or view.metadata.get("missing_logprobs"):
        check.status, check.hint = "skipped", "no recorded log-probs"
        return check
    if len(trainer) != view.response_length or len(lps) != view.response_length:
        raise ValueError(
            f"sample {view.index}: {len(trainer)} trainer log-probs, {len(lps)} recorded, "
            f"response_length {view.response_length}"
        )
    start = view.realign_start()
    limit = view.response_length if start is None else start
    trained = [r for r, m in enumerate(view.loss_mask) if m]
    if not trained:
        check.status, check.hint = "skipped", "nothing trained (mask all 0)"
        return check
    positions = [r for r in trained if r < limit]
    after = [r for r in trained if r >= limit]
    if start is not None:
        check.realign_point = view.prompt_length + start
        check.realigned_trained = len(after)
        if after:
            d_after = [abs(trainer[r] - lps[r]) for r in after]
            check.realigned_mean_abs = sum(d_after) / len(d_after)
            check.realigned_max_abs = max(d_after)
    diffs = [abs(trainer[r] - lps[r]) for r in positions]
    check.abs_diffs = diffs
    check.k3s = [_k3(lps[r], trainer[r]) for r in positions]
    check.checked = len(positions)
    if not positions:
        check.hint = "every trained position is realigned context"
        return check
    check.mean_abs = sum(diffs) / len(diffs)
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    check.max_abs, check.worst = diffs[worst], view.prompt_length + positions[worst]
    check.kl_k3 = sum(check.k3s) / len(check.k3s)
    check.over = sum(1 for d in diffs if d > tolerance)
    if check.mean_abs > tolerance or check.over > max_over * len(diffs):
        check.status = "misaligned"
        check.hint = _shift_hint(view, trainer, positions, check.mean_abs)
    elif check.over:
        check.status = "numerics"
    return check


@dataclass
class VerifyReport:
    """Every sample's check, and the totals over all checked positions."""

    tolerance: float
    checks: list[SampleCheck] = field(default_factory=list)

    def add(self, check: SampleCheck) -> None:
        self.checks.append(check)

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.status == status)

    @property
    def misaligned(self) -> int:
        return self.count("misaligned")

    @property
    def skipped(self) -> int:
        return self.count("skipped")

    def totals(self) -> dict[str, Any]:
        diffs = [d for c in self.checks for d in c.abs_diffs]
        k3s = [k for c in self.checks for k in c.k3s]
        return {
            "samples": len(self.checks),
            "ok": self.count("ok"),
            "numerics": self.count("numerics"),
            "misaligned": self.misaligned,
            "skipped": self.skipped,
            "checked": len(diffs),
            "mean_abs": sum(diffs) / len(diffs) if diffs else 0.0,
            "max_abs": max(diffs, default=0.0),
            "kl_k3": sum(k3s) / len(k3s) if k3s else 0.0,
            "over": sum(c.over for c in self.checks),
            "tolerance": self.tolerance,
            "realigned_samples": sum(1 for c in self.checks if c.realign_point is not None),
            "realigned_trained": sum(c.realigned_trained for c in self.checks),
        }

    def summary(self) -> str:
        t = self.totals()
        out = (
            f"{t['samples']} samples: {t['ok']} ok, {t['numerics']} numerics, {t['misaligned']} misaligned, "
            f"{t['skipped']} skipped (no log-probs); {t['checked']} trained positions checked: "
            f"mean |d| {t['mean_abs']:.2e}, max {t['max_abs']:.2e}, KL(sampler||trainer) k3 {t['kl_k3']:.2e}, "
            f"{t['over']} over tolerance {self.tolerance:g}"
        )
        if t["realigned_samples"]:
            out += (
                f"; {t['realigned_samples']} realigned samples: {t['realigned_trained']} trained tokens "
                "on a context the sampler never saw (realigned context, not checked)"
            )
        return out


def check_batch(
    samples: Iterable[Any],
    trainer_log_probs: Iterable[Sequence[float] | Any],
    *,
    tolerance: float,
    max_over: float = DEFAULT_MAX_OVER,
) -> VerifyReport:
    """``check_sample`` over a batch (samples and their trainer log-probs, in the same order)."""
    report = VerifyReport(tolerance)
    for s, lp in zip(samples, trainer_log_probs, strict=True):
        report.add(check_sample(s, lp, tolerance=tolerance, max_over=max_over))
    return report
