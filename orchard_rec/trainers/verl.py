"""verl agent-loop adapter, importable without verl.

``agent_loop_output(sample)`` gives verl's ``AgentLoopOutput`` (the row of
``exporters.contracts.agent_loop_fields``, the same the ``verl`` export writes): verl's own
class when verl is importable, else the fields as a dict.
``RecordedAgentLoop`` serves recorded sessions where verl expects an agent loop: its
``async run(sampling_params, **kwargs)`` returns the output for ``kwargs["session_id"]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from orchard_rec.errors import SessionNotFound
from orchard_rec.exporters.contracts import agent_loop_fields
from orchard_rec.pipeline import Selection, iter_samples
from orchard_rec.reconstruct import Sample
from orchard_rec.storage.store import Store

__all__ = ["RecordedAgentLoop", "agent_loop_output", "agent_loop_outputs"]


def agent_loop_output(s: Sample) -> Any:
    """verl's ``AgentLoopOutput`` for a sample when verl is importable, else its fields as a dict."""
    fields = agent_loop_fields(s)
    try:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    except ImportError:
        return fields
    return AgentLoopOutput(**fields)


def agent_loop_outputs(store: Store, selection: Selection | None = None, **options: Any) -> Iterator[Any]:
    """verl's ``AgentLoopOutput`` of every sample ``selection`` (and ``options``: its fields, or
    ``iter_samples``' other keywords) names."""
    for s in iter_samples(store, selection, **options):
        yield agent_loop_output(s)


class RecordedAgentLoop:
    """Stands where verl runs an agent loop, answering from the recorded sessions."""

    def __init__(self, db: str, *, on_mismatch: str = "split", **_: Any) -> None:
        self.store = Store(db)
        self.on_mismatch = on_mismatch

    async def run(self, sampling_params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        sid = kwargs["session_id"]
        selection = Selection(sessions=[sid], on_mismatch=self.on_mismatch)
        samples = list(iter_samples(self.store, selection))
        if not samples:
            raise SessionNotFound(f"no recorded samples for session {sid!r}")
        return agent_loop_output(max(samples, key=lambda s: len(s.turns)))
