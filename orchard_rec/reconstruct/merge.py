"""Rebuild one session's generations into samples: exact token ids, never fabricated.

Generations are taken in causal order (``generations_of``: by arrival). One that extends
an open sample (its prompt ids start with the sample's full token list) grows it: the
prompt tokens in between are observation (mask 0, log-prob 0.0), the completion ids follow
(mask 1, with their logprobs). The longest such sample wins, so interleaved sub-agents each
grow their own line, and a linear session gives ONE sample whose tokens equal the last
call's prompt + completion.

When no sample is extended, ``on_mismatch`` decides:

- ``split`` (default): start a new sample from this prompt, linked to the sample it
  diverged from (``metadata.split_from``, ``metadata.reason``: ``fork`` when the prompt is
  exactly an earlier call's prompt, a retry or a branch; ``mismatch`` otherwise:
  re-tokenization drift, a template that drops reasoning from history, compaction);
- ``realign``: keep one sample: after the exact generated ids, append the observation
  tokens the chat template put after the previous assistant turn in the new prompt, and
  flag it in ``metadata.realigned`` (the calls), ``metadata.realign_points`` (per call, the
  first token of the sample its prompt did not repeat: the recorded log-probs of every
  later turn were computed on another context). When the prompt repeats the sample except
  inside generated turns (bytes the client got as U+FFFD, special tokens dropped from the
  text: ``realign.drift_cut``), the generated ids stand for those regions
  (``metadata.realign_spans``, ``[start, end)`` token spans). Otherwise the boundary comes
  from the template, which also merges harnesses that move messages between calls
  (OpenClaw's trailing internal-context message). Falls back to split when no sample
  shares the new prompt's opening.

Invariants (hypothesis properties in ``tests/reconstruct/test_properties.py``; every
real-harness and end-to-end test checks 1, 2 and 4 through ``tests/factories.py``):

1. every generation's completion ids appear verbatim and contiguous in exactly one sample,
   with mask 1 on exactly those positions and its logprobs aligned with them;
2. no position the model did not generate has mask 1 (observations, and any credit policy,
   can only turn positions off);
3. a linear session gives one sample, its tokens the last prompt + the last completion;
4. the first generation's prompt ids are the first sample's prompt;
5. ``len(loss_mask) == len(rollout_log_probs) == response_length`` for every sample (held by
   ``SampleBuilder``, the only code that grows a sample).

Side conversations a harness holds for itself (``Generation.auxiliary``, from the call's
``metadata.auxiliary``: opencode's title generation...) never merge with the agent's: they
make samples of their own, flagged ``metadata.auxiliary = True`` (``auxiliary_kind``).

Only finished generation calls (outcome ``ok``) with ids (or a tokenizer to give them) take
part; the others are listed in the first sample's ``metadata.skipped_calls``. Pure code:
records in, samples out; no storage, sockets or files.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchard_rec import routing
from orchard_rec.errors import UsageError
from orchard_rec.reconstruct.credit import AssistantCredit, CreditPolicy
from orchard_rec.reconstruct.generation import Generation, generations_of
from orchard_rec.reconstruct.realign import Drift, drift_cut
from orchard_rec.reconstruct.sample import Sample, SampleBuilder, SampleStatus, SplitReason, TokenSource
from orchard_rec.reconstruct.vision import image_runs, image_token_id
from orchard_rec.records import CallRecord, Outcome

__all__ = ["MismatchPolicy", "reconstruct", "reconstruct_session"]


class MismatchPolicy(enum.StrEnum):
    """What to do with a generation whose prompt extends no sample."""

    SPLIT = "split"
    """Start a linked sample (``metadata.split_from``, ``metadata.reason``)."""
    REALIGN = "realign"
    """Keep one sample: exact generated ids, then the template's observation delta."""

    @classmethod
    def of(cls, value: MismatchPolicy | str) -> MismatchPolicy:
        try:
            return cls(value)
        except ValueError:
            raise UsageError(
                f"unknown mismatch policy {value!r}; known: {', '.join(m.value for m in cls)}"
            ) from None


