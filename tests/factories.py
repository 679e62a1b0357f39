"""Builders for tests: call records (like mitmproxy's tflow), image data URLs, free loopback ports."""

from __future__ import annotations

import base64
import socket
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


def check_invariants(calls, samples) -> None:  # type: ignore[no-untyped-def]
    """Invariants 1, 2 and 4 of reconstruction over recorded calls and their samples."""
    for (
        c
    ) in calls:  # (1) each generation verbatim, contiguous, in exactly one sample, mask 1, logprobs aligned
        [(s, t)] = [(s, t) for s in samples for t in s.turns if t.call_id == c.call_id]
        assert s.response_ids[t.start : t.end] == list(c.completion_ids)
        assert s.loss_mask[t.start : t.end] == [1] * len(c.completion_ids)
        assert s.rollout_log_probs[t.start : t.end] == list(c.completion_logprobs)
    for s in samples:  # (2) no mask-1 position the model did not generate
        gen = {i for t in s.turns for i in range(t.start, t.end)}
        assert {i for i, m in enumerate(s.loss_mask) if m} <= gen
    assert samples[0].prompt_ids == list(calls[0].prompt_ids)  # (4)


def free_port() -> int:
    """A TCP port free on loopback now (for a server started in a subprocess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def data_url(png: bytes) -> str:
    """``png`` as the ``data:image/png;base64,...`` URL clients send images inline as."""
    return "data:image/png;base64," + base64.b64encode(png).decode()
