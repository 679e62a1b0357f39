"""The trainers' data contracts, in one place: slime's ``Sample`` and verl's ``AgentLoopOutput``.

Pure data and row builders, importable without slime, verl, torch or pyarrow: exporters
write these rows to files, ``trainers/`` hands them to the trainers in process.

slime: field names, defaults and ``Status`` values of ``slime/utils/types.py`` in THUDM/slime
(read at commit 0d234f3e3a83c81b7d37209994e0b994deacbb24), plus ``teacher_valid_mask`` of
Orchard's fork (MSR-Orchard/slime ``slime/utils/types.py``: ``teacher_log_probs`` as its
on-policy distillation sets it, ``teacher_valid_mask`` 1 where the log-prob is valid;
upstream slime keeps an unknown key as an attribute). ``remove_sample`` is set for
samples a ``positive-only`` filter kept only for the group baseline. ``group_id`` is Orchard's
fork's id of the rollout a sample belongs to (its loss aggregates siblings of one run: per-turn
samples, compaction, sub-agents); every sample of a session gets the same one (the export index
of the session's first sample). Images: ``multimodal_inputs = {"images": [PIL.Image, ...]}``
(RGB, in prompt order), as Orchard's GUI generator (``examples/orchard_gui/generate_browser.py``)
and slime's own VLM rollout build it; ``multimodal_train_inputs`` (``pixel_values``,
``image_grid_thw``) is the model processor's output over those images, which the ``slime``
exporter adds (the fork's ``--load-debug-rollout-data`` path computes nothing: without it the
images are never shown to the model). ``slime_contract_errors`` checks rows against what the
fork's loader requires. slime's ``Sample.to_dict`` is
``self.__dict__`` with ``status`` as its value and the two info objects as dicts;
``Sample.from_dict`` takes exactly those keys. ``to_slime_dict`` builds that dict from an
orchard sample, every other field at slime's default, no key slime does not know
(``from_dict`` would set unknown keys as stray attributes), and only plain Python values and
PIL images (a ``.pt`` file must load where orchard-rec is not installed). ``SlimeSample`` is a
field-compatible stand-in for when slime is not importable; ``slime_sample_class()`` gives
slime's own class when it is.

verl: ``AgentLoopOutput`` of ``verl/experimental/agent_loop/agent_loop.py``: ``prompt_ids``,
``response_ids`` (model tokens and tool/observation tokens), ``response_mask`` (1 model-generated
and credited, 0 observation), ``response_logprobs``, ``reward_score``, ``num_turns`` (user +
assistant + tool turns), ``metrics`` (``AgentLoopMetrics``: ``generate_sequences``,
``tool_calls``) and ``extra_fields`` (free-form; ours: session, index, group, status, call
ids, token source, the reward as JSON), and ``multi_modal_data = {"images": [PIL.Image, ...]}``
for a sample with images (verl's agent loop hands those to its processor,
``AgentLoopWorker._compute_multi_modal_inputs``), else None. ``agent_loop_fields`` is the one builder of that row,
for the ``verl`` export and ``trainers.verl`` alike.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from orchard_rec import routing
from orchard_rec.exporters.images import pil_images
from orchard_rec.reconstruct import Sample, TeacherData, Turn, numeric_reward

__all__ = [
    "AGENT_LOOP_FIELDS",
    "SLIME_FIELDS",
    "SLIME_STATUSES",
    "SlimeSample",
    "agent_loop_fields",
    "slime_contract_errors",
    "slime_runs",
    "slime_sample_class",
    "split_turns",
    "to_slime_dict",
]

# -- slime ---------------------------------------------------------------------------------------------------------

SLIME_STATUSES = ("pending", "completed", "truncated", "aborted", "failed")


def _slime_defaults() -> dict[str, Any]:
    return {
        "group_index": None,
        "index": None,
        "group_id": None,
        "prompt": "",
        "tokens": [],
        "multimodal_inputs": None,
        "multimodal_train_inputs": None,
        "response": "",
        "response_length": 0,
        "label": None,
        "reward": None,
        "loss_mask": None,
        "weight_versions": [],
        "rollout_log_probs": None,
        "rollout_routed_experts": None,
        "remove_sample": False,
        "teacher_log_probs": None,
        "mopd_teacher_log_probs": None,
        "teacher_valid_mask": None,
        "status": "pending",
        "metadata": {},
        "generate_function_path": None,
        "train_metadata": None,
        "session_id": None,
        "non_generation_time": 0.0,
        "spec_info": {
            "spec_accept_token_num": 0,
            "spec_draft_token_num": 0,
            "spec_verify_ct": 0,
            "completion_token_num": 0,
        },
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }


SLIME_FIELDS = tuple(_slime_defaults())


def to_slime_dict(
    s: Sample,
    *,
    prompt: Any = "",
    response: str = "",
    group_id: int | None = None,
    teacher_fill: bool = False,
) -> dict[str, Any]:
    """The dict slime's ``Sample.from_dict`` takes, for one orchard sample (``group_id``: its run's id).

    ``metadata``: the session outcome's metadata (``exit_status``, gold fields: what the fork's
    recipes read from ``sample.metadata``) under the sample's own keys. ``group_index``: the
    sample's group, else its run (vanilla slime groups by it; the fork by ``group_id``).
    ``teacher_fill``: a sample without teacher data gets zero log-probs under an all-zero
    ``teacher_valid_mask``, as the fork's SWE post-processing fills a sample the teacher missed
    (``examples/orchard_swe/swe_opd_reward.py`` ``post_process_rewards``)."""
    d = _slime_defaults()
    meta = s.to_dict()["metadata"]
    if s.outcome is not None and s.outcome.metadata:
        meta = {**orjson.loads(orjson.dumps(dict(s.outcome.metadata), default=str)), **meta}
    status = str(s.status)
    d.update(
        group_index=s.group_index if s.group_index is not None else group_id,
        index=s.index,
        prompt=prompt,
        tokens=list(s.tokens),
        response=response,
        response_length=s.response_length,
        reward=s.reward,
        loss_mask=list(s.loss_mask),
        rollout_log_probs=list(s.rollout_log_probs),
        status=status if status in SLIME_STATUSES else "failed",
        metadata=meta,
        session_id=s.session_id,
        group_id=group_id,
    )
    if s.images:
        d["multimodal_inputs"] = {"images": pil_images(s)}
    d["prefix_cache_info"]["total_prompt_tokens"] = s.prompt_length
    if s.token_weights is not None:
        d["train_metadata"] = {"token_weights": list(s.token_weights)}
    if meta.get("remove_sample"):
        d["remove_sample"] = True
    if s.teacher is not None:
        d["teacher_log_probs"] = list(s.teacher.log_probs)
        d["teacher_valid_mask"] = list(s.teacher.valid_mask)
    elif teacher_fill:
        d["teacher_log_probs"] = [0.0] * s.response_length
        d["teacher_valid_mask"] = [0] * s.response_length
    if s.routed_experts is not None:  # R3: over tokens[:-1], as slime's rollout sets it
        d["rollout_routed_experts"] = _slime_routing(s.routed_experts)
    if s.policy_versions is not None:  # slime appends one version per generate call; spans per token
        d["weight_versions"] = s.weight_versions()
        meta["policy_versions"] = [[v, a, b] for v, a, b in s.policy_versions]
    return d


def _slime_routing(blob: bytes) -> Any:
    """slime's ``rollout_routed_experts``: an int32 array (len(tokens) - 1, num_layers, topk), as
    its rollout decodes vLLM's answer (slime/rollout/*: ``np.load(...).astype(np.int32)``, then
    ``reshape(len(sample.tokens) - 1, args.num_layers, args.moe_router_topk)``); nested lists
    where numpy is missing."""
    r = routing.unpack(blob)
    try:
        import numpy as np
    except ImportError:
        return r.to_lists()
    dtype = {1: "<u1", 2: "<u2", 4: "<u4"}[r.width]
    return np.frombuffer(r.data, dtype=dtype).astype(np.int32).reshape(r.rows, r.layers, r.topk)


def slime_runs(samples: Iterable[Sample]) -> Iterator[tuple[Sample, int]]:
    """Each sample with its run's ``group_id`` (the index of its session's first sample), in order.

    A session whose first sample shows images is laid out as Orchard's GUI generator writes a
    trajectory (``examples/orchard_gui/generate_browser.py``): held until its last sample, then
    one sample per turn (a merged sample is split at its turns; an observation between two turns
    becomes the next turn's prompt), each with ``metadata.turn_index`` = the turn's step in the
    session, ``is_last_turn``, ``num_turns_in_trajectory`` = the session's turn samples (for
    ``--turn-level-loss-equal-turn-weight``) and the trajectory's final status.
    """
    session: str | None = None
    run = 0
    held: list[Sample] = []
    for s in samples:
        if s.session_id != session:
            yield from _turns(held, run)
            held = []
            session, run = s.session_id, s.index
            if s.images:
                held.append(s)
                continue
        if held:
            held.append(s)
        else:
            yield s, run
    yield from _turns(held, run)


def _turns(held: list[Sample], run: int) -> Iterator[tuple[Sample, int]]:
    turns = [t for s in held for t in split_turns(s)]
    for k, s in enumerate(turns):
        steps = s.metadata.get("turn_steps") or [k]
        s.metadata["turn_index"] = steps[0]
        s.metadata["is_last_turn"] = k == len(turns) - 1
        s.metadata["num_turns_in_trajectory"] = len(turns)
        s.status = turns[-1].status
    for s in turns:
        yield s, run


def split_turns(s: Sample) -> list[Sample]:
    """One sample per generation turn of ``s``: the tokens up to the turn's end, the turn as the
    response, and the images shown before it. Unsplit when its images cannot be placed (no
    ``metadata.image_spans`` matching them)."""
    spans = s.metadata.get("image_spans")
    if len(s.turns) <= 1 or (s.images and (spans is None or len(spans) != len(s.images))):
        return [s]
    steps = s.metadata.get("turn_steps") or list(range(len(s.turns)))
    out = []
    for k, t in enumerate(s.turns):
        start = s.prompt_length + t.start
        n_img = sum(1 for _a, b in spans or () if b <= start)
        meta = {**s.metadata, "call_ids": [t.call_id], "turn_steps": [steps[k]]}
        if spans is not None:
            meta["image_spans"] = [list(x) for x in spans[:n_img]]
        teacher = s.teacher
        if teacher is not None:
            teacher = TeacherData(
                teacher.log_probs[t.start : t.end],
                teacher.valid_mask[t.start : t.end],
                teacher.name,
                None if teacher.topk_ids is None else teacher.topk_ids[t.start : t.end],
                None if teacher.topk_logprobs is None else teacher.topk_logprobs[t.start : t.end],
            )
        out.append(
            replace(
                s,
                tokens=s.tokens[: s.prompt_length + t.end],
                response_length=t.end - t.start,
                loss_mask=s.loss_mask[t.start : t.end],
                rollout_log_probs=s.rollout_log_probs[t.start : t.end],
                turns=[Turn(t.call_id, 0, t.end - t.start, t.finish_reason)],
                token_weights=None if s.token_weights is None else s.token_weights[t.start : t.end],
                teacher=teacher,
                images=s.images[:n_img],
                metadata=meta,
            )
        )
    return out


def slime_contract_errors(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What Orchard's fork would fail on when it loads these ``Sample.to_dict`` rows as one rollout
    (``--load-debug-rollout-data``), read from MSR-Orchard/slime at 331efaa:

    - ``slime/utils/types.py`` ``Sample.from_dict``: ``status`` one of ``Status``'s values.
    - ``slime/ray/rollout.py`` ``_convert_samples_to_train_data``: ``len(loss_mask) ==
      response_length``; ``rollout_log_probs``, ``train_metadata`` and ``teacher_log_probs``
      are taken for the whole rollout when the first sample has them (``samples[0].X is not
      None``), so all samples or none; ``multimodal_train_inputs`` is taken when any sample has
      it, and the actor moves each value to the device (``v.to(device)``): tensors.
    - the fork's OPD training reads ``rollout_data["teacher_log_probs"]`` per sample as a tensor
      with ``teacher_valid_mask`` of the same length (``swe_opd_reward.post_process_rewards``).
    - images without ``multimodal_train_inputs`` are never shown to the model (the forward adds
      only ``multimodal_train_inputs``): a sample with images must carry them.
    """
    errors: list[str] = []
    if not rows:
        return errors
    for k, d in enumerate(rows):
        where = f"sample {k}"
        if d.get("status") not in SLIME_STATUSES:
            errors.append(f"{where}: status {d.get('status')!r} is not a Sample.Status value")
        if d.get("loss_mask") is not None and len(d["loss_mask"]) != d["response_length"]:
            errors.append(
                f"{where}: loss mask length {len(d['loss_mask'])} != response length {d['response_length']}"
            )
        images = (d.get("multimodal_inputs") or {}).get("images")
        mti = d.get("multimodal_train_inputs")
        if images and not mti:
            errors.append(f"{where}: images without multimodal_train_inputs (the model never sees them)")
        for key, v in (mti or {}).items():
            if not hasattr(v, "to"):
                errors.append(f"{where}: multimodal_train_inputs[{key!r}] is not a tensor")
        t = d.get("teacher_log_probs")
        if t is not None and (d.get("teacher_valid_mask") is None or len(t) != len(d["teacher_valid_mask"])):
            errors.append(f"{where}: teacher_log_probs without a teacher_valid_mask of its length")
        if t is not None and len(t) != d["response_length"]:
            errors.append(f"{where}: {len(t)} teacher log-probs for a response of {d['response_length']}")
    for key in ("rollout_log_probs", "train_metadata", "teacher_log_probs"):
        have = [d.get(key) is not None for d in rows]
        if any(have) and not all(have):
            errors.append(
                f"{key}: set on {sum(have)} of {len(have)} samples (the fork takes it for all or none, by the first)"
            )
    return errors


