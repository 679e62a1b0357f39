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

Memory: without grouping, one streaming query and one session at a time; with grouping,
one group's calls at a time (one query per group).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from orchard_rec.reconstruct import (
    CreditPolicy,
    MismatchPolicy,
    Sample,
    credit_policy,
    numeric_reward,
    reconstruct_session,
)
from orchard_rec.storage.store import SessionSummary, Store

__all__ = ["iter_samples"]


def _reward_value(summary: SessionSummary) -> float | None:
    if summary.outcome is None:
        return None
    r = summary.outcome.reward
    if isinstance(r, dict):
        r = r.get("pass", r.get("score", next(iter(r.values()), None)))
    return numeric_reward(r)


def _group_key(summary: SessionSummary, key: str) -> str:
    if key == "session":
        return summary.id
    meta = summary.outcome.metadata if summary.outcome is not None else {}
    v = meta.get(key)
    return "" if v is None else str(v)


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
) -> Iterator[Sample]:
    policy = credit_policy(credit) if isinstance(credit, str) else credit
    if pass_rate is not None and group_by is None:
        raise ValueError("--pass-rate needs --group-by (a pass rate is a property of a group)")
    if group_by is None:
        batches: Iterator[tuple[int | None, Iterator[tuple[SessionSummary, list[Any]]]]] = iter(
            [(None, store.iter_sessions_calls(sessions, since=since, harness=harness))]
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
            (gi, store.iter_sessions_calls([m.id for m in members])) for gi, members in enumerate(kept)
        )
    index = 0
    for group_index, rows in batches:
        for summary, calls in rows:
            for s in reconstruct_session(
                calls,
                on_mismatch=on_mismatch,
                credit=policy,
                outcome=summary.outcome,
                session_id=summary.id,
                tokenizer=tokenizer,
            ):
                if statuses and s.status not in statuses:
                    continue
                if min_reward is not None:
                    r = numeric_reward(s.reward) if not isinstance(s.reward, dict) else _reward_value(summary)
                    if r is None or r < min_reward:
                        continue
                s.group_index = group_index
                s.index = index
                index += 1
                if with_messages is not None:
                    with_messages(store, s)
                yield s
            if on_session is not None:
                on_session(summary)
