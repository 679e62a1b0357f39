"""The training sample, and the one builder that grows it.

``Sample`` mirrors slime's ``Sample`` where the names overlap (``tokens`` = prompt +
response, ``response_length``, ``loss_mask`` over ``tokens[-response_length:]``,
``rollout_log_probs`` aligned with it, ``reward``, ``status``, ``index``,
``group_index``, ``metadata``). Only ``SampleBuilder`` appends tokens, and it appends
mask and log-prob entries in the same call, so ``len(loss_mask) == response_length``
holds by construction.

Statuses, split reasons and token sources are ``StrEnum`` values (they compare equal to
their strings); rows written out (``to_dict``, every exporter) carry the plain strings, so
no file we write needs orchard-rec to be read back.
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard_rec import policy, routing
from orchard_rec.protocol.images import ImageRef
from orchard_rec.records import Outcome

__all__ = [
    "ImageRef",
    "Sample",
    "SampleBuilder",
    "SampleStatus",
    "SplitReason",
    "TeacherData",
    "TokenSource",
    "Turn",
    "numeric_reward",
]


class SampleStatus(enum.StrEnum):
    """How a sample ended: slime's ``Sample.Status`` values (without ``pending``)."""

    COMPLETED = "completed"
    """The last generation stopped on its own (end of turn, a tool call)."""
    TRUNCATED = "truncated"
    """The last generation hit its token limit (``length`` / ``max_tokens`` / ``incomplete``)."""
    ABORTED = "aborted"
    """The session was cut short (reported by the session's outcome)."""
    FAILED = "failed"
    """The task failed (reported by the session's outcome)."""


class SplitReason(enum.StrEnum):
    """Why a sample was started apart from an earlier one (``metadata["reason"]``)."""

    FORK = "fork"
    """The prompt is exactly an earlier call's prompt: a retry, or a branch from that point."""
    MISMATCH = "mismatch"
    """The prompt departs from a sample inside its tokens: drift, dropped reasoning, compaction."""


class TokenSource(enum.StrEnum):
    """Where a sample's ids came from (``metadata["token_source"]``)."""

    SERVER = "server"
    """The model server's own ids (token mode, tito)."""
    RETOKENIZED = "retokenized"
    """Rendered with the chat template at reconstruction: a best effort, not what the model saw."""
    MIXED = "mixed"
    """Both kinds of call in one sample."""


def numeric_reward(reward: Any) -> float | None:
    """A reward as one number: the number, or named rewards' ``"reward"`` entry (what
    ``outcome --reward R --reward-json ...`` stores the scalar as); None otherwise."""
    if isinstance(reward, dict):
        reward = reward.get("reward")
    if isinstance(reward, (bool, int, float)):
        return float(reward)
    return None


