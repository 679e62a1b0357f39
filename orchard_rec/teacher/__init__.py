"""Teacher log-probs over recorded samples, for on-policy distillation.

For each reconstructed sample, one request to a teacher server (vLLM ``prompt_logprobs``
or SGLang ``/generate`` input log-probs) with the sample's exact token ids; the teacher's
log-prob of every response token (``teacher_log_probs``, ``teacher_valid_mask``, optional
top-k) is stored per sample identity and carried by every export format.

Owns: the teacher wire contracts (``wire.py``), the resumable sharded runner (``run.py``)
and the results table access (``store.py``). May import: the standard library, aiohttp,
sqlalchemy, ``orchard_rec.storage``; never proxy or exporters.
"""

from orchard_rec.teacher.run import (
    MemorySink,
    SampleRef,
    TeacherConfig,
    TeacherSummary,
    content_hash,
    in_shard,
    score_all,
    score_live,
)
from orchard_rec.teacher.wire import TeacherResult, Window, parse, request_for, window

__all__ = [
    "MemorySink",
    "SampleRef",
    "TeacherConfig",
    "TeacherResult",
    "TeacherSummary",
    "Window",
    "content_hash",
    "in_shard",
    "parse",
    "request_for",
    "score_all",
    "score_live",
    "window",
]
