"""Rebuild one session's calls into samples: exact token ids, never fabricated.

Calls are taken in the order they were received. A call whose prompt ids start with an open sample's
full token list extends it: the prompt tokens in between are observation (mask 0), the
completion ids follow (mask 1, with their logprobs). The longest such sample wins, so
interleaved sub-agents each grow their own line. A linear session therefore gives ONE
sample whose tokens equal the last call's prompt + completion.

When no sample is extended, the ``on_mismatch`` policy decides:
- ``split`` (default): start a new sample from this call's prompt, linked to the sample it
  diverged from in ``metadata`` (``reason``: ``fork`` when the prompt re-uses an earlier
  fork point of a sample, a retry or a branch; ``mismatch`` otherwise: re-tokenization
  drift, a template that drops reasoning from history, compaction);
- ``realign``: keep one sample: after the exact generated ids, append the observation
  tokens the chat template put after the previous assistant turn in the new prompt, and
  flag it in ``metadata.realigned``. This also merges harnesses that move messages
  between calls (OpenClaw's trailing internal-context message). Falls back to split when
  no sample shares the new prompt's opening.

Only calls that finished (outcome ``ok``) with token ids take part; others are listed in
``metadata.skipped_calls``. Pure code: records in, samples out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from orchard_rec.reconstruct.credit import AssistantCredit, CreditPolicy
from orchard_rec.reconstruct.retokenize import retokenize
from orchard_rec.reconstruct.sample import Sample, SampleBuilder
from orchard_rec.records import CallOutcome, CallRecord, Outcome

__all__ = ["MismatchPolicy", "reconstruct_session"]

MismatchPolicy = Literal["split", "realign"]


def _status(b: SampleBuilder, calls: dict[str, CallRecord]) -> str:
    if b.last_finish in ("length", "max_tokens", "incomplete"):
        return "truncated"
    return "completed"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _rfind(seq: Sequence[int], sub: Sequence[int], stop: int) -> int:
    """Start of the last occurrence of ``sub`` in ``seq`` that begins before ``stop``; -1 if none."""
    k = len(sub)
    for i in range(min(stop, len(seq) - k), -1, -1):
        if seq[i : i + k] == sub:
            return i
    return -1


def _realign_target(builders: list[SampleBuilder], prompt: list[int]) -> tuple[SampleBuilder, int] | None:
    """The sample this prompt continues despite drift or moved messages, and where its new
    observation starts: after the last previous assistant turn in the new prompt, found as
    the last generation-prompt marker (the tokens every prompt ends with) before the final
    one, followed by the turn-closing token. A sample qualifies when the new prompt shares at
    least half of its original prompt (same system prompt and task), so sub-agents with
    their own instructions are not merged."""
    best: tuple[SampleBuilder, int, int] | None = None
    for b in builders:
        if not b.turns:
            continue
        shared = _common_prefix(prompt, b.tokens)
        if shared * 2 < b.prompt_length:
            continue
        marker = b.tokens[max(0, b.prompt_length - 3) : b.prompt_length]
        closer = b.tokens[-1]  # the token that ended the last generation (end-of-turn)
        stop = len(prompt) - len(marker)
        if prompt[stop:] == marker:
            stop -= 1  # skip the generation prompt this call ends with
        pos = _rfind(prompt, marker, stop)
        if pos < 0:
            continue
        try:
            cut = prompt.index(closer, pos + len(marker)) + 1
        except ValueError:
            continue
        if best is None or shared > best[2]:
            best = (b, cut, shared)
    return None if best is None else (best[0], best[1])


def reconstruct_session(
    calls: Iterable[CallRecord],
    *,
    on_mismatch: MismatchPolicy = "split",
    credit: CreditPolicy | None = None,
    outcome: Outcome | None = None,
    session_id: str | None = None,
    tokenizer: Any = None,
) -> list[Sample]:
    """Samples of one session, in order of their first call.

    ``tokenizer`` (a Hugging Face tokenizer with a chat template) gives ids to calls
    recorded without them; without one, such calls are skipped.
    """
    builders: list[SampleBuilder] = []
    by_id: dict[str, CallRecord] = {}
    skipped: list[str] = []
    step_of: dict[str, int] = {}
    sid = session_id
    # causal order: a call sent after another's answer was received after it (seq is commit order)
    for call in sorted(calls, key=lambda c: (c.received_at, c.seq or 0)):
        sid = sid or call.session_id or ""
        if not call.dialect.is_generation:
            continue
        if call.outcome is not CallOutcome.OK:
            skipped.append(call.call_id)
            continue
        source = "server"
        if call.prompt_ids is None or call.completion_ids is None:
            fixed = retokenize(call, tokenizer) if tokenizer is not None else None
            if fixed is None:
                skipped.append(call.call_id)
                continue
            call, source = fixed, "retokenized"
        by_id[call.call_id] = call
        step_of[call.call_id] = len(step_of)
        prompt = list(call.prompt_ids)
        completion = call.completion_ids
        target: SampleBuilder | None = None
        for b in builders:
            if b.extends(prompt) and (target is None or len(b.tokens) > len(target.tokens)):
                target = b
        if target is not None:
            target.append_observation(prompt[len(target.tokens) :])
            target.append_generation(completion, call.completion_logprobs, call.call_id, call.finish_reason)
            target.sources.add(source)
            continue
        if on_mismatch == "realign":
            found = _realign_target(builders, prompt)
            if found is not None:
                b, cut = found
                b.append_observation(prompt[cut:])
                b.append_generation(completion, call.completion_logprobs, call.call_id, call.finish_reason)
                b.metadata.setdefault("realigned", []).append(call.call_id)
                b.sources.add(source)
                continue
        nb = SampleBuilder(sid or "", prompt)
        parent, reason = _divergence(builders, prompt)
        if parent is not None:
            nb.metadata["split_from"] = parent
            nb.metadata["reason"] = reason
        nb.append_generation(completion, call.completion_logprobs, call.call_id, call.finish_reason)
        nb.sources.add(source)
        builders.append(nb)
    policy = credit or AssistantCredit()
    samples: list[Sample] = []
    for k, b in enumerate(builders):
        s = b.build()
        s.index = k
        s.status = _status(b, by_id)
        s.metadata["call_ids"] = list(b.call_ids)
        s.metadata["token_source"] = b.sources.pop() if len(b.sources) == 1 else "mixed"
        s.metadata["branch"] = k
        s.metadata["turn_steps"] = [step_of[c] for c in b.call_ids]
        if b.missing_logprobs:
            s.metadata["missing_logprobs"] = True
        if outcome is not None:
            s.reward = dict(outcome.reward) if isinstance(outcome.reward, dict) else outcome.reward
            if outcome.status is not None and s.status == "completed":
                s.status = outcome.status
        policy.apply(s, outcome)
        samples.append(s)
    if samples and skipped:
        samples[0].metadata["skipped_calls"] = skipped
    return samples


def _divergence(builders: Sequence[SampleBuilder], prompt: list[int]) -> tuple[int | None, str]:
    """Which earlier sample this prompt branches from, and why.

    ``fork``: the prompt is exactly the prompt of an earlier call (a retry, or a branch
    from the same point); ``mismatch``: it shares a prefix with a sample but departs from it
    inside what was generated or observed (drift, edited or compacted history).
    """
    best: tuple[int, int] | None = None  # (builder index, common prefix length)
    for k, b in enumerate(builders):
        if len(prompt) in b.prompt_ends and prompt == b.tokens[: len(prompt)]:
            return k, "fork"
        n = 0
        for x, y in zip(prompt, b.tokens):
            if x != y:
                break
            n += 1
        if n and (best is None or n > best[1]):
            best = (k, n)
    if best is not None:
        return best[0], "mismatch"
    return None, "new"
