"""The rule-set interface and its registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

from orchard_rec.steps import Step

__all__ = ["RewardResult", "RuleSet", "get", "names", "register"]


@dataclass
class RewardResult:
    total: float
    components: dict[str, float]
    """Each named term's value before weighting (e.g. ``localization: 0.5``)."""
    step_values: list[float] = field(default_factory=list)
    """Per step (in ``steps`` order): the weighted contribution earned at that step;
    ``sum(step_values) == total`` (up to float rounding)."""
    turn_values: list[float] = field(default_factory=list)
    """The running value after each assistant turn (cumulative step contributions), the
    shape ``Outcome.step_values`` and the ``value`` / ``critical-step`` credit policies read."""
    notes: list[str] = field(default_factory=list)
    """Why a gate closed, and other remarks a person reading the reward should see."""


class RuleSet(Protocol):
    """A rule set may also name ``gold_fields``: the outcome metadata keys its grader writes.
    ``orchard-rec reward`` then skips (with a warning) a session that has none of them."""

    name: str

    def score(self, steps: Sequence[Step], gold: Mapping[str, Any], n_turns: int) -> RewardResult:
        """Score one session: its steps, the outcome metadata (gold fields), its number of turns."""


_REGISTRY: dict[str, type[Any]] = {}


def register(cls: type[Any]) -> type[Any]:
    _REGISTRY[cls.name] = cls
    return cls


def _load_entry_points() -> None:
    for ep in entry_points(group="orchard_rec.rewards"):
        if ep.name not in _REGISTRY:
            _REGISTRY[ep.name] = ep.load()


def names() -> list[str]:
    _load_entry_points()
    return sorted(_REGISTRY)


def get(name: str, **options: Any) -> RuleSet:
    _load_entry_points()
    if name not in _REGISTRY:
        raise KeyError(f"unknown rule set {name!r}; choose from {', '.join(sorted(_REGISTRY))}")
    rule_set: RuleSet = _REGISTRY[name](**options)
    return rule_set
