"""Builders of call records for tests (like mitmproxy's tflow)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from orchard_rec.records import CallOutcome, CallRecord, Dialect


def call(
    session_id: str | None = "s1",
    *,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    logprobs: list[float] | None = None,
    dialect: Dialect = Dialect.CHAT,
    received_at: float | None = None,
    **kw: Any,
) -> CallRecord:
    t = received_at if received_at is not None else time.time()
    return CallRecord(
        call_id=kw.pop("call_id", uuid.uuid4().hex),
        session_id=session_id,
        dialect=dialect,
        method="POST",
        path="/v1/chat/completions",
        stream=kw.pop("stream", False),
        status_code=kw.pop("status_code", 200),
        outcome=kw.pop("outcome", CallOutcome.OK),
        received_at=t,
        first_byte_at=t + 0.001,
        done_at=t + 0.002,
        prompt_ids=None if prompt_ids is None else tuple(prompt_ids),
        completion_ids=None if completion_ids is None else tuple(completion_ids),
        completion_logprobs=None if logprobs is None else tuple(logprobs),
        **kw,
    )
