"""Which recorded attempts a recipe trains on: Balanced Adaptive Rollout selection and
slime's dynamic-sampling filters, over groups of attempts (one task's runs), and the
``Selection`` value every reader of samples passes to ``pipeline.iter_samples``.

Owns: the selection rules, as pure functions over anything with ``reward``, ``status``
and ``metadata`` (``reconstruct.Sample`` qualifies), and ``Selection`` (``spec.py``). May
import: the standard library, ``orchard_rec.errors``, ``orchard_rec.policy`` and
``orchard_rec.reconstruct``; never proxy, storage or exporters.
"""

from orchard_rec.selection.bar import Attempt, BarSpec, bar_select, parse_bar, rank_key
from orchard_rec.selection.filters import FILTERS, FilterChain, GroupFilter
from orchard_rec.selection.spec import Selection

__all__ = [
    "FILTERS",
    "Attempt",
    "BarSpec",
    "FilterChain",
    "GroupFilter",
    "Selection",
    "bar_select",
    "parse_bar",
    "rank_key",
]
