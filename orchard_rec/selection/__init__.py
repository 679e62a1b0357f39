"""Which recorded attempts a recipe trains on: Balanced Adaptive Rollout selection and
slime's dynamic-sampling filters, over groups of attempts (one task's runs).

Owns: the selection rules, as pure functions over anything with ``reward``, ``status``
and ``metadata`` (``reconstruct.Sample`` qualifies). May import: the standard library and
``orchard_rec.reconstruct`` (for ``numeric_reward``); never proxy, storage or exporters.
"""

from orchard_rec.selection.bar import Attempt, BarSpec, bar_select, parse_bar, rank_key
from orchard_rec.selection.filters import FILTERS, FilterChain, GroupFilter

__all__ = [
    "FILTERS",
    "Attempt",
    "BarSpec",
    "FilterChain",
    "GroupFilter",
    "bar_select",
    "parse_bar",
    "rank_key",
]
