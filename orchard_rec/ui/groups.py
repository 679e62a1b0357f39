"""Task groups: the attempts that share a value of one outcome-metadata key (``task``, say),
as GRPO-style training sees them.

``group_list`` counts the groups of a key in SQL (one aggregate over the ``sessions`` table,
``storage.queries.group_counts``).
``group_view`` reads one group: every attempt's reward, status, length and turns, its
advantage within the group (reward minus the group mean, and that over the std as GRPO
normalises: verl's ``compute_grpo_outcome_advantage`` in ``verl/trainer/ppo/core_algos.py``,
``(r - mean) / (std + 1e-6)`` with the unbiased ``torch.std``, a group of one has mean 0 and
std 1), the pass rate (the ``pass-rate`` filter's: positive, not aborted), and which attempts
a recipe keeps: the samples come from ``pipeline.iter_samples`` and the choice from
``pipeline.select_group``, the same calls ``export --group-by K --select bar:N:LO:HI --filter F``
makes. ``attempt_diff`` lays two attempts side by side from their last call's conversation
and names the first step where they part.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from orchard_rec.errors import OrchardError
from orchard_rec.pipeline import Attempt, Selection, SelectionStats, iter_samples, select_group
from orchard_rec.reconstruct import Sample, numeric_reward
from orchard_rec.selection import FILTERS, BarSpec, FilterChain, parse_bar
from orchard_rec.selection.filters import is_positive
from orchard_rec.storage import queries
from orchard_rec.storage.queries import meta_value
from orchard_rec.storage.store import Store
from orchard_rec.ui.chat import conversation, response_turn
from orchard_rec.ui.compare import msg_key

__all__ = [
    "FILTERS",
    "GroupError",
    "GroupView",
    "attempt_diff",
    "group_list",
    "group_view",
    "meta_value",
    "parse_select",
]

GRPO_EPS = 1e-6


class GroupError(ValueError):
    pass


def parse_select(text: str) -> BarSpec | None:
    """``bar:N:LO:HI[:STRIDE]`` as ``export --select`` takes it (``selection.parse_bar``); ``""`` is none."""
    if not text.strip():
        return None
    try:
        return parse_bar(text)
    except ValueError as e:
        raise GroupError(str(e)) from None


def group_list(store: Store, key: str, *, limit: int = 500) -> list[dict[str, Any]]:
    """The groups of ``key``: value, attempts, passing attempts, mean numeric reward; largest first."""
    return queries.group_counts(store, key, limit=limit)


@dataclass
class AttemptRow:
    id: str
    reward: Any
    value: float | None
    status: str
    tokens: int
    response: int
    trained: int
    turns: int
    calls: int
    samples: int
    advantage: float = 0.0
    normalized: float = 0.0
    kept: bool | None = None
    removed: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class GroupView:
    key: str
    value: str
    attempts: list[AttemptRow]
    mean: float
    std: float
    pass_rate: float
    select: tuple[int, float, float] | None = None
    filters: list[str] = field(default_factory=list)
    bar: str | None = None
    dropped_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": self.value,
            "mean": self.mean,
            "std": self.std,
            "pass_rate": self.pass_rate,
            "select": None if self.select is None else "bar:{}:{:g}:{:g}".format(*self.select),
            "filters": self.filters,
            "bar": self.bar,
            "dropped_by": self.dropped_by,
            "attempts": [a.to_json() for a in self.attempts],
        }


def _members(store: Store, key: str, value: str) -> list[str]:
    return queries.group_members(store, key, value)


def group_view(
    store: Store,
    key: str,
    value: str,
    *,
    select_: tuple[int, float, float] | None = None,
    filters: list[str] | None = None,
    seed: int | None = None,
    on_mismatch: str = "split",
    credit: str = "assistant",
) -> GroupView:
    filters = list(filters or [])
    unknown = [f for f in filters if f not in FILTERS]
    if unknown:
        raise GroupError(f"unknown filter {unknown[0]!r}; choose from {', '.join(FILTERS)}")
    ids = _members(store, key, value)
    summaries = store.sessions(ids) if ids else []
    by_session: dict[str, list[Sample]] = defaultdict(list)
    if ids:
        try:
            for s in iter_samples(store, Selection(sessions=ids, on_mismatch=on_mismatch, credit=credit)):
                by_session[s.session_id].append(s)
        except (ValueError, OrchardError) as exc:
            raise GroupError(str(exc)) from None
    attempts = [Attempt(m, by_session.get(m.id, [])) for m in summaries]
    rows = [_row(a) for a in attempts]
    values = [r.value if r.value is not None else 0.0 for r in rows]
    if len(values) > 1:
        mean, std = statistics.fmean(values), statistics.stdev(values)
    else:  # verl: a group of one has mean 0, std 1
        mean, std = 0.0, 1.0
    for r, v in zip(rows, values):
        r.advantage = v - mean
        r.normalized = (v - mean) / (std + GRPO_EPS)
    view = GroupView(
        key=key,
        value=value,
        attempts=rows,
        mean=mean if len(values) > 1 else (values[0] if values else 0.0),
        std=std if len(values) > 1 else 0.0,
        pass_rate=sum(1 for a in attempts if is_positive(a)) / len(attempts) if attempts else 0.0,
        select=select_,
        filters=filters,
    )
    if attempts and (select_ is not None or filters):
        stats = SelectionStats()
        chain = FilterChain(filters, seed=seed or 0) if filters else None
        chosen = select_group(attempts, select_, chain, seed, stats)
        view.bar = next(iter(stats.bar), None)
        if chosen is None:
            view.dropped_by = next((n for n, c in stats.dropped.items() if c), None)
            for r in rows:
                r.kept = False
        else:
            keep = {id(a) for a in chosen}
            for a, r in zip(attempts, rows):
                r.kept = id(a) in keep
                r.removed = r.kept and bool(a.metadata.get("remove_sample"))
    return view


def _row(a: Attempt) -> AttemptRow:
    samples = a.samples
    return AttemptRow(
        id=a.summary.id,
        reward=a.summary.outcome.reward if a.summary.outcome else None,
        value=numeric_reward(a.reward),
        status=a.status,
        tokens=sum(len(s.tokens) for s in samples),
        response=sum(s.response_length for s in samples),
        trained=sum(sum(s.loss_mask) for s in samples),
        turns=sum(len(s.turns) for s in samples),
        calls=a.summary.call_count,
        samples=len(samples),
    )


def _steps(store: Store, sid: str) -> list[dict[str, Any]]:
    """An attempt's steps: the conversation its last generation call sent, then that answer."""
    last = None
    for c in store.calls(sid):
        if c.dialect.is_generation and c.request is not None:
            last = c
    if last is None:
        return []
    turns = conversation(last.request, last.dialect.value)
    ans = response_turn(last.response, last.dialect.value)
    if ans is not None:
        ans["answer"] = True
        turns.append(ans)
    return turns


def attempt_diff(store: Store, a: str, b: str) -> dict[str, Any]:
    """Two attempts side by side: their steps, and the first step where they differ."""
    sa, sb = _steps(store, a), _steps(store, b)
    ka, kb = [msg_key(m) for m in sa], [msg_key(m) for m in sb]
    first = next((i for i, (x, y) in enumerate(zip(ka, kb)) if x != y), None)
    if first is None and len(ka) != len(kb):
        first = min(len(ka), len(kb))
    return {"a": a, "b": b, "steps_a": sa, "steps_b": sb, "diverge": first}