@dataclass(frozen=True, slots=True)
class Turn:
    """One generation inside a sample, in response coordinates (``tokens[prompt_length + start : prompt_length + end]``)."""

    call_id: str
    start: int
    end: int
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class TeacherData:
    """A teacher's log-probs over a sample's response (``orchard-rec teacher``)."""

    log_probs: list[float]
    """len = response_length; 0.0 where ``valid_mask`` is 0."""
    valid_mask: list[int]
    """1 where the teacher scored the token; 0 where it gave nothing (truncated, failed)."""
    name: str | None = None
    """The teacher's model name/version as recorded."""
    topk_ids: list[list[int]] | None = None
    topk_logprobs: list[list[float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "teacher_log_probs": self.log_probs,
            "teacher_valid_mask": self.valid_mask,
            "teacher": self.name,
        }
        if self.topk_ids is not None:
            d["teacher_topk_ids"] = self.topk_ids
            d["teacher_topk_logprobs"] = self.topk_logprobs
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TeacherData | None:
        if d.get("teacher_log_probs") is None:
            return None
        return cls(
            list(d["teacher_log_probs"]),
            list(d["teacher_valid_mask"]),
            d.get("teacher"),
            d.get("teacher_topk_ids"),
            d.get("teacher_topk_logprobs"),
        )


@dataclass
class Sample:
    session_id: str
    tokens: list[int]
    """Prompt ids followed by the response (generations and the observations between them)."""
    response_length: int
    loss_mask: list[int]
    """1 where the model generated the token and it is credited, 0 on observations; len = response_length."""
    rollout_log_probs: list[float]
    """The server's log-probability of each response token; 0.0 on observations; len = response_length."""
    turns: list[Turn]
    status: SampleStatus = SampleStatus.COMPLETED
    reward: float | dict[str, float] | None = None
    index: int = 0
    group_index: int | None = None
    token_weights: list[float] | None = None
    """Per-token credit weights (len = response_length) when the credit policy sets any."""
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None
    """The conversation as chat messages (last call's request + its answer), attached by
    exporters that need text (``needs_messages``); never part of the jsonl row."""
    tools: list[dict[str, Any]] | None = None
    teacher: TeacherData | None = None
    """Teacher log-probs over the response, attached at export when stored; None = no teacher data."""
    images: list[ImageRef] = field(default_factory=list)
    """The images the sample's tokens show, in order (the last merged call's prompt images): one
    per image run of the prompt/observations (``metadata.image_spans`` when the image token is known)."""
    outcome: Outcome | None = None
    """The session's outcome as reconstruction was given it (its metadata: ``exit_status``, gold
    fields, ...; its ``step_values``); never part of the jsonl row."""
    policy_versions: list[policy.Span] | None = None
    """Which weights sampled each generated token: ``(version, start, end)`` spans in response
    coordinates over the generated positions only (observations have none); ``"unknown"`` where
    a generation had no version or an update could not be placed. None: no version was known."""

    routed_experts: bytes | None = None
    """MoE routing replay: the experts the server routed each of ``tokens[:-1]`` to
    (``orchard_rec.routing.pack``), from the sample's last call when its prompt + completion are
    exactly the sample's tokens (extension, split, fork); None otherwise, with
    ``metadata.routed_experts_missing`` when a call of the sample had routing (a realigned sample:
    its tokens are not what the server ran)."""

    def versions_per_token(self) -> list[str | None] | None:
        """One entry per response token: its version, None on observations (not sampled)."""
        if self.policy_versions is None:
            return None
        out: list[str | None] = [None] * self.response_length
        for v, s, e in self.policy_versions:
            out[s:e] = [v] * (min(e, self.response_length) - s)
        return out

    def weight_versions(self) -> list[str]:
        """slime's ``Sample.weight_versions``: the versions that sampled the response, in order
        (slime appends one per generate call; a generation that straddled an update gives each)."""
        return [v for v, _, _ in self.policy_versions or ()]

    @property
    def sample_key(self) -> str:
        """A stable identity of the sample within its session: its first call's id."""
        ids = self.metadata.get("call_ids")
        if ids:
            return str(ids[0])
        return self.turns[0].call_id if self.turns else ""

    def messages_prompt(self) -> list[dict[str, Any]] | str:
        """The messages before the first assistant turn, or "" when no messages are attached."""
        if not self.messages:
            return ""
        out = []
        for m in self.messages:
            if m.get("role") == "assistant":
                break
            out.append(m)
        return out

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def prompt_ids(self) -> list[int]:
        return self.tokens[: self.prompt_length]

    @property
    def response_ids(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def to_dict(self) -> dict[str, Any]:
        """The jsonl row (see ``orchard_rec.exporters.jsonl``)."""
        d: dict[str, Any] = {
            "session_id": self.session_id,
            "index": self.index,
            "group_index": self.group_index,
            "tokens": self.tokens,
            "response_length": self.response_length,
            "loss_mask": self.loss_mask,
            "rollout_log_probs": self.rollout_log_probs,
            "reward": self.reward,
            "status": str(self.status),
            "metadata": {**self.metadata, "turns": [[t.call_id, t.start, t.end] for t in self.turns]},
        }
        if self.token_weights is not None:
            d["token_weights"] = self.token_weights
        if self.images:
            d["images"] = [im.to_dict() for im in self.images]
        if self.teacher is not None:
            d.update(self.teacher.to_dict())
        if self.policy_versions is not None:
            d["policy_versions"] = policy.to_json(self.policy_versions)
        if self.routed_experts is not None:
            r = routing.unpack(self.routed_experts)
            d["routed_experts"] = {
                "dtype": r.dtype,
                "shape": [r.rows, r.layers, r.topk],
                "data": base64.b64encode(r.data).decode(),
            }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        meta = dict(d.get("metadata") or {})
        turns = [Turn(c, s, e) for c, s, e in meta.pop("turns", [])]
        return cls(
            session_id=d["session_id"],
            tokens=list(d["tokens"]),
            response_length=d["response_length"],
            loss_mask=list(d["loss_mask"]),
            rollout_log_probs=list(d["rollout_log_probs"]),
            turns=turns,
            status=SampleStatus(d.get("status", "completed")),
            reward=d.get("reward"),
            index=d.get("index", 0),
            group_index=d.get("group_index"),
            token_weights=d.get("token_weights"),
            metadata=meta,
            teacher=TeacherData.from_dict(d),
            images=[ImageRef.from_dict(i) for i in d.get("images") or ()],
            policy_versions=_spans(d.get("policy_versions")),
            routed_experts=_routing(d.get("routed_experts")),
        )


def _routing(value: Any) -> bytes | None:
    if not isinstance(value, dict):
        return None
    rows, layers, topk = value["shape"]
    width = {"uint8": 1, "uint16": 2, "uint32": 4}[value["dtype"]]
    return routing.pack(routing.Routing(rows, layers, topk, width, base64.b64decode(value["data"])))


def _spans(value: Any) -> list[policy.Span] | None:
    spans = policy.from_json(value)
    return None if spans is None else list(spans)


class SampleBuilder:
    """Grows one sample call by call. Observations get mask 0 and log-prob 0.0."""

    __slots__ = (
        "call_ids",
        "images",
        "last_finish",
        "log_probs",
        "loss_mask",
        "metadata",
        "missing_logprobs",
        "prompt_ends",
        "prompt_length",
        "routed",
        "routed_seen",
        "session_id",
        "sources",
        "tokens",
        "turns",
        "versions",
        "versions_known",
    )

    def __init__(self, session_id: str, prompt_ids: Sequence[int]) -> None:
        self.session_id = session_id
        self.tokens: list[int] = list(prompt_ids)
        self.prompt_length = len(self.tokens)
        self.loss_mask: list[int] = []
        self.log_probs: list[float] = []
        self.turns: list[Turn] = []
        self.call_ids: list[str] = []
        self.prompt_ends: set[int] = set()
        """Where each call's prompt ended (a later call with exactly that prompt is a fork)."""
        self.metadata: dict[str, Any] = {}
        self.last_finish: str | None = None
        self.missing_logprobs = False
        self.sources: set[TokenSource] = set()
        """Where the ids came from: ``server`` and/or ``retokenized``."""
        self.images: list[ImageRef] = []
        """The images of the last merged prompt (it contains every earlier one's)."""
        self.versions: list[policy.Span] = []
        """Version spans over the generated positions, in response coordinates."""
        self.versions_known = False
        self.routed: bytes | None = None
        """The last generation's routing, when it covers the sample's tokens exactly."""
        self.routed_seen = False

    def append_observation(self, ids: Sequence[int]) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.log_probs.extend([0.0] * len(ids))

    def append_generation(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float] | None,
        call_id: str,
        finish_reason: str | None = None,
        versions: Sequence[policy.Span] | None = None,
        routed: bytes | None = None,
    ) -> None:
        """``routed``: the call's routing, given only when its prompt + ``ids`` are exactly this
        sample's tokens afterwards (the merge knows: not after a realignment)."""
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"call {call_id}: {len(logprobs)} logprobs for {len(ids)} generated tokens")
        start = len(self.tokens) - self.prompt_length
        self.prompt_ends.add(len(self.tokens))
        self.tokens.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        if logprobs is None:
            self.missing_logprobs = True
            self.log_probs.extend([0.0] * len(ids))
        else:
            self.log_probs.extend(map(float, logprobs))
        self.turns.append(Turn(call_id, start, start + len(ids), finish_reason))
        self.routed = routed
        self.routed_seen = self.routed_seen or routed is not None
        if versions is None:
            own = [(policy.UNKNOWN, 0, len(ids))] if ids else []
        else:
            self.versions_known = True
            own = policy.slice_spans(versions, 0, len(ids))
            covered = own[-1][2] if own else 0
            if covered < len(ids):  # spans that stop short: the rest is not known
                own.append((policy.UNKNOWN, covered, len(ids)))
        for v, s, e in policy.shift(own, start):
            if self.versions and self.versions[-1][0] == v and self.versions[-1][2] == s:
                self.versions[-1] = (v, self.versions[-1][1], e)
            else:
                self.versions.append((v, s, e))
        self.call_ids.append(call_id)
        self.last_finish = finish_reason

    def extends(self, prompt_ids: Sequence[int]) -> bool:
        """Whether ``prompt_ids`` starts with this sample's full token list."""
        n = len(self.tokens)
        return len(prompt_ids) >= n and prompt_ids[:n] == self.tokens

    def build(self) -> Sample:
        response_length = len(self.tokens) - self.prompt_length
        assert len(self.loss_mask) == response_length == len(self.log_probs), (
            f"loss_mask length {len(self.loss_mask)} / log_probs {len(self.log_probs)} != response_length {response_length}"
        )
        return Sample(
            session_id=self.session_id,
            tokens=list(self.tokens),
            response_length=response_length,
            loss_mask=list(self.loss_mask),
            rollout_log_probs=list(self.log_probs),
            turns=list(self.turns),
            metadata=dict(self.metadata),
            images=list(self.images),
            policy_versions=list(self.versions) if self.versions_known else None,
            routed_experts=self.routed,
        )