_TRUNCATED = ("length", "max_tokens", "incomplete")


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


def _turn_closer(b: SampleBuilder, turn_end: int | None) -> int | None:
    """The template's end-of-turn token: the last token of a turn the model ended itself
    (a cut turn's last token is arbitrary), else ``turn_end`` (from the chat template)."""
    for t in reversed(b.turns):
        if t.finish_reason not in _TRUNCATED and t.end > t.start:
            return b.tokens[b.prompt_length + t.end - 1]
    return turn_end


def _drift_target(
    builders: list[SampleBuilder], prompt: list[int], turn_end: int | None
) -> tuple[SampleBuilder, int, int, tuple[tuple[int, int], ...]] | None:
    """The sample this prompt repeats except inside generated turns (``realign.drift_cut``:
    bytes the client could not decode, special tokens dropped from text, stripped whitespace):
    the sample, where its observation starts in the prompt, the realign point and the spans."""
    best: tuple[SampleBuilder, Drift] | None = None
    for b in builders:
        if not b.turns:
            continue
        generated = [False] * b.prompt_length + [m == 1 for m in b.loss_mask]
        last_cut = b.last_finish in _TRUNCATED
        closer = _turn_closer(b, turn_end)
        opening = b.tokens[: b.prompt_length]
        d = drift_cut(b.tokens, generated, prompt, last_cut=last_cut, closer=closer, opening=opening)
        if d is not None and (best is None or d.point > best[1].point):
            best = (b, d)
    return None if best is None else (best[0], best[1].cut, best[1].point, best[1].spans)


def _realign_target(
    builders: list[SampleBuilder], prompt: list[int], turn_end: int | None = None
) -> tuple[SampleBuilder, int, int, tuple[tuple[int, int], ...]] | None:
    """The sample this prompt continues despite drift or moved messages, and where its new
    observation starts: after the last previous assistant turn in the new prompt, found as
    the last generation-prompt marker (the tokens every prompt ends with) before the final
    one, followed by the template's end-of-turn token. When the sample's last turn was cut
    (``length``), that token was never generated: it opens the observation. A sample
    qualifies when the new prompt shares at least half of its original prompt (same system
    prompt and task), so sub-agents with their own instructions are not merged."""
    best: tuple[SampleBuilder, int, int] | None = None
    for b in builders:
        if not b.turns:
            continue
        shared = _common_prefix(prompt, b.tokens)
        if shared * 2 < b.prompt_length:
            continue
        closer = _turn_closer(b, turn_end)
        if closer is None:
            continue
        marker = b.tokens[max(0, b.prompt_length - 3) : b.prompt_length]
        stop = len(prompt) - len(marker)
        if prompt[stop:] == marker:
            stop -= 1  # skip the generation prompt this call ends with
        pos = _rfind(prompt, marker, stop)
        if pos < 0:
            continue
        try:
            cut = prompt.index(closer, pos + len(marker))
        except ValueError:
            continue
        if b.tokens[-1] == closer:  # the model closed its turn: that token is in the sample
            cut += 1
        if best is None or shared > best[2]:
            best = (b, cut, shared)
    return None if best is None else (best[0], best[1], best[2], ())


def template_turn_end(tokenizer: Any) -> int | None:
    """The token a chat template closes an assistant turn with (ChatML: ``<|im_end|>``):
    the first token the template renders after an assistant message's content."""
    probe = "\x00orchard-probe\x00"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": probe}], tokenize=False
        )
        after = str(text)[str(text).index(probe) + len(probe) :]
        ids = list(tokenizer.encode(after, add_special_tokens=False))
    except (AttributeError, ValueError, TypeError):
        return getattr(tokenizer, "eos_token_id", None)
    return ids[0] if ids else getattr(tokenizer, "eos_token_id", None)


