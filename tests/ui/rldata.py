"""An RL-shaped database for the viewer's debugging views: tasks with several attempts each
(outcome metadata ``task``), multi-turn chat sessions with a tool call and its result, an
upstream 400, a compaction (the history replaced by a summary), a streamed call with its
events, written through ``Store.write_batch`` as the proxy's writer does.

Token ids read like the text: each attempt's prompt opens with the task's ids, its answers
carry ids unique to the attempt, so two attempts of a task share a prefix and diverge at the
first answer."""

from __future__ import annotations

import time
import uuid
from typing import Any

from orchard_rec.records import CallOutcome, CallRecord, Dialect, Outcome
from orchard_rec.storage import Store

# task -> (reward, status) of each attempt
TASKS: dict[str, list[tuple[float, str]]] = {
    "fix-bug": [(1.0, "completed"), (0.0, "completed"), (1.0, "completed"), (0.0, "failed")],
    "add-test": [(0.0, "completed"), (0.0, "completed"), (0.0, "truncated")],
    "refactor": [(1.0, "completed"), (0.5, "completed")],
}
SYSTEM = "You are a careful coding agent."


def _rec(sid: str, t: float, messages: list[dict[str, Any]], answer: dict[str, Any], **kw: Any) -> CallRecord:
    request: dict[str, Any] = {"model": "qwen-tiny", "messages": messages}
    if "extra_body_key" in kw:
        request["api_key"] = kw.pop("extra_body_key")
    return CallRecord(
        call_id=uuid.uuid4().hex,
        session_id=sid,
        dialect=Dialect.CHAT,
        method="POST",
        path="/v1/chat/completions",
        stream=kw.pop("stream", False),
        status_code=kw.pop("status_code", 200),
        outcome=kw.pop("outcome", CallOutcome.OK),
        received_at=t,
        first_byte_at=t + 0.05,
        done_at=t + kw.pop("latency", 0.4),
        harness=kw.pop("harness", "codex"),
        model=kw.pop("model", "qwen-tiny"),
        headers=kw.pop("headers", {"user-agent": "codex/1.0", "content-type": "application/json"}),
        request=request,
        response=kw.pop(
            "response",
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}],
            },
        ),
        finish_reason="stop",
        usage=kw.pop("usage", None)
        or {
            "prompt_tokens": len(kw.get("prompt_ids") or ()),
            "completion_tokens": len(kw.get("completion_ids") or ()),
        },
        **kw,
    )


def attempt_calls(task: str, k: int, t0: float) -> list[CallRecord]:
    """One attempt: read a file (tool call), get its text (tool result), answer."""
    sid = f"{task}-{k}"
    base = [len(task), 11, 12, 13]  # the task's prompt, shared by its attempts
    user = {"role": "user", "content": f"Task {task}: make the tests pass."}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, user]
    call_msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"path": "src/{task}-{k % 2}.py"}}'},
            }
        ],
    }
    a1 = [100 + k, 101, 102]
    c1 = _rec(
        sid,
        t0,
        msgs,
        call_msg,
        prompt_ids=tuple(base),
        completion_ids=tuple(a1),
        completion_logprobs=(-0.1, -0.2, -0.3),
    )
    result = {"role": "tool", "tool_call_id": f"c{k}", "content": f"def f(): return {k}  # zanzibar{k}"}
    answer = {"role": "assistant", "content": f"Attempt {k} done: the answer is {k}."}
    p2 = (*base, *a1, 21, 22)
    c2 = _rec(
        sid,
        t0 + 1,
        [*msgs, call_msg, result],
        answer,
        prompt_ids=p2,
        completion_ids=(200 + k, 201),
        completion_logprobs=(-0.05, -0.5),
    )
    return [c1, c2]


def build(db: str, now: float | None = None, *, upgrade: bool = True) -> dict[str, Any]:
    """Write the database (``upgrade=False``: at the schema it has); returns what the tests check against."""
    store = Store(db)
    if upgrade:
        store.upgrade()
    t0 = (now or time.time()) - 600
    recs: list[CallRecord] = []
    outcomes: list[tuple[str, Outcome]] = []
    i = 0
    for task, attempts in TASKS.items():
        for k, (reward, status) in enumerate(attempts):
            recs += attempt_calls(task, k, t0 + i * 5)
            meta: dict[str, Any] = {"task": task, "split": "train", "tries": k}
            if k == 1:
                meta["tags"] = ["hard", "python"]
            outcomes.append((f"{task}-{k}", Outcome(reward=reward, status=status, metadata=meta)))
            i += 1
    # an upstream 400 (relayed as is: error is None, the body says why)
    bad = {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}
    recs.append(
        _rec(
            "bad-request",
            t0 + 100,
            [{"role": "user", "content": "hi"}],
            {},
            status_code=400,
            outcome=CallOutcome.UPSTREAM_ERROR,
            response=bad,
            model="other-model",
            harness="claude-code",
        )
    )
    # a compaction: the second prompt replaces the history with a summary, as long as before
    long_user = {"role": "user", "content": "Explain the code base. " * 4}
    first_answer = {"role": "assistant", "content": "It has three modules: a, b and c."}
    recs.append(
        _rec(
            "compacted",
            t0 + 200,
            [{"role": "system", "content": SYSTEM}, long_user],
            first_answer,
            prompt_ids=tuple(range(1, 41)),
            completion_ids=(500, 501, 502),
        )
    )
    summary = {"role": "user", "content": "Summary of the conversation so far: modules a, b, c. " * 4}
    recs.append(
        _rec(
            "compacted",
            t0 + 201,
            [{"role": "system", "content": SYSTEM}, summary],
            {"role": "assistant", "content": "Continuing."},
            prompt_ids=(*range(1, 6), *range(900, 940)),
            completion_ids=(503,),
        )
    )
    # a streamed call with its events
    recs.append(
        _rec(
            "streamed",
            t0 + 300,
            [{"role": "user", "content": "stream please"}],
            {"role": "assistant", "content": "Hello there"},
            extra_body_key="sk-SECRET-2",
            stream=True,
            # a gateway's own credential in a custom header, and one in the body: curl masks both
            headers={"user-agent": "codex/1.0", "x-portkey-api-key": "pk-SECRET-1"},
            events=[
                [None, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}}]}],
                [None, {"choices": [{"index": 0, "delta": {"content": " there"}}]}],
                [None, "[DONE]"],
            ],
            prompt_ids=(1, 2),
            completion_ids=(3, 4),
        )
    )
    store.write_batch(recs)
    for sid, o in outcomes:
        store.set_outcome(sid, o)
    store.close()
    return {"tasks": TASKS}
