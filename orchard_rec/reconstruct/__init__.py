"""Rebuilds a session's calls into token-level training samples.

The core (``merge``, ``credit``, ``sample``) is pure: call records in, samples out, no
sessions, sockets or files. ``stream.iter_samples`` feeds it from a ``Store``.
"""

from orchard_rec.reconstruct.credit import (
    CREDIT_POLICIES,
    AssistantCredit,
    CreditPolicy,
    LastTurnCredit,
    TurnWeightsCredit,
    ValueCredit,
    credit_policy,
)
from orchard_rec.reconstruct.merge import MismatchPolicy, reconstruct_session
from orchard_rec.reconstruct.sample import Sample, SampleBuilder, Turn
from orchard_rec.reconstruct.stream import iter_samples

__all__ = [
    "CREDIT_POLICIES",
    "AssistantCredit",
    "CreditPolicy",
    "LastTurnCredit",
    "MismatchPolicy",
    "Sample",
    "SampleBuilder",
    "Turn",
    "TurnWeightsCredit",
    "ValueCredit",
    "credit_policy",
    "iter_samples",
    "reconstruct_session",
]
