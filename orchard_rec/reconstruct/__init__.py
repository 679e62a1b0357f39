"""Rebuilds a session's calls into token-level training samples: the pure core.

Owns: the input record (``Generation``, and ``generations_of`` from ``CallRecord``), the
merge (``reconstruct``, ``reconstruct_session``), the sample and its one builder, credit
policies, retokenization of calls recorded without ids, and the status / split-reason /
token-source enums. Records in, samples out: no sessions, sockets or files.

May import: the standard library, ``orchard_rec.records``, ``orchard_rec.errors`` and
``orchard_rec.dialects`` (dialect knowledge, for retokenization). Never ``proxy``,
``storage``, ``intercept``, ``exporters``, ``trainers``, aiohttp, SQLAlchemy or rich
(``tests/test_layering.py``). Reading from a database is ``orchard_rec.pipeline``;
terminal rendering is ``orchard_rec.render``.
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
from orchard_rec.reconstruct.generation import Generation, generation_of, generations_of
from orchard_rec.reconstruct.merge import MismatchPolicy, reconstruct, reconstruct_session
from orchard_rec.reconstruct.retokenize import retokenize
from orchard_rec.reconstruct.sample import (
    ImageRef,
    Sample,
    SampleBuilder,
    SampleStatus,
    SplitReason,
    TeacherData,
    TokenSource,
    Turn,
    numeric_reward,
)
from orchard_rec.reconstruct.vision import image_runs, image_token_id

__all__ = [
    "CREDIT_POLICIES",
    "AssistantCredit",
    "CreditPolicy",
    "Generation",
    "ImageRef",
    "LastTurnCredit",
    "MismatchPolicy",
    "Sample",
    "SampleBuilder",
    "SampleStatus",
    "SplitReason",
    "TeacherData",
    "TokenSource",
    "Turn",
    "TurnWeightsCredit",
    "ValueCredit",
    "credit_policy",
    "generation_of",
    "generations_of",
    "image_runs",
    "image_token_id",
    "numeric_reward",
    "reconstruct",
    "reconstruct_session",
    "retokenize",
]
