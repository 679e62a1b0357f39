"""Invariants of reconstruction, as hypothesis properties over random sessions.

(1) every generation's completion ids appear verbatim and contiguous in exactly one sample,
    with mask 1 on exactly those positions and aligned logprobs;
(2) no mask-1 position that the model did not generate;
(3) linear sessions give one sample with tokens = last prompt + last completion;
(4) the first call's prompt ids are the first sample's prompt;
(5) each generated token carries its call's policy version (``None`` on observations), through
    merges, splits, forks and realignment.
Sessions mix extension, drift (a re-tokenized earlier turn), forks (same prompt twice)
and interleaved sub-agents; both mismatch policies are checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from factories import call
from hypothesis import given, settings
from hypothesis import strategies as st

from orchard_rec.policy import per_token
from orchard_rec.reconstruct import Sample, reconstruct_session
from orchard_rec.records import CallRecord

ids = st.lists(st.integers(min_value=10, max_value=60), min_size=1, max_size=6)


@dataclass
class Session:
    calls: list[CallRecord]
    linear: bool


@st.composite
def sessions(draw: st.DrawFn, linear_only: bool = False) -> Session:
    lines: list[list[int]] = [[1] + draw(ids)]
    prompts: list[list[int]] = []
    calls: list[CallRecord] = []
    linear = True
    for _ in range(draw(st.integers(1, 8))):
        action = (
            "extend"
            if linear_only
            else draw(st.sampled_from(["extend", "extend", "drift", "fork", "subagent"]))
        )
        k = draw(st.integers(0, len(lines) - 1))
        if action == "subagent":
            lines.append([2] + draw(ids))
            k = len(lines) - 1
        if action == "fork" and prompts:
            prompt = list(draw(st.sampled_from(prompts)))
        elif action == "drift" and len(lines[k]) > 2:
            prompt = list(lines[k])
            pos = draw(st.integers(1, len(prompt) - 1))
            prompt[pos] = 99  # one earlier token comes back re-tokenized
            prompt += draw(ids)
        else:
            prompt = lines[k] + (draw(ids) if calls else [])
        if action != "extend" or len(lines) > 1:
            linear = False
        completion = draw(ids) + [9]
        v, cut = len(calls), draw(st.integers(0, len(completion)))
        versions = draw(st.sampled_from([None, ((f"v{v}", 0, cut), (f"v{v + 1}", cut, len(completion)))]))
        calls.append(
            call(
                "s",
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=[-(i % 7) / 10 - 0.01 for i in completion],
                policy_versions=None if versions is None else tuple(x for x in versions if x[1] < x[2]),
            )
        )
        prompts.append(prompt)
        lines[k] = prompt + completion
    return Session(calls, linear)


def _check_invariants(session: Session, samples: list[Sample]) -> None:
    # (1)
    for c in session.calls:
        homes = [(s, t) for s in samples for t in s.turns if t.call_id == c.call_id]
        assert len(homes) == 1, "each generation lives in exactly one sample"
        s, t = homes[0]
        assert s.response_ids[t.start : t.end] == list(c.completion_ids)  # type: ignore[arg-type]
        assert s.loss_mask[t.start : t.end] == [1] * len(c.completion_ids)  # type: ignore[arg-type]
        assert s.rollout_log_probs[t.start : t.end] == list(c.completion_logprobs)  # type: ignore[arg-type]
        # (5)
        per = s.versions_per_token()
        if per is not None:
            assert per[t.start : t.end] == per_token(c.policy_versions, t.end - t.start)
        else:
            assert c.policy_versions is None
    # (2)
    for s in samples:
        generated = {i for t in s.turns for i in range(t.start, t.end)}
        assert {i for i, m in enumerate(s.loss_mask) if m} <= generated
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        per = s.versions_per_token()
        assert per is None or {i for i, v in enumerate(per) if v is not None} == generated
    # (4)
    assert samples[0].prompt_ids == list(session.calls[0].prompt_ids)  # type: ignore[arg-type]


@pytest.mark.slow  # 300 random sessions: ~10 s on a loaded machine
@settings(max_examples=300, deadline=None)
@given(sessions())
def test_invariants_hold_for_any_session(session: Session) -> None:
    for policy in ("split", "realign"):
        samples = reconstruct_session(session.calls, on_mismatch=policy)  # type: ignore[arg-type]
        _check_invariants(session, samples)
    for s in reconstruct_session(session.calls):  # split: each sample ends with its last call's exact ids
        last = next(c for c in reversed(session.calls) if c.call_id == s.turns[-1].call_id)
        assert s.tokens == list(last.prompt_ids) + list(last.completion_ids)  # type: ignore[arg-type]


@pytest.mark.slow  # 200 random sessions: 1-2.7 s (test_merge.py's linear session stays fast)
@settings(max_examples=200, deadline=None)
@given(sessions(linear_only=True))
def test_prefix_extending_calls_merge_into_one_sample(session: Session) -> None:
    [sample] = reconstruct_session(session.calls)
    first, last = session.calls[0], session.calls[-1]
    assert sample.tokens == [*last.prompt_ids, *last.completion_ids]  # type: ignore[misc]
    assert sample.tokens[: len(sample.tokens) - sample.response_length] == list(first.prompt_ids)  # type: ignore[arg-type]
    _check_invariants(session, [sample])
