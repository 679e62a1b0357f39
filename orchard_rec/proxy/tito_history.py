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

from orchard_rec import dialects
from orchard_rec.errors import OrchardError
from orchard_rec.proxy.tito import Recorded
from orchard_rec.proxy.tito_wire import parse_generation
from orchard_rec.records import CallOutcome, CallRecord
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
            chat = dialects.to_chat(c.dialect, c.request)
        except (OrchardError, KeyError, TypeError, ValueError):
            return None
        completion = list(c.completion_ids or ())
        answer = parse_generation(
            self.tok.decode(completion, skip_special_tokens=False), getattr(self.tok, "eos_token", None)
        )
        wire = dialects.get(c.dialect)
        ids = wire.tool_call_ids(c.response) if wire is not None else []
        calls = answer.get("tool_calls") or []
        if len(ids) == len(calls):
            for tc, i in zip(calls, ids):
                tc["id"] = i
        return Recorded(
            branch, list(c.prompt_ids or ()), completion, chat["messages"], answer, chat.get("tools")
        )
