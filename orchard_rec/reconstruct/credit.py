"""Credit policies: which generated tokens a sample trains on, and how much.

A policy only ever turns mask-1 positions off or weights them: it never credits a token
the model did not generate (invariant 2 holds for every policy by construction).

- ``assistant`` (default): every generated token.
- ``last-turn``: only the last generation of each sample.
- ``turn-weights``: a weight per generation turn (``token_weights``), mask 0 where 0.
- ``value``: value-based segment credit as in credit-assignment SFT: given the value
  after each step (``Outcome.step_values``, one per generation in session order), credit
  only the turns where the value rises over the previous step (the first turn against
  ``baseline``).
- ``critical-step``: credit-assignment SFT on the critical mistake: every turn of a
  resolved run; otherwise the turns before the step after which the value never
  recovers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from orchard_rec.errors import UsageError
from orchard_rec.reconstruct.sample import Sample
from orchard_rec.records import Outcome

__all__ = [
    "CREDIT_POLICIES",
    "AssistantCredit",
    "CreditPolicy",
    "CriticalStepCredit",
    "LastTurnCredit",
    "TurnWeightsCredit",
    "ValueCredit",
    "credit_policy",
    "critical_step",
]


class CreditPolicy(Protocol):
    name: str

    def apply(self, sample: Sample, outcome: Outcome | None) -> None:
        """Adjust ``sample.loss_mask`` / ``sample.token_weights`` in place."""


def _keep_turns(sample: Sample, keep: Sequence[bool]) -> None:
    for turn, k in zip(sample.turns, keep):
        if not k:
            for i in range(turn.start, turn.end):
                sample.loss_mask[i] = 0


class AssistantCredit:
    name = "assistant"

    def apply(self, sample: Sample, outcome: Outcome | None) -> None:
        sample.metadata["credit"] = self.name


class LastTurnCredit:
    name = "last-turn"

    def apply(self, sample: Sample, outcome: Outcome | None) -> None:
        _keep_turns(sample, [i == len(sample.turns) - 1 for i in range(len(sample.turns))])
        sample.metadata["credit"] = self.name


class TurnWeightsCredit:
    """Weights per generation turn, in sample order; missing weights count as 1."""

    name = "turn-weights"

    def __init__(self, weights: Sequence[float] | None = None) -> None:
        self.weights = list(weights) if weights is not None else None

    def apply(self, sample: Sample, outcome: Outcome | None) -> None:
        weights = self.weights
        if weights is None and outcome is not None and outcome.metadata.get("turn_weights") is not None:
            weights = list(outcome.metadata["turn_weights"])
        weights = weights or []
        tw = [0.0] * sample.response_length
        for k, turn in enumerate(sample.turns):
            w = float(weights[k]) if k < len(weights) else 1.0
            for i in range(turn.start, turn.end):
                if sample.loss_mask[i]:
                    tw[i] = w
                    if w == 0.0:
                        sample.loss_mask[i] = 0
        sample.token_weights = tw
        sample.metadata["credit"] = self.name


class ValueCredit:
    name = "value"

    def __init__(self, baseline: float = 0.0) -> None:
        self.baseline = baseline

    def apply(self, sample: Sample, outcome: Outcome | None) -> None:
        values = (
            list(outcome.step_values) if outcome is not None and outcome.step_values is not None else None
        )
        if values is None:
            sample.metadata["credit"] = self.name + ":no-step-values"
            return
        order = sample.metadata.get("turn_steps")  # session-order step index of each turn, when set
        steps = order if order is not None else list(range(len(sample.turns)))
        keep = []
        for s in steps:
            prev = values[s - 1] if s - 1 >= 0 and s - 1 < len(values) else self.baseline
            keep.append(s < len(values) and values[s] > prev)
        _keep_turns(sample, keep)
        sample.metadata["credit"] = self.name


def critical_step(values: Sequence[float], baseline: float = 0.0) -> int | None:
    """The first step after which the value never recovers: ``values[t]`` falls below the
    value before it and no later value gets back to that level. None when there is none."""
    for t, v in enumerate(values):
        before = values[t - 1] if t > 0 else baseline
        if v < before and all(later < before for later in values[t:]):
            return t
    return None


class CriticalStepCredit:
    """Credit-assignment SFT: train on everything of a resolved run; otherwise only on the
    turns before the critical mistake (``critical_step`` of ``Outcome.step_values``). A run
    that is not resolved and has no step values gets no credit (nothing says which of its
    turns were good). Resolved = the outcome's ``resolved`` metadata, else a reward > 0."""

    name = "critical-step"

    def __init__(self, baseline: float = 0.0) -> None:
        self.baseline = baseline

    def apply(self, sample: Sample, outcome: Outcome | None) -> None:
        meta = outcome.metadata if outcome is not None else {}
        if "resolved" in meta:
            resolved = meta["resolved"] in (True, 1, "true", "True")
        else:
            r = outcome.reward if outcome is not None else None
            resolved = isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0
        if resolved:
            sample.metadata["credit"] = self.name + ":resolved"
            return
        values = (
            list(outcome.step_values) if outcome is not None and outcome.step_values is not None else None
        )
        order = sample.metadata.get("turn_steps")
        steps = order if order is not None else list(range(len(sample.turns)))
        if values is None:
            _keep_turns(sample, [False] * len(sample.turns))
            sample.metadata["credit"] = self.name + ":no-step-values"
            return
        c = critical_step(values, self.baseline)
        _keep_turns(sample, [c is None or s < c for s in steps])
        sample.metadata["credit"] = self.name
        sample.metadata["critical_step"] = c


CREDIT_POLICIES: dict[str, Callable[[], CreditPolicy]] = {
    "assistant": AssistantCredit,
    "last-turn": LastTurnCredit,
    "turn-weights": TurnWeightsCredit,
    "value": ValueCredit,
    "critical-step": CriticalStepCredit,
}


def credit_policy(name: str) -> CreditPolicy:
    try:
        return CREDIT_POLICIES[name]()
    except KeyError:
        raise UsageError(f"unknown credit policy {name!r}; known: {', '.join(CREDIT_POLICIES)}") from None
