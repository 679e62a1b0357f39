"""The input record of reconstruction, and how a recorded call becomes one.

``Generation`` is the contract between whatever holds a session's calls (a list of
``CallRecord``, a ``Store``, per-call deltas) and ``merge``: the exact ids of one finished
generation, never optional. ``generations_of`` turns call records into generations in
causal order, giving ids from a tokenizer to calls recorded without them (passthrough) and
listing the calls that cannot take part.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from orchard_rec import policy
from orchard_rec.protocol.images import ImageRef, images_of
from orchard_rec.reconstruct.retokenize import retokenize
from orchard_rec.reconstruct.sample import TokenSource
from orchard_rec.records import CallOutcome, CallRecord

__all__ = ["Generation", "generation_of", "generations_of"]


@dataclass(frozen=True, slots=True)
class Generation:
    """One finished model generation: what the model was given and what it produced."""

    call_id: str
    """The recorded call's id; turns and ``metadata.call_ids`` point back to it."""
    prompt_ids: tuple[int, ...]
    """The prompt exactly as the model saw it (chat template applied)."""
    completion_ids: tuple[int, ...]
    """The ids the model generated (choice 0)."""
    completion_logprobs: tuple[float, ...] | None = None
    """One log-probability per generated id, or None when the server gave none."""
    finish_reason: str | None = None
    """The dialect's stop reason (``stop``, ``length``, ``tool_calls``, ``max_tokens`` ...)."""
    source: TokenSource = TokenSource.SERVER
    """The server's ids, or the chat template's rendering of a call recorded without them."""
    auxiliary: str | None = None
    """The kind of side conversation (``title`` ...) when a harness held it for itself
    (``calls.metadata.auxiliary``, set by its plug-in); None for the agent's own."""
    images: tuple[ImageRef, ...] = ()
    """The images of the prompt, in the order the chat template placed them (``images_of``)."""
    versions: tuple[policy.Span, ...] | None = None
    """Which weights sampled the completion: spans over ``completion_ids`` (``orchard_rec.policy``),
    None when the proxy knew no version."""
    routed_experts: bytes | None = None
    """MoE routing over prompt + completion less the last token (``orchard_rec.routing.pack``)."""

    def __post_init__(self) -> None:
        logprobs = self.completion_logprobs
        if logprobs is not None and len(logprobs) != len(self.completion_ids):
            raise ValueError(
                f"call {self.call_id}: {len(logprobs)} logprobs for {len(self.completion_ids)} generated tokens"
            )


ABORT = "abort"
"""The finish reason of a generation the server cut (``/pause?mode=abort``): partial tokens."""


def generation_of(call: CallRecord, tokenizer: Any = None, *, aborted: str = "drop") -> Generation | None:
    """The generation a call recorded, or None when it has none: not a generation route, not
    finished (outcome other than ``ok``), cut by the server (finish reason ``abort``, unless
    ``aborted="keep"``), or recorded without ids and no ``tokenizer`` (a Hugging Face tokenizer
    with a chat template) to give them."""
    if not call.dialect.is_generation or call.outcome is not CallOutcome.OK:
        return None
    if call.finish_reason == ABORT and aborted != "keep":
        return None
    source = TokenSource.SERVER
    if call.prompt_ids is None or call.completion_ids is None:
        fixed = retokenize(call, tokenizer) if tokenizer is not None else None
        if fixed is None:
            return None
        call, source = fixed, TokenSource.RETOKENIZED
    assert call.prompt_ids is not None and call.completion_ids is not None  # retokenize sets both
    return Generation(
        call_id=call.call_id,
        prompt_ids=tuple(call.prompt_ids),
        completion_ids=tuple(call.completion_ids),
        completion_logprobs=None if call.completion_logprobs is None else tuple(call.completion_logprobs),
        finish_reason=call.finish_reason,
        source=source,
        auxiliary=str((call.metadata or {}).get("auxiliary") or "") or None,
        images=tuple(images_of(call.dialect, call.request)),
        versions=_versions(call, len(call.completion_ids)),
        routed_experts=call.routed_experts if source is TokenSource.SERVER else None,
    )


def _versions(call: CallRecord, n: int) -> tuple[policy.Span, ...] | None:
    """The call's stored spans; for a call recorded without ids (passthrough), its fence over
    the ids the template gave it."""
    if call.policy_versions is not None:
        return tuple(call.policy_versions)
    fence = (call.metadata or {}).get("policy")
    if not isinstance(fence, dict):
        return None
    done = policy.UNKNOWN if fence.get("moved") else fence.get("done")
    spans = policy.fence_spans(fence.get("sent"), done, n)
    return None if spans is None else tuple(spans)


def generations_of(
    calls: Iterable[CallRecord], tokenizer: Any = None, *, aborted: str = "drop"
) -> tuple[list[Generation], list[str]]:
    """``(generations in causal order, ids of the generation calls left out)``.

    Causal order: a call sent after another's answer arrived was received after it, so calls
    are taken by ``received_at`` (``seq``, the commit order, breaks ties). Calls that are not
    generations at all (``/v1/models``, pass-through routes) are neither kept nor listed.
    """
    kept: list[Generation] = []
    skipped: list[str] = []
    for call in sorted(calls, key=lambda c: (c.received_at, c.seq or 0)):
        if not call.dialect.is_generation:
            continue
        g = generation_of(call, tokenizer, aborted=aborted)
        if g is None:
            skipped.append(call.call_id)
        else:
            kept.append(g)
    return kept, skipped
