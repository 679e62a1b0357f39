"""Recipe signals for whole sessions of a database: their steps, their process reward.

The glue between ``storage`` (a session's recorded calls and outcome), ``steps`` (what
the agent did, parsed from the conversation in its own dialect) and ``rewards`` (rule
sets over the steps). The CLI's ``steps`` and ``reward`` commands are thin wrappers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard_rec import dialects
from orchard_rec.records import CallRecord, Outcome
from orchard_rec.rewards import RewardResult, RuleSet
from orchard_rec.steps import Step, parse_steps
from orchard_rec.storage.seam import RecordSource

__all__ = ["MODEL_DIALECTS", "score_session", "session_steps", "with_process_reward"]

MODEL_DIALECTS = tuple(d.name.value for d in dialects.known() if d.chat_view)
"""The dialects whose calls hold a conversation (a chat view: chat, Responses, Messages ...), from the registry."""


def _dialect(c: CallRecord) -> str:
    return str(getattr(c.dialect, "value", c.dialect))


def _main_calls(calls: list[CallRecord]) -> list[CallRecord]:
    """The session's model calls of its main conversation (auxiliary side conversations left out)."""
    return [
        c
        for c in calls
        if _dialect(c) in MODEL_DIALECTS
        and isinstance(c.request, dict)
        and not (c.metadata or {}).get("auxiliary")
    ]


def session_steps(store: RecordSource, session_id: str) -> tuple[list[Step], int]:
    """``(steps, number of model turns)``: steps from the session's last model call (its
    request holds the history, its response the final answer)."""
    calls = _main_calls(store.calls(session_id))
    if not calls:
        return [], 0
    last = max(calls, key=lambda c: (c.seq or 0, c.received_at))
    return parse_steps(_dialect(last), last.request, last.response), len(calls)


def score_session(store: RecordSource, session_id: str, rules: RuleSet) -> RewardResult | None:
    """The rule set's reward for one session (gold fields from its outcome metadata);
    None when the session does not exist."""
    summary = store.session(session_id)
    if summary is None:
        return None
    gold: Mapping[str, Any] = summary.outcome.metadata if summary.outcome is not None else {}
    steps, n_turns = session_steps(store, session_id)
    return rules.score(steps, gold, n_turns)


def with_process_reward(old: Outcome | None, rules: str, result: RewardResult) -> Outcome:
    """The session's outcome plus the process reward: components under
    ``metadata["process_reward"]`` (``export --reward-key process`` trains on the total),
    the running value per turn as ``step_values``; the reward and status stay as they were."""
    meta = dict(old.metadata) if old is not None else {}
    meta["process_reward"] = {
        "rules": rules,
        "total": result.total,
        "components": dict(result.components),
        "step_values": list(result.step_values),
        "notes": list(result.notes),
    }
    return Outcome(
        reward=old.reward if old is not None else None,
        status=old.status if old is not None else None,
        step_values=tuple(result.turn_values),
        metadata=meta,
    )