@dataclass
class SlimeSample:
    """Stand-in for ``slime.utils.types.Sample`` (same fields, same dict round trip)."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    group_id: int | None = None
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: Any = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: Any = None
    mopd_teacher_log_probs: dict[str, list[float]] | None = None
    teacher_valid_mask: list[int] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: dict[str, Any] = field(default_factory=lambda: dict(_slime_defaults()["spec_info"]))
    prefix_cache_info: dict[str, Any] = field(
        default_factory=lambda: dict(_slime_defaults()["prefix_cache_info"])
    )

    def to_dict(self) -> dict[str, Any]:
        value = dict(self.__dict__)
        value["status"] = self.status.value
        return value

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SlimeSample:
        data = dict(data)
        unknown = set(data) - set(SLIME_FIELDS)
        if unknown:
            raise ValueError(f"keys slime's Sample does not know: {sorted(unknown)}")
        data["status"] = SlimeSample.Status(data["status"])
        return SlimeSample(**data)


def slime_sample_class() -> Any:
    """slime's ``Sample`` when slime is importable, else the stand-in."""
    try:
        from slime.utils.types import Sample as SlimeNative
    except ImportError:
        return SlimeSample
    return SlimeNative


# -- verl ----------------------------------------------------------------------------------------------------------

AGENT_LOOP_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
    "multi_modal_data",
)
"""The ``AgentLoopOutput`` fields we fill (``routed_experts`` stays at verl's None)."""


def agent_loop_fields(s: Sample, *, multi_modal: bool = True) -> dict[str, Any]:
    """``AgentLoopOutput(**agent_loop_fields(s))`` validates; also the ``verl`` export's row
    (which writes the images as its ``images`` column: ``multi_modal=False``)."""
    return {
        "prompt_ids": s.prompt_ids,
        "response_ids": s.response_ids,
        "response_mask": list(s.loss_mask),
        "response_logprobs": list(s.rollout_log_probs),
        "reward_score": numeric_reward(s.reward),
        "num_turns": 2 * len(s.turns),
        "metrics": {"generate_sequences": 0.0, "tool_calls": 0.0},
        "extra_fields": {
            "session_id": s.session_id,
            "index": s.index,
            "group_index": s.group_index,
            "status": str(s.status),
            "call_ids": list(s.metadata.get("call_ids", [])),
            "token_source": s.metadata.get("token_source"),
            "reward_json": None if s.reward is None else orjson.dumps(s.reward).decode(),
            # the version that sampled each response token (None on observations), for off-policy correction
            "policy_versions": s.versions_per_token(),
        },
        "multi_modal_data": {"images": pil_images(s)} if multi_modal and s.images else None,
    }
