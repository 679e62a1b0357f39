"""verl agent-loop adapter, importable without verl.

``agent_loop_output(sample)`` gives the fields of verl's ``AgentLoopOutput``
(verl/experimental/agent_loop/agent_loop.py): ``prompt_ids``, ``response_ids``,
``response_mask``, ``response_logprobs``, ``reward_score``, ``num_turns``, ``metrics``,
``extra_fields``; as verl's own class when verl is importable, else as a dict.
``RecordedAgentLoop`` serves recorded sessions where verl expects an agent loop: its
``async run(sampling_params, **kwargs)`` returns the output for ``kwargs["session_id"]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from orchard_rec.pipeline import iter_samples
from orchard_rec.reconstruct.sample import Sample, numeric_reward
from orchard_rec.storage.store import Store

__all__ = ["RecordedAgentLoop", "agent_loop_output", "agent_loop_outputs"]


def agent_loop_output(s: Sample) -> Any:
    fields = {
        "prompt_ids": s.prompt_ids,
        "response_ids": s.response_ids,
        "response_mask": list(s.loss_mask),
        "response_logprobs": list(s.rollout_log_probs),
        "reward_score": numeric_reward(s.reward),
        "num_turns": 2 * len(s.turns),
        "metrics": {"generate_sequences": 0.0, "tool_calls": 0.0},
        "extra_fields": {
            "session_id": s.session_id,
            "index": s.index,
            "group_index": s.group_index,
            "status": str(s.status),
            "call_ids": list(s.metadata.get("call_ids", [])),
        },
    }
    try:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    except ImportError:
        return fields
    return AgentLoopOutput(**fields)


def agent_loop_outputs(store: Store, **selection: Any) -> Iterator[Any]:
    for s in iter_samples(store, **selection):
        yield agent_loop_output(s)


class RecordedAgentLoop:
    """Stands where verl runs an agent loop, answering from the recorded sessions."""

    def __init__(self, db: str, *, on_mismatch: str = "split", **_: Any) -> None:
        self.store = Store(db)
        self.on_mismatch = on_mismatch

    async def run(self, sampling_params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        sid = kwargs["session_id"]
        samples = list(iter_samples(self.store, sessions=[sid], on_mismatch=self.on_mismatch))
        if not samples:
            raise KeyError(f"no recorded samples for session {sid!r}")
        return agent_loop_output(max(samples, key=lambda s: len(s.turns)))
