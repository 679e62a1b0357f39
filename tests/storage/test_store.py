"""Store: gap-free sequence numbers under concurrency, idempotent writes, round trips."""

from __future__ import annotations

from factories import call, run_threads

from orchard_rec.records import CallOutcome, Dialect
from orchard_rec.storage import Store


def test_round_trip_keeps_every_field(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    rec = call(
        "sess-a",
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        logprobs=[-0.5, -0.25],
        request={"model": "m", "messages": [{"role": "user", "content": "hé \u2603"}]},
        response={"choices": [{"message": {"content": "ok"}}]},
        events=[[None, {"a": 1}], ["message_stop", {"type": "message_stop"}]],
        headers={"user-agent": "x"},
        usage={"prompt_tokens": 3},
        finish_reason="stop",
        harness="openai-python",
    )
    assert store.write_batch([rec]) == 1
    [back] = store.calls("sess-a")
    assert back.seq == 1
    for f in (
        "call_id",
        "session_id",
        "dialect",
        "request",
        "response",
        "events",
        "prompt_ids",
        "completion_ids",
        "completion_logprobs",
        "headers",
        "usage",
        "finish_reason",
        "harness",
        "outcome",
        "status_code",
    ):
        assert getattr(back, f) == getattr(rec, f), f
    assert abs(back.received_at - rec.received_at) < 1e-3
    store.close()


def test_writes_are_idempotent_by_call_id(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    a, b = call("s"), call("s")
    assert store.write_batch([a, b]) == 2
    assert store.write_batch([a, b, a]) == 0  # a replayed batch stores nothing twice
    c = call("s")
    assert store.write_batch([a, c]) == 1
    assert [r.seq for r in store.calls("s")] == [1, 2, 3]
    assert store.session("s").call_count == 3  # type: ignore[union-attr]
    store.close()


def test_sequence_numbers_are_gap_free_under_concurrent_writers(db_url: str) -> None:
    """Eight writer threads (eight connections) hammer the same sessions."""
    store = Store(db_url)
    store.upgrade()
    sessions = [f"s{i}" for i in range(5)]

    def writer(k: int) -> None:
        for j in range(15):
            store.write_batch([call(sessions[(k + j) % 5]) for _ in range(3)])

    run_threads(writer, 8)
    total = 0
    for s in sessions:
        seqs = [r.seq for r in store.calls(s)]
        assert seqs == list(range(1, len(seqs) + 1)), s
        total += len(seqs)
    assert total == 8 * 15 * 3
    store.close()


def test_untagged_calls_have_no_session_and_no_seq(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    store.write_batch([call(None, dialect=Dialect.MODELS, outcome=CallOutcome.OK)])
    [r] = store.calls(untagged=True)
    assert r.session_id is None and r.seq is None
    assert store.sessions() == []
    store.close()
