"""Samples straight from the database: storage → reconstruct, with selection, grouping and filters.

This is the one place that reads calls from a ``Store`` for reconstruction (``reconstruct/``
itself never touches storage); exporters, trainers and the CLI all take samples from here,
each with one ``Selection`` (``orchard_rec.selection.spec``: the options below are its
fields). ``iter_samples`` runs four stages: select the sessions and their calls, grouped
(``select_batches``); reconstruct each session (``Reconstruction``); keep and annotate
samples (``SampleFilter``); number them.

Selection is by session (``sessions``, ``since``, ``harness``). ``group_by`` names a key
of the sessions' outcome metadata (``task_id``, say; the special value ``session`` makes
each session a group): sessions with the same value form one GRPO-style group, groups
get consecutive ``group_index`` values and their samples come out contiguous. Group
filters use only the session outcomes, read before any call: ``pass_rate=(lo, hi)``
keeps groups whose fraction of passing sessions (reward > ``pass_threshold``) lies in
``[lo, hi]``, dropping all-pass and all-fail groups as balanced adaptive rollout does.
Sample filters (``statuses``, ``min_reward``) apply after reconstruction.

``reward_key`` picks the reward every sample carries: ``process`` is the stored process
reward's total (``orchard-rec reward``), any other key a named reward of the outcome or a
number in its metadata. With ``group_by``, recipe selection works on each group's
attempts (a session = an attempt, with its samples' reward and status): ``select =
(N, lo, hi)`` or ``(N, lo, hi, stride)`` keeps exactly N attempts by Balanced Adaptive Rollout, and ``filters``
apply slime's dynamic-sampling filters by name (``orchard_rec.selection``); what each
dropped is counted in ``selection_stats``. Both need the group's samples, so a group is
reconstructed whole before any of it is yielded.

``teacher`` looks up a sample's stored teacher log-probs (``orchard-rec teacher``) and
attaches them; ``require_teacher`` drops samples that have none.

Memory: without grouping, one streaming query and one session at a time; with grouping,
one group's calls at a time (one query per group).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from orchard_rec.reconstruct import (
    Generation,
    Sample,
    TeacherData,
    credit_policy,
    generation_of,
    image_token_id,
    numeric_reward,
    reconstruct,
)
from orchard_rec.reconstruct.merge import template_turn_end
from orchard_rec.records import Outcome
from orchard_rec.selection import BarSpec, FilterChain, Selection, bar_select
from orchard_rec.selection.staleness import StalenessStats, apply_staleness
from orchard_rec.storage.store import SessionSummary, Store

__all__ = [
    "Attempt",
    "Reconstruction",
    "SampleFilter",
    "Selection",
    "SelectionStats",
    "iter_samples",
    "pick_reward",
    "select_batches",
    "select_group",
]


def pick_reward(outcome: Outcome | None, key: str) -> float | None:
    """The reward named ``key`` of an outcome: ``process`` = the stored process reward's total,
    else a named reward, else a number in the outcome metadata; None when absent."""
    if outcome is None:
        return None
    if key == "process":
        pr = outcome.metadata.get("process_reward")
        return numeric_reward(pr.get("total")) if isinstance(pr, dict) else None
    if isinstance(outcome.reward, dict) and key in outcome.reward:
        return numeric_reward(outcome.reward[key])
    return numeric_reward(outcome.metadata.get(key))


class Attempt:
    """One session of a group, as selection sees it: its samples' reward and status."""

    __slots__ = ("metadata", "reward", "samples", "status", "summary")

    def __init__(self, summary: SessionSummary, samples: list[Sample]) -> None:
        self.summary = summary
        self.samples = samples
        first = samples[0] if samples else None
        self.reward = first.reward if first is not None else None
        status = samples[-1].status if samples else (summary.outcome.status if summary.outcome else None)
        self.status = str(getattr(status, "value", status) or "aborted")
        self.metadata: dict[str, Any] = dict(summary.outcome.metadata) if summary.outcome else {}


class SelectionStats:
    """What recipe selection did: groups seen/kept, per filter the groups dropped, BAR modes."""

    def __init__(self) -> None:
        self.groups = 0
        self.kept = 0
        self.dropped: dict[str, int] = {}
        self.bar: dict[str, int] = {}
        self.removed_samples = 0

    def summary(self) -> str:
        parts = [f"{self.kept} of {self.groups} groups kept"]
        parts += [f"{name} dropped {n}" for name, n in self.dropped.items()]
        if self.bar:
            parts.append("BAR " + ", ".join(f"{k} {v}" for k, v in sorted(self.bar.items())))
        if self.removed_samples:
            parts.append(f"{self.removed_samples} samples marked remove_sample")
        return "; ".join(parts)


def _reward_value(summary: SessionSummary) -> float | None:
    if summary.outcome is None:
        return None
    r = summary.outcome.reward
    if isinstance(r, dict):
        r = r.get("reward", r.get("pass", r.get("score", next(iter(r.values()), None))))
    return numeric_reward(r)


