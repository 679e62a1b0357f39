"""Samples carry the policy version of every generated token, through merges, splits, forks
and realignment; generations the server aborted stay out unless asked; staleness selection
drops or masks exactly the stale tokens."""

from __future__ import annotations

from factories import call

from orchard_rec.policy import UNKNOWN, Staleness
from orchard_rec.reconstruct import reconstruct_session
from orchard_rec.selection.staleness import StalenessStats, apply_staleness

SYS = [1, 2, 3]


def test_a_linear_session_carries_each_turns_versions_in_response_coordinates() -> None:
    a = call(prompt_ids=SYS, completion_ids=[10, 11, 12], received_at=1, policy_versions=(("v1", 0, 3),))
    b = call(
        prompt_ids=[*SYS, 10, 11, 12, 20, 21],
        completion_ids=[30, 31, 32, 33],
        received_at=2,
        policy_versions=(("v1", 0, 1), ("v2", 1, 4)),  # tito: vLLM's spans, an update mid-generation
    )
    c = call(prompt_ids=[*SYS, 10, 11, 12, 20, 21, 30, 31, 32, 33, 40], completion_ids=[50], received_at=3)
    [s] = reconstruct_session([a, b, c])
    # response: 10 11 12 | 20 21 (observation) | 30 31 32 33 | 40 (observation) | 50 (no version known)
    assert s.policy_versions == [("v1", 0, 3), ("v1", 5, 6), ("v2", 6, 9), (UNKNOWN, 10, 11)]
    assert s.versions_per_token() == ["v1"] * 3 + [None] * 2 + ["v1"] + ["v2"] * 3 + [None] + [UNKNOWN]
    assert s.weight_versions() == ["v1", "v1", "v2", UNKNOWN]  # one per span, in order
    assert s.to_dict()["policy_versions"] == [["v1", 0, 3], ["v1", 5, 6], ["v2", 6, 9], [UNKNOWN, 10, 11]]


def test_samples_without_any_version_say_none() -> None:
    [s] = reconstruct_session([call(prompt_ids=SYS, completion_ids=[10])])
    assert (
        s.policy_versions is None and s.versions_per_token() is None and "policy_versions" not in s.to_dict()
    )


def test_a_fork_and_a_realigned_turn_keep_their_own_versions() -> None:
    a = call(prompt_ids=SYS, completion_ids=[10, 11], received_at=1, policy_versions=(("3", 0, 2),))
    retry = call(prompt_ids=SYS, completion_ids=[12, 13, 14], received_at=2, policy_versions=(("4", 0, 3),))
    [first, fork] = reconstruct_session([a, retry])
    assert first.policy_versions == [("3", 0, 2)] and fork.policy_versions == [("4", 0, 3)]
    assert fork.metadata["reason"] == "fork"


def test_a_passthrough_call_gets_its_fence_over_the_templates_ids() -> None:
    from orchard_rec.reconstruct.generation import generation_of

    fenced = call(prompt_ids=SYS, completion_ids=[9, 9], metadata={"policy": {"sent": "5", "done": "5"}})
    moved = call(prompt_ids=SYS, completion_ids=[9, 9], metadata={"policy": {"sent": "5", "done": "6"}})
    back = call(
        prompt_ids=SYS, completion_ids=[9], metadata={"policy": {"sent": "5", "done": "5", "moved": True}}
    )
    assert generation_of(fenced).versions == (("5", 0, 2),)  # type: ignore[union-attr]
    assert generation_of(moved).versions == ((UNKNOWN, 0, 2),)  # type: ignore[union-attr]
    assert generation_of(back).versions == ((UNKNOWN, 0, 1),)  # type: ignore[union-attr]


def test_aborted_generations_stay_out_unless_kept() -> None:
    a = call(
        prompt_ids=SYS,
        completion_ids=[10, 11],
        received_at=1,
        finish_reason="abort",
        policy_versions=(("1", 0, 2),),
    )
    [kept] = reconstruct_session([a], aborted="keep")
    assert kept.status == "aborted" and kept.response_ids == [10, 11]
    assert reconstruct_session([a]) == []


def _sample():  # type: ignore[no-untyped-def]
    a = call(prompt_ids=SYS, completion_ids=[10, 11, 12], received_at=1, policy_versions=(("v5", 0, 3),))
    b = call(
        prompt_ids=[*SYS, 10, 11, 12, 20],
        completion_ids=[30, 31],
        received_at=2,
        policy_versions=(("v7", 0, 2),),
    )
    [s] = reconstruct_session([a, b])
    return s


def test_staleness_masks_exactly_the_stale_tokens() -> None:
    s = _sample()
    stats = StalenessStats()
    assert apply_staleness(s, Staleness(current=8, max_staleness=1), "mask", stats)
    assert s.loss_mask == [0, 0, 0, 0, 1, 1]  # v5 < 8 - 1: masked; the observation was 0 already
    assert stats.masked_tokens == 3 and stats.stale_versions == {"v5": 3} and stats.dropped == 0
    assert "3 tokens masked in 1 samples" in stats.summary()


def test_staleness_drops_a_sample_holding_stale_tokens_and_keeps_fresh_ones() -> None:
    stats = StalenessStats()
    assert not apply_staleness(_sample(), Staleness(minimum=6), "drop", stats)
    assert apply_staleness(_sample(), Staleness(minimum=5), "drop", stats)
    assert apply_staleness(_sample(), Staleness(), "drop", stats)  # no floor: everything is kept
    assert (stats.samples, stats.dropped) == (3, 1)


def test_unknown_and_unversioned_tokens_are_stale_under_a_floor() -> None:
    [unversioned] = reconstruct_session([call(prompt_ids=SYS, completion_ids=[10])])
    assert not apply_staleness(unversioned, Staleness(minimum=0), "drop")
    a = call(prompt_ids=SYS, completion_ids=[10, 11], policy_versions=((UNKNOWN, 0, 2),))
    [s] = reconstruct_session([a])
    assert not apply_staleness(s, Staleness(minimum=0), "mask")  # nothing trainable left: dropped


def test_the_viewer_gets_a_version_per_token_for_its_band() -> None:
    from orchard_rec.ui.data import _sample_tokens

    toks = _sample_tokens(_sample())
    p = len(SYS)
    assert toks["v"] == [None] * p + ["v5"] * 3 + [None] + ["v7"] * 2
    [plain] = reconstruct_session([call(prompt_ids=SYS, completion_ids=[10])])
    assert _sample_tokens(plain)["v"] is None
