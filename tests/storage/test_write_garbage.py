"""The writer leaves (almost) nothing for the garbage collector: every object a write makes is
freed by reference counting. A collection pauses the whole proxy, event loop included, for as long
as it takes to scan what it holds; a statement rebuilt per batch (an upsert's ``excluded`` alias)
once left ~100 objects in reference cycles per batch, and that garbage was most of what young
collections scanned under long calls (bench/PROFILE.md, issue 16)."""

from __future__ import annotations

import gc

from factories import call

from orchard_rec.storage import Store


def test_batches_leave_no_reference_cycles(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    store.upgrade()
    store.write_batch([call("warm", prompt_ids=[1, 2], completion_ids=[3])])  # statements built once
    was = gc.isenabled()
    gc.disable()
    try:
        gc.freeze()  # only objects made from here on are collected and counted (a run's full heap: ~1 s a scan)
        for k in range(20):
            rec = call(f"s{k % 3}", prompt_ids=[1, 2, k], completion_ids=[3], harness="h")
            store.write_batch([rec], known_new=True)  # as the recorder writes a batch the first time
        left = gc.collect()
    finally:
        gc.unfreeze()
        if was:
            gc.enable()
    assert left < 40, f"{left} objects in reference cycles after 20 batches"
    got = {s.id: (s.call_count, s.harness) for s in store.sessions()}
    assert got == {"warm": (1, None), "s0": (7, "h"), "s1": (7, "h"), "s2": (6, "h")}