def _group_key(summary: SessionSummary, key: str) -> str:
    if key == "session":
        return summary.id
    meta = summary.outcome.metadata if summary.outcome is not None else {}
    v = meta.get(key)
    return "" if v is None else str(v)


def select_group(
    attempts: list[Attempt],
    select: BarSpec | None,
    chain: FilterChain | None,
    seed: int | None,
    stats: SelectionStats,
) -> list[Attempt] | None:
    """Recipe selection over one group's attempts: BAR's N of them (``select``), then the
    filters on those; None when a filter drops the group. Counts into ``stats``."""
    stats.groups += 1
    chosen = attempts
    if select is not None:
        stride = select[3] if len(select) > 3 else None
        chosen, how = bar_select(attempts, select[0], select[1], select[2], seed=seed, stride=stride)
        stats.bar[how] = stats.bar.get(how, 0) + 1
    if chain is not None and not chain.keep(chosen):
        for name, n in chain.dropped.items():
            stats.dropped[name] = n
        return None
    return chosen


Batch = tuple[int | None, Iterator[tuple[SessionSummary, Any]]]
"""A group's index (None without grouping) and its sessions with their calls, streamed."""


def iter_samples(
    store: Store,
    selection: Selection | None = None,
    *,
    tokenizer: Any = None,
    teacher: Callable[[Sample], TeacherData | None] | None = None,
    with_messages: Callable[[Store, Sample], None] | None = None,
    on_session: Callable[[Any], None] | None = None,
    selection_stats: SelectionStats | None = None,
    staleness_stats: StalenessStats | None = None,
    **options: Any,
) -> Iterator[Sample]:
    """The samples ``selection`` names, in four stages: select the sessions and their calls and
    group them (``select_batches``), reconstruct each session (``Reconstruction``), keep and
    annotate samples (``SampleFilter``), then number them (``index``, ``group_index``).

    ``options``: ``Selection`` fields, on top of ``selection`` (``iter_samples(store,
    sessions=[...], group_by="task")`` as well as ``iter_samples(store, Selection(...))``).
    ``tokenizer`` gives ids to calls recorded without them and the image token; ``teacher``
    looks up a sample's stored teacher log-probs; ``with_messages(store, sample)`` attaches
    the conversation; ``on_session(summary)`` is called once per session read or dropped;
    ``selection_stats`` and ``staleness_stats`` count what recipe selection and the staleness
    floor dropped."""
    sel = Selection.of(selection, **options)
    rebuild = Reconstruction(sel, tokenizer)
    keep = SampleFilter(sel, teacher, staleness_stats)
    stats = selection_stats if selection_stats is not None else SelectionStats()
    chain = FilterChain(list(sel.filters or ()), seed=sel.seed or 0) if sel.filters else None
    index = out_group = 0
    for group_index, rows in select_batches(store, sel, on_session):
        kept = stats.kept
        if group_index is not None and sel.chooses:
            chosen = _chosen_group(rows, sel, chain, out_group, rebuild, keep, stats, on_session)
        else:
            chosen = _plain_batch(rows, group_index, rebuild, keep, on_session)
        for s in chosen:
            s.index = index
            index += 1
            if with_messages is not None:
                with_messages(store, s)
            yield s
        if stats.kept > kept:
            out_group += 1


def select_batches(
    store: Store, sel: Selection, on_session: Callable[[Any], None] | None = None
) -> Iterator[Batch]:
    """Stages 1 and 2: the selected sessions with their calls (one streaming query), or with
    ``group_by`` their groups in key order, one query per group, groups outside ``pass_rate``
    left out (``on_session`` told of their sessions)."""
    if sel.group_by is None:
        yield None, store.iter_sessions_calls(sel.sessions, since=sel.since, harness=sel.harness, lazy=True)
        return
    groups: dict[str, list[SessionSummary]] = defaultdict(list)
    for summary in store.sessions(sel.sessions, since=sel.since, harness=sel.harness):
        groups[_group_key(summary, sel.group_by)].append(summary)
    kept = []
    for key in sorted(groups):
        members = groups[key]
        if sel.pass_rate is not None and not _passes(members, sel.pass_rate, sel.pass_threshold):
            for m in members:
                if on_session is not None:
                    on_session(m)
            continue
        kept.append(members)
    for gi, members in enumerate(kept):
        yield gi, store.iter_sessions_calls([m.id for m in members], lazy=True)


def _passes(members: list[SessionSummary], window: tuple[float, float], threshold: float) -> bool:
    rewards = [_reward_value(m) for m in members]
    rate = sum(1 for r in rewards if r is not None and r > threshold) / len(members)
    return window[0] <= rate <= window[1]


