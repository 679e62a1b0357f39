"""tito sessions read back from the database, so a restart or another replica continues them.

A recorded tito call holds everything its branch needs: the exact prompt and generated ids,
the client's request (its conversation and tools) and ``metadata.tito.branch``. The answer
is parsed from the generated ids as the live path parses it, with the tool-call ids the
client received (from the recorded response), so its rendering equals what the live
process kept. Read through ``Store``'s public reads only; runs on a worker thread (``plan``
is called through ``asyncio.to_thread``).
"""

from __future__ import annotations

from typing import Any

from orchard_rec.errors import OrchardError
from orchard_rec.proxy.tito import Recorded, chat_of, parse_generation
from orchard_rec.records import CallOutcome, CallRecord, Dialect
from orchard_rec.storage.seam import RecordSource

__all__ = ["StoreHistory"]


class StoreHistory:
    """``HistorySource`` over a ``RecordSource`` (a ``Store``)."""

    def __init__(self, store: RecordSource, tokenizer: Any) -> None:
        self.store = store
        self.tok = tokenizer

    def count(self, key: str) -> int:
        s = self.store.session(key)
        return s.call_count if s is not None else 0

    def load(self, key: str) -> tuple[int, list[Recorded]]:
        n = 0
        last: dict[int, CallRecord] = {}
        for c in self.store.iter_calls(key):
            n += 1
            t = c.metadata.get("tito") if isinstance(c.metadata, dict) else None
            if (
                isinstance(t, dict)
                and isinstance(t.get("branch"), int)
                and c.outcome is CallOutcome.OK
                and c.prompt_ids
                and c.completion_ids is not None
            ):
                last[t["branch"]] = c
        out = []
        for branch, c in last.items():
            r = self._recorded(branch, c)
            if r is not None:
                out.append(r)
        return n, out

    def _recorded(self, branch: int, c: CallRecord) -> Recorded | None:
        try:
            chat = chat_of(c.dialect, c.request)
        except (OrchardError, KeyError, TypeError, ValueError):
            return None
        completion = list(c.completion_ids or ())
        answer = parse_generation(
            self.tok.decode(completion, skip_special_tokens=False), getattr(self.tok, "eos_token", None)
        )
        ids = _tool_call_ids(c.dialect, c.response)
        calls = answer.get("tool_calls") or []
        if len(ids) == len(calls):
            for tc, i in zip(calls, ids):
                tc["id"] = i
        return Recorded(
            branch, list(c.prompt_ids or ()), completion, chat["messages"], answer, chat.get("tools")
        )


def _tool_call_ids(dialect: Dialect, response: Any) -> list[str]:
    """The tool-call ids the client received, in order."""
    if not isinstance(response, dict):
        return []
    if dialect is Dialect.CHAT:
        try:
            calls = response["choices"][0]["message"].get("tool_calls") or []
            return [str(tc["id"]) for tc in calls]
        except (KeyError, IndexError, TypeError, AttributeError):
            return []
    if dialect is Dialect.RESPONSES:
        items = response.get("output") or []
        return [str(i["call_id"]) for i in items if isinstance(i, dict) and i.get("type") == "function_call"]
    if dialect is Dialect.MESSAGES:
        blocks = response.get("content") or []
        return [str(b["id"]) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    return []
