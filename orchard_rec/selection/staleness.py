"""Staleness selection: samples whose tokens were sampled by weights too old to train on.

``export --policy-version V --max-staleness K`` (and/or ``--min-policy-version M``) sets a floor
(``policy.Staleness``): a generated token is stale when its version's number is below
``V - K`` (or ``M``), or its version has no number (``unknown``, vLLM's ``"default"``). Then:

- ``drop`` (default): a sample holding any stale generated token is left out;
- ``mask``: those tokens get loss mask 0 (and token weight 0), the sample is kept; a sample with
  no trainable token left is dropped (nothing to learn from).

Samples without versions (recorded before any version was known) count as stale under a
floor (reported as version ``none``): training on them would be a guess. ``StalenessStats`` counts what was done, for the
report. Pure: samples in, decisions out; the slime rollout plug-in uses the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from orchard_rec.policy import Staleness

__all__ = ["StaleMode", "StalenessStats", "apply_staleness"]

StaleMode = Literal["drop", "mask"]


@dataclass
class StalenessStats:
    """What a staleness floor did over an export."""

    floor: int | None = None
    samples: int = 0
    dropped: int = 0
    masked_samples: int = 0
    masked_tokens: int = 0
    stale_versions: dict[str, int] = field(default_factory=dict)
    """Stale generated tokens by version."""

    def summary(self) -> str:
        if self.floor is None:
            return ""
        parts = [f"policy versions below {self.floor} are stale"]
        parts.append(f"{self.dropped} of {self.samples} samples dropped")
        if self.masked_tokens:
            parts.append(f"{self.masked_tokens} tokens masked in {self.masked_samples} samples")
        if self.stale_versions:
            parts.append(
                "stale tokens by version: "
                + ", ".join(f"{v} {n}" for v, n in sorted(self.stale_versions.items()))
            )
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "floor": self.floor,
            "samples": self.samples,
            "dropped": self.dropped,
            "masked_samples": self.masked_samples,
            "masked_tokens": self.masked_tokens,
            "stale_versions": dict(self.stale_versions),
        }


def apply_staleness(
    sample: Any, floor: Staleness, mode: StaleMode = "drop", stats: StalenessStats | None = None
) -> bool:
    """Whether ``sample`` (a ``reconstruct.Sample``) is kept; with ``mask``, its stale generated
    tokens' ``loss_mask`` (and ``token_weights``) set to 0 in place."""
    if stats is not None:
        stats.floor = floor.floor
        stats.samples += 1
    if floor.floor is None:
        return True
    runs: list[tuple[str, int, int]]
    if sample.policy_versions is None:  # no version known: every generated token is a guess
        runs = [("none", t.start, t.end) for t in sample.turns]
    else:
        runs = [(v, st, e) for v, st, e in sample.policy_versions if floor.stale(v)]
    stale = [i for _, st, e in runs for i in range(st, min(e, sample.response_length))]
    if stats is not None:
        for v, st, e in runs:
            stats.stale_versions[v] = stats.stale_versions.get(v, 0) + max(0, e - st)
    mask = sample.loss_mask
    if not stale:
        return True
    if mode == "drop":
        if stats is not None:
            stats.dropped += 1
        return False
    for i in stale:
        mask[i] = 0
        if sample.token_weights is not None:
            sample.token_weights[i] = 0.0
    sample.metadata["stale_masked"] = len(stale)
    if not any(mask):
        if stats is not None:
            stats.dropped += 1
        return False
    if stats is not None:
        stats.masked_samples += 1
        stats.masked_tokens += len(stale)
    return True