class Reconstruction:
    """Stage 3: one session's calls → its samples. The calls stream in causal order, decoded one
    at a time from the storage deltas, and become generations as reconstruction takes them:
    memory O(one final sample)."""

    def __init__(self, sel: Selection, tokenizer: Any = None) -> None:
        self.sel = sel
        self.tokenizer = tokenizer
        self.policy = credit_policy(sel.credit) if isinstance(sel.credit, str) else sel.credit
        self.image_token = sel.image_token if sel.image_token is not None else image_token_id(tokenizer)
        self._turn_end: list[int | None] = []

    @property
    def turn_end(self) -> int | None:
        if self.tokenizer is None:
            return None
        if not self._turn_end:  # asked of the template once, when the first session needs it
            self._turn_end.append(template_turn_end(self.tokenizer))
        return self._turn_end[0]

    def __call__(self, summary: SessionSummary, calls: Iterable[Any]) -> list[Sample]:
        skipped: list[str] = []
        aborted, tokenizer = self.sel.aborted, self.tokenizer

        def generations() -> Iterator[Generation]:
            for c in calls:
                if not c.dialect.is_generation:
                    continue
                g = generation_of(c, tokenizer, aborted=aborted)
                if g is None:
                    skipped.append(c.call_id)
                else:
                    yield g

        out = reconstruct(
            generations(),
            on_mismatch=self.sel.on_mismatch,
            credit=self.policy,
            outcome=summary.outcome,
            session_id=summary.id,
            skipped=skipped,
            turn_end=self.turn_end,
            image_token=self.image_token,
        )
        if self.sel.reward_key is not None:
            for s in out:
                s.reward = pick_reward(summary.outcome, self.sel.reward_key)
        return out


class SampleFilter:
    """Stage 4: whether a sample is kept (side conversations, status, staleness, teacher data,
    reward); attaches the teacher's log-probs and masks stale tokens on the way."""

    def __init__(
        self,
        sel: Selection,
        teacher: Callable[[Sample], TeacherData | None] | None = None,
        staleness_stats: StalenessStats | None = None,
    ) -> None:
        self.sel = sel
        self.teacher = teacher
        self.stale_stats = staleness_stats if staleness_stats is not None else StalenessStats()

    def __call__(self, s: Sample, summary: SessionSummary) -> bool:
        sel = self.sel
        if sel.auxiliary is not None and not sel.auxiliary and s.metadata.get("auxiliary"):
            return False
        if sel.statuses and s.status not in sel.statuses:
            return False
        if sel.staleness is not None and not apply_staleness(s, sel.staleness, sel.stale, self.stale_stats):
            return False
        if self.teacher is not None:
            s.teacher = self.teacher(s)
        if sel.require_teacher and s.teacher is None:
            return False
        if sel.min_reward is not None:
            r = numeric_reward(s.reward) if not isinstance(s.reward, dict) else _reward_value(summary)
            if r is None or r < sel.min_reward:
                return False
        return True


def _plain_batch(
    rows: Iterable[tuple[SessionSummary, Any]],
    group_index: int | None,
    rebuild: Reconstruction,
    keep: SampleFilter,
    on_session: Callable[[Any], None] | None,
) -> Iterator[Sample]:
    """A batch's kept samples, session by session (``group_index`` set on each)."""
    for summary, calls in rows:
        for s in rebuild(summary, calls):
            if keep(s, summary):
                s.group_index = group_index
                yield s
        if on_session is not None:
            on_session(summary)


def _chosen_group(
    rows: Iterable[tuple[SessionSummary, Any]],
    sel: Selection,
    chain: FilterChain | None,
    out_group: int,
    rebuild: Reconstruction,
    keep: SampleFilter,
    stats: SelectionStats,
    on_session: Callable[[Any], None] | None,
) -> Iterator[Sample]:
    """One group reconstructed whole, recipe selection over its attempts (``select_group``), the
    kept samples of the chosen ones; a chosen attempt whose outcome says ``remove_sample`` keeps
    its samples with the loss mask zeroed, as group ``out_group`` (kept groups are numbered
    consecutively). ``chain``: the run's filters (their draws and counts go on across groups)."""
    attempts = [Attempt(summary, rebuild(summary, calls)) for summary, calls in rows]
    chosen = select_group(attempts, sel.select, chain, sel.seed, stats)
    if chosen is None:
        for a in attempts:
            if on_session is not None:
                on_session(a.summary)
        return
    stats.kept += 1
    chosen_ids = {id(a) for a in chosen}
    for a in attempts:
        if id(a) in chosen_ids:
            removed = bool(a.metadata.get("remove_sample"))
            for s in a.samples:
                if not keep(s, a.summary):
                    continue
                if removed:
                    s.metadata["remove_sample"] = True
                    s.loss_mask = [0] * len(s.loss_mask)
                    stats.removed_samples += 1
                s.group_index = out_group
                yield s
        if on_session is not None:
            on_session(a.summary)
