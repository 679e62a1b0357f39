"""Rule-based process rewards over steps parsed from recorded traffic.

A rule set is named terms over a session's steps (``orchard_rec.steps``) and its outcome
metadata (the grader's gold fields); it returns the total, each term, and per-step
values (each term's contribution at the step that earned it), so credit policies can
use them. ``swe`` is Orchard-SWE's ``process_shaped`` rule set. Register your own with
``register(RuleSet)`` or the entry-point group ``orchard_rec.rewards``.

Owns: the rule-set interface, the registry and the built-in rule sets. May import: the
standard library and ``orchard_rec.steps``; never proxy, storage or exporters.
"""

from orchard_rec.rewards.base import RewardResult, RuleSet, get, names, register
from orchard_rec.rewards.swe import SWE_WEIGHTS, SweProcessReward, observed_tests

__all__ = [
    "SWE_WEIGHTS",
    "RewardResult",
    "RuleSet",
    "SweProcessReward",
    "get",
    "names",
    "observed_tests",
    "register",
]
