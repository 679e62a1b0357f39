"""Call against call: what a prompt kept, changed, dropped and added relative to the call before
(``/s/ID/compare/SEQ``), and a message as one comparable line (also for task groups' side by side)."""

from __future__ import annotations

import difflib
from typing import Any

from orchard_rec.storage.store import Store
from orchard_rec.ui.chat import conversation, response_turn
from orchard_rec.ui.data import UIError, _first_mismatch

__all__ = ["compare_calls", "msg_key"]


# -- compare two consecutive calls ---------------------------------------------------------------


def compare_calls(store: Store, session_id: str, seq: int) -> dict[str, Any]:
    """Call ``seq`` against the call before it: what its prompt kept, changed, dropped and added."""
    calls = {c.seq: c for c in store.calls(session_id)}
    if seq not in calls:
        raise UIError(f"session {session_id!r} has no call {seq}", 404)
    b = calls[seq]
    prev_seqs = [s for s in calls if s is not None and s < seq]
    a = calls[max(prev_seqs)] if prev_seqs else None
    out: dict[str, Any] = {
        "session_id": session_id,
        "a": None if a is None else a.seq,
        "b": seq,
        "last": max(s for s in calls if s is not None),
    }
    msgs_b = [msg_key(m) for m in conversation(b.request, b.dialect.value)]
    if a is not None:
        msgs_a = [msg_key(m) for m in conversation(a.request, a.dialect.value)]
        ans = response_turn(a.response, a.dialect.value)
        if ans is not None:
            msgs_a.append(msg_key(ans))
    else:
        msgs_a = []
    ops = []
    sm = difflib.SequenceMatcher(a=msgs_a, b=msgs_b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        ops.append({"op": tag, "a": msgs_a[i1:i2], "b": msgs_b[j1:j2]})
    out["messages"] = ops
    replaced = _replaces_history(msgs_a, ops)
    out["history"] = "replaced" if replaced else ("none" if a is None else "kept")
    held = None if a is None or a.prompt_ids is None else list(a.prompt_ids) + list(a.completion_ids or ())
    sent = None if b.prompt_ids is None else list(b.prompt_ids)
    if held is not None and sent is not None:
        pos = _first_mismatch(held, sent)
        if pos == len(held):
            verdict = "extends"
        elif len(sent) < len(held) and pos == len(sent):
            verdict = "prefix (fork or retry)"
        elif replaced:
            verdict = "replaces history (compaction or a new conversation)"
        elif len(sent) < len(held) * 0.8:
            verdict = "shrinks (compaction?)"
        else:
            verdict = "diverges (drift or edit)"
        lo = max(0, pos - 12)
        out["tokens"] = {
            "held_len": len(held),
            "sent_len": len(sent),
            "position": pos,
            "verdict": verdict,
            "start": lo,
            "held": held[lo : pos + 24],
            "sent": sent[lo : pos + 24],
        }
    else:
        out["tokens"] = None
    return out


def _replaces_history(msgs_a: list[str], ops: list[dict[str, Any]]) -> bool:
    """Whether the later prompt keeps none of the conversation before it (system messages
    aside): a compaction's summary, or another conversation on the same opening."""
    if not any(not m.startswith("system:") for m in msgs_a):
        return False
    kept = [m for op in ops if op["op"] == "equal" for m in op["a"] if not m.startswith("system:")]
    return not kept


def msg_key(m: dict[str, Any]) -> str:
    """A message as one comparable line: role and its blocks' text."""
    parts = []
    for b in m.get("blocks", ()):
        kind = b.get("kind")
        if kind == "tool_call":
            parts.append(f"[tool call {b.get('name')}] {b.get('text', '')}")
        elif kind == "image":
            parts.append("[image]")
        else:
            parts.append(("[" + kind + "] " if kind != "text" else "") + str(b.get("text", "")))
    return f"{m.get('role')}: " + "\n".join(parts)
