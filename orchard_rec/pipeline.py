"""Samples straight from the database: storage → reconstruct, with selection, grouping and filters.

This is the one place that reads calls from a ``Store`` for reconstruction (``reconstruct/``
itself never touches storage); exporters, trainers and the CLI all take samples from here.

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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from orchard_rec.errors import UsageError
from orchard_rec.policy import Staleness
from orchard_rec.reconstruct import (
    CreditPolicy,
    Generation,
    MismatchPolicy,
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
from orchard_rec.selection import BarSpec, FilterChain, bar_select
from orchard_rec.selection.staleness import StaleMode, StalenessStats, apply_staleness
from orchard_rec.storage.store import SessionSummary, Store

__all__ = ["Attempt", "SelectionStats", "iter_samples", "pick_reward", "select_group"]


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


def iter_samples(
    store: Store,
    *,
    sessions: Sequence[str] | None = None,
    since: float | None = None,
    harness: str | None = None,
    on_mismatch: MismatchPolicy | str = MismatchPolicy.SPLIT,
    credit: CreditPolicy | str | None = None,
    group_by: str | None = None,
    pass_rate: tuple[float, float] | None = None,
    pass_threshold: float = 0.0,
    statuses: Sequence[str] | None = None,
    min_reward: float | None = None,
    with_messages: Callable[[Store, Sample], None] | None = None,
    on_session: Callable[[Any], None] | None = None,
    tokenizer: Any = None,
    reward_key: str | None = None,
    select: BarSpec | None = None,
    seed: int | None = None,
    filters: Sequence[str] | None = None,
    selection_stats: SelectionStats | None = None,
    teacher: Callable[[Sample], TeacherData | None] | None = None,
    require_teacher: bool = False,
    auxiliary: bool = True,
    image_token: int | None = None,
    aborted: str = "drop",
    staleness: Staleness | None = None,
    stale: StaleMode = "drop",
    staleness_stats: StalenessStats | None = None,
) -> Iterator[Sample]:
    """``auxiliary=False`` leaves out the samples of harnesses' side conversations (``metadata.auxiliary``).
    ``image_token``: a VLM's image placeholder id (default: the tokenizer's, ``image_token_id``);
    samples with images then carry ``metadata.image_spans``. ``aborted``: generations the
    server cut for a weight update (finish reason ``abort``) are left out (``drop``) or kept.
    ``staleness``: the policy-version floor (``selection.staleness``); samples with stale tokens
    are dropped or have them masked (``stale``), counted in ``staleness_stats``."""
    if aborted not in ("drop", "keep"):
        raise UsageError(f"--aborted is keep or drop (got {aborted!r})")
    if stale not in ("drop", "mask"):
        raise UsageError(f"--stale is drop or mask (got {stale!r})")
    stale_stats = staleness_stats if staleness_stats is not None else StalenessStats()
    policy = credit_policy(credit) if isinstance(credit, str) else credit
    if image_token is None:
        image_token = image_token_id(tokenizer)
    if pass_rate is not None and group_by is None:
        raise UsageError("--pass-rate needs --group-by (a pass rate is a property of a group)")
    if (select is not None or filters) and group_by is None:
        raise UsageError("--select and --filter need --group-by (they choose within a task's attempts)")
    chain = FilterChain(list(filters or ()), seed=seed or 0) if filters else None
    stats = selection_stats if selection_stats is not None else SelectionStats()
    if group_by is None:
        batches: Iterator[tuple[int | None, Iterator[tuple[SessionSummary, Any]]]] = iter(
            [(None, store.iter_sessions_calls(sessions, since=since, harness=harness, lazy=True))]
        )
    else:
        groups: dict[str, list[SessionSummary]] = defaultdict(list)
        for summary in store.sessions(sessions, since=since, harness=harness):
            groups[_group_key(summary, group_by)].append(summary)
        kept = []
        for key in sorted(groups):
            members = groups[key]
            if pass_rate is not None:
                rewards = [_reward_value(m) for m in members]
                rate = sum(1 for r in rewards if r is not None and r > pass_threshold) / len(members)
                if not (pass_rate[0] <= rate <= pass_rate[1]):
                    for m in members:
                        if on_session is not None:
                            on_session(m)
                    continue
            kept.append(members)
        batches = (
            (gi, store.iter_sessions_calls([m.id for m in members], lazy=True))
            for gi, members in enumerate(kept)
        )

    def samples_of(summary: SessionSummary, calls: Iterable[Any]) -> list[Sample]:
        # the calls stream in causal order, decoded one at a time from the storage deltas, and
        # become generations as reconstruction takes them: memory O(one final sample)
        out = []
        skipped: list[str] = []

        turn_end = template_turn_end(tokenizer) if tokenizer is not None else None

        def generations() -> Iterator[Generation]:
            for c in calls:
                if not c.dialect.is_generation:
                    continue
                g = generation_of(c, tokenizer, aborted=aborted)
                if g is None:
                    skipped.append(c.call_id)
                else:
                    yield g

        for s in reconstruct(
            generations(),
            on_mismatch=on_mismatch,
            credit=policy,
            outcome=summary.outcome,
            session_id=summary.id,
            skipped=skipped,
            turn_end=turn_end,
            image_token=image_token,
        ):
            if reward_key is not None:
                s.reward = pick_reward(summary.outcome, reward_key)
            out.append(s)
        return out

    def keep(s: Sample, summary: SessionSummary) -> bool:
        if not auxiliary and s.metadata.get("auxiliary"):
            return False
        if statuses and s.status not in statuses:
            return False
        if staleness is not None and not apply_staleness(s, staleness, stale, stale_stats):
            return False
        if teacher is not None:
            s.teacher = teacher(s)
        if require_teacher and s.teacher is None:
            return False
        if min_reward is not None:
            r = numeric_reward(s.reward) if not isinstance(s.reward, dict) else _reward_value(summary)
            if r is None or r < min_reward:
                return False
        return True

    index = 0
    out_group = 0
    for group_index, rows in batches:
        if group_index is not None and (select is not None or chain is not None):
            attempts = [Attempt(summary, samples_of(summary, calls)) for summary, calls in rows]
            chosen = select_group(attempts, select, chain, seed, stats)
            if chosen is None:
                for a in attempts:
                    if on_session is not None:
                        on_session(a.summary)
                continue
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
                        s.index = index
                        index += 1
                        if with_messages is not None:
                            with_messages(store, s)
                        yield s
                if on_session is not None:
                    on_session(a.summary)
            out_group += 1
            continue
        for summary, calls in rows:
            for s in samples_of(summary, calls):
                if not keep(s, summary):
                    continue
                s.group_index = group_index
                s.index = index
                index += 1
                if with_messages is not None:
                    with_messages(store, s)
                yield s
            if on_session is not None:
                on_session(summary)
