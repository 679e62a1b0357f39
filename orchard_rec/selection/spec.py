"""``Selection``: what one run of samples takes from the database, as one frozen value.

Every reader of samples (``export`` and the other CLI commands, the dataset writers and the
Ray engine, the slime rollout plug-in, the viewer) builds one ``Selection`` and hands it on
unchanged to ``pipeline.iter_samples``: the sessions, how their calls become samples, how
sessions are grouped and groups chosen, and which samples are kept. What is not a choice of
samples stays out: the tokenizer, the teacher look-up, callbacks and the counters a run
fills in (``iter_samples``' keywords).

A ``Selection`` checks itself when built (the errors name the CLI option, as every caller's
options map one to one onto its fields); sequences (lists are accepted) are stored as tuples,
so a selection is hashable and safe to share with a worker process (``exporters.ray_engine``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchard_rec.errors import UsageError
from orchard_rec.policy import Staleness
from orchard_rec.reconstruct import CreditPolicy, MismatchPolicy
from orchard_rec.selection.bar import BarSpec
from orchard_rec.selection.staleness import StaleMode

__all__ = ["Selection"]


def _tuple(v: Sequence[Any] | None) -> tuple[Any, ...] | None:
    return None if v is None else tuple(v)


@dataclass(frozen=True)
class Selection:
    """The samples one run reads: sessions → calls → samples → groups → kept samples.

    The fields are ``iter_samples``' selection keywords (``Selection.of(**kw)`` builds one
    from them), grouped by the stage that reads them."""

    # -- which sessions (the store's query) --
    sessions: Sequence[str] | None = None
    """Only these session ids (``--session``); None or empty: every session."""
    since: float | None = None
    """Only sessions active since this UNIX time (``--since``)."""
    harness: str | None = None
    """Only sessions of this harness (``--harness``)."""

    # -- how a session's calls become samples (reconstruction) --
    on_mismatch: MismatchPolicy | str = MismatchPolicy.SPLIT
    """A prompt that does not extend its session's tokens: ``split`` into a new sample or ``realign``."""
    credit: CreditPolicy | str | None = None
    """The loss-mask policy, by name or object (``--credit``); None: ``assistant``."""
    aborted: Literal["drop", "keep"] = "drop"
    """Generations the server aborted for a weight update: ``drop`` or ``keep`` (``--aborted``)."""
    image_token: int | None = None
    """A VLM's image placeholder id (default: the tokenizer's); samples then carry ``image_spans``."""

    # -- groups (GRPO-style) and the choice among a group's attempts --
    group_by: str | None = None
    """Outcome metadata key whose value groups sessions, or ``session`` (``--group-by``)."""
    pass_rate: tuple[float, float] | None = None
    """Keep groups whose fraction of passing sessions lies in ``[lo, hi]`` (``--pass-rate``)."""
    pass_threshold: float = 0.0
    """A session passes when its reward is above this."""
    select: BarSpec | None = None
    """Balanced Adaptive Rollout: ``(N, lo, hi[, stride])`` attempts per group (``--select``)."""
    filters: Sequence[str] | None = None
    """slime's dynamic-sampling filters by name, in order (``--filter``)."""
    seed: int | None = None
    """Seed of ``select``'s tie order and the ``pass-rate`` filter's draws (``--seed``)."""

    # -- which samples are kept, and what they carry --
    statuses: Sequence[str] | None = None
    """Keep samples with these statuses (``--status``); None or empty: all."""
    min_reward: float | None = None
    """Keep samples whose scalar reward is at least this (``--min-reward``)."""
    reward_key: str | None = None
    """The reward samples carry: ``process``, a named reward or an outcome metadata number (``--reward-key``)."""
    auxiliary: bool | None = None
    """Keep samples of harnesses' side conversations (``--auxiliary``); None: the reader's default
    (``iter_samples``: keep; ``export``: the format's)."""
    require_teacher: bool = False
    """Drop samples without stored teacher log-probs (``--require-teacher``)."""
    staleness: Staleness | None = None
    """The policy-version floor (``--policy-version/--max-staleness/--min-policy-version``)."""
    stale: StaleMode = "drop"
    """Samples holding stale tokens: ``drop`` them or ``mask`` those tokens (``--stale``)."""

    def __post_init__(self) -> None:
        for name in ("sessions", "filters", "statuses", "pass_rate", "select"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, _tuple(value))
        if self.staleness is not None and self.staleness.floor is None:
            object.__setattr__(self, "staleness", None)  # no bound given: nothing is stale
        if self.aborted not in ("drop", "keep"):
            raise UsageError(f"--aborted is keep or drop (got {self.aborted!r})")
        if self.stale not in ("drop", "mask"):
            raise UsageError(f"--stale is drop or mask (got {self.stale!r})")
        if self.pass_rate is not None and self.group_by is None:
            raise UsageError("--pass-rate needs --group-by (a pass rate is a property of a group)")
        if (self.select is not None or self.filters) and self.group_by is None:
            raise UsageError("--select and --filter need --group-by (they choose within a task's attempts)")

    @classmethod
    def of(cls, selection: Selection | None = None, **options: Any) -> Selection:
        """``selection`` (default: everything) with ``options`` (field names) replaced; an unknown
        option is a ``TypeError``, as an unknown keyword is."""
        base = selection if selection is not None else cls()
        return dataclasses.replace(base, **options) if options else base

    @classmethod
    def take(cls, selection: Selection | None, options: dict[str, Any]) -> tuple[Selection, dict[str, Any]]:
        """``options`` split: those that are fields of a selection, applied to ``selection``
        (``of``), and the rest (``iter_samples``' other keywords), returned as they are."""
        names = _FIELDS
        return (
            cls.of(selection, **{k: v for k, v in options.items() if k in names}),
            {k: v for k, v in options.items() if k not in names},
        )

    def replace(self, **changes: Any) -> Selection:
        """A copy with ``changes`` (field names), checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def grouped(self) -> bool:
        return self.group_by is not None

    @property
    def chooses(self) -> bool:
        """Whether groups are chosen among by ``select`` or ``filters`` (whole groups reconstructed first)."""
        return self.select is not None or bool(self.filters)

    def recorded(self) -> dict[str, Any]:
        """The fields that are set (not None), JSON-safe: what a dataset's manifest records."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, enum.Enum):
                v = v.value
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, Staleness):
                v = {"current": v.current, "max_staleness": v.max_staleness, "minimum": v.minimum}
            elif not isinstance(v, (str, int, float, bool)):
                v = getattr(v, "name", str(v))  # a credit policy object
            out[f.name] = v
        return out


_FIELDS = frozenset(f.name for f in dataclasses.fields(Selection))