def _built(
    b: SampleBuilder, k: int, step_of: dict[str, int], image_token: int | None, outcome: Outcome | None
) -> Sample:
    """Builder ``k`` of a session as its sample: status, metadata, image spans, the outcome's
    reward (before the credit policy applies)."""
    s = b.build()
    s.index = k
    s.status = SampleStatus.TRUNCATED if b.last_finish in _TRUNCATED else SampleStatus.COMPLETED
    if b.last_finish == "abort":  # kept with --aborted keep: the server cut its last generation
        s.status = SampleStatus.ABORTED
    s.metadata["call_ids"] = list(b.call_ids)
    source = b.sources.pop() if len(b.sources) == 1 else TokenSource.MIXED
    s.metadata["token_source"] = source.value
    s.metadata["branch"] = k
    s.metadata["turn_steps"] = [step_of[c] for c in b.call_ids]
    if b.missing_logprobs:
        s.metadata["missing_logprobs"] = True
    if s.routed_experts is not None and routing.covers(s.routed_experts) != len(s.tokens) - 1:
        s.routed_experts = None  # the rows do not start at the sample's first token
    if b.routed_seen and s.routed_experts is None:  # realigned, or its last call had none
        s.metadata["routed_experts_missing"] = True
    if image_token is not None and (s.images or image_token in s.tokens):
        spans = image_runs(s.tokens, image_token)
        s.metadata["image_spans"] = spans
        if len(spans) != len(s.images):
            s.metadata["image_spans_mismatch"] = True
    if outcome is not None:
        s.outcome = outcome
        s.reward = dict(outcome.reward) if isinstance(outcome.reward, Mapping) else outcome.reward
        if outcome.status is not None and s.status is SampleStatus.COMPLETED:
            s.status = SampleStatus(outcome.status)
    return s


def reconstruct(
    generations: Iterable[Generation],
    *,
    session_id: str,
    on_mismatch: MismatchPolicy | str = MismatchPolicy.SPLIT,
    credit: CreditPolicy | None = None,
    outcome: Outcome | None = None,
    skipped: Sequence[str] = (),
    turn_end: int | None = None,
    image_token: int | None = None,
) -> list[Sample]:
    """Samples of one session's ``generations`` (in causal order), in order of their first call.

    ``skipped`` lists calls that could not take part (``metadata.skipped_calls`` of the first
    sample); ``outcome`` gives reward and status, ``credit`` the loss mask policy.
    ``turn_end``: the chat template's end-of-turn token (``template_turn_end``), which
    ``realign`` needs when every turn of a sample was cut. ``image_token``: the VLM's image
    placeholder id (``vision.image_token_id``); with it, samples with images get
    ``metadata.image_spans`` (one ``[start, end)`` run per image, in token coordinates), and
    ``metadata.image_spans_mismatch`` when the runs and the request's images differ in number.
    """
    policy_mismatch = MismatchPolicy.of(on_mismatch)
    builders: list[SampleBuilder] = []
    step_of: dict[str, int] = {}
    for g in generations:
        step_of[g.call_id] = len(step_of)
        prompt = list(g.prompt_ids)
        kin = [b for b in builders if b.metadata.get("auxiliary_kind") == g.auxiliary]  # never across
        target: SampleBuilder | None = None
        for b in kin:
            if b.extends(prompt) and (target is None or len(b.tokens) > len(target.tokens)):
                target = b
        if target is not None:
            target.append_observation(prompt[len(target.tokens) :])
            target.append_generation(
                g.completion_ids,
                g.completion_logprobs,
                g.call_id,
                g.finish_reason,
                g.versions,
                g.routed_experts,
            )
            target.sources.add(g.source)
            target.images = list(g.images)
            continue
        if policy_mismatch is MismatchPolicy.REALIGN:
            found = _drift_target(kin, prompt, turn_end) or _realign_target(kin, prompt, turn_end)
            if found is not None:
                b, cut, point, drifted = found
                b.metadata.setdefault("realign_points", []).append(point)
                if drifted:
                    known = b.metadata.setdefault("realign_spans", [])
                    known.extend(list(sp) for sp in drifted if list(sp) not in known)
                b.append_observation(prompt[cut:])
                b.append_generation(
                    g.completion_ids, g.completion_logprobs, g.call_id, g.finish_reason, g.versions
                )
                b.metadata.setdefault("realigned", []).append(g.call_id)
                b.routed_seen = b.routed_seen or g.routed_experts is not None  # not what the server ran
                b.sources.add(g.source)
                b.images = list(g.images)
                continue
        nb = SampleBuilder(session_id, prompt)
        parent, reason = _divergence(kin, prompt)
        if parent is not None and reason is not None:
            nb.metadata["split_from"] = builders.index(kin[parent])
            nb.metadata["reason"] = reason.value
            dropped = _dropped_images(kin[parent].images, g.images)
            if dropped:
                # the harness keeps only its last screenshots: the prefix breaks at the oldest
                # image, so every later turn is a sample of its own (Orchard-GUI's per-turn samples)
                nb.metadata["images_dropped"] = dropped
        if g.auxiliary is not None:
            nb.metadata["auxiliary"] = True
            nb.metadata["auxiliary_kind"] = g.auxiliary
        nb.append_generation(
            g.completion_ids, g.completion_logprobs, g.call_id, g.finish_reason, g.versions, g.routed_experts
        )
        nb.sources.add(g.source)
        nb.images = list(g.images)
        builders.append(nb)
    policy = credit or AssistantCredit()
    samples: list[Sample] = []
    for k, b in enumerate(builders):
        s = _built(b, k, step_of, image_token, outcome)
        policy.apply(s, outcome)
        samples.append(s)
    if samples and skipped:
        samples[0].metadata["skipped_calls"] = list(skipped)
    return samples


def reconstruct_session(
    calls: Iterable[CallRecord],
    *,
    on_mismatch: MismatchPolicy | str = MismatchPolicy.SPLIT,
    credit: CreditPolicy | None = None,
    outcome: Outcome | None = None,
    session_id: str | None = None,
    tokenizer: Any = None,
    aborted: str = "drop",
) -> list[Sample]:
    """Samples of one session's recorded calls, in order of their first call.

    ``tokenizer`` (a Hugging Face tokenizer with a chat template) gives ids to calls
    recorded without them; without one, such calls are skipped. ``session_id`` defaults to
    the calls' own. ``aborted``: ``drop`` (default) leaves generations the server cut (finish
    reason ``abort``, a weight update) out, listed in ``skipped_calls``; ``keep`` takes their
    partial tokens like any other's.
    """
    calls = list(calls)
    generations, skipped = generations_of(calls, tokenizer, aborted=aborted)
    sid = session_id or next((c.session_id for c in calls if c.session_id), None) or ""
    return reconstruct(
        generations,
        session_id=sid,
        on_mismatch=on_mismatch,
        credit=credit,
        outcome=outcome,
        skipped=skipped,
        turn_end=template_turn_end(tokenizer) if tokenizer is not None else None,
        image_token=image_token_id(tokenizer),
    )


def _dropped_images(before: Sequence[Any], after: Sequence[Any]) -> int:
    """How many of a sample's images a new prompt no longer shows (0 when it keeps them all)."""
    kept = {im.digest for im in after}
    return sum(1 for im in before if im.digest not in kept)


def _divergence(
    builders: Sequence[SampleBuilder], prompt: list[int]
) -> tuple[int | None, SplitReason | None]:
    """Which earlier sample this prompt branches from, and why.

    ``fork``: the prompt is exactly the prompt of an earlier call (a retry, or a branch
    from the same point); ``mismatch``: it shares a prefix with a sample but departs from it
    inside what was generated or observed (drift, edited or compacted history); none: it
    shares nothing with any sample (a new line, a sub-agent).
    """
    best: tuple[int, int] | None = None  # (builder index, common prefix length)
    for k, b in enumerate(builders):
        if len(prompt) in b.prompt_ends and prompt == b.tokens[: len(prompt)]:
            return k, SplitReason.FORK
        n = 0
        for x, y in zip(prompt, b.tokens):
            if x != y:
                break
            n += 1
        if n and (best is None or n > best[1]):
            best = (k, n)
    if best is not None:
        return best[0], SplitReason.MISMATCH
    return None, None
