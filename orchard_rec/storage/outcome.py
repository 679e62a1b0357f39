"""How an outcome is changed: the one rule ``orchard-rec outcome`` and ``POST /sessions/{id}/outcome`` share.

- The fields given merge into what is stored: ``reward``, ``status`` and ``step_values``
  replace the stored value; ``metadata`` keys are added or replaced one by one, the other keys
  stay. ``--status completed`` after ``--metadata task=t1`` keeps ``task``.
- Clearing is explicit: ``--clear FIELD`` (``--clear metadata.KEY`` for one key, ``--clear
  all`` for everything) on the command line; ``null`` for a field (or for a metadata key) in the
  JSON body.
- A call that names nothing to change is an error (CLI exit 2, HTTP 400). Sending the stored
  values again is not: a grader may retry.
- Every number must be finite: ``nan`` and ``inf`` are refused in rewards and step values
  (JSON has no such numbers; a stored one would come back as ``null``).

Reading is forgiving where writing is strict: :func:`sanitize` turns a row stored by an older
version (``[1.0, null, 2.0]`` step values, a ``null`` named reward) into a usable outcome and
logs one warning naming the session, so one bad row never stops an export or the viewer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchard_rec.errors import UsageError
from orchard_rec.records import SESSION_STATUSES, Outcome

__all__ = [
    "FIELDS",
    "InvalidOutcome",
    "OutcomeChange",
    "as_json",
    "change_from_json",
    "check",
    "finite",
    "merge",
    "sanitize",
]

log = logging.getLogger(__name__)

FIELDS = ("reward", "status", "step_values", "metadata")


class InvalidOutcome(UsageError):
    """An outcome change that cannot be stored (HTTP 400, CLI exit 2)."""

    def __init__(self, message: str, *, param: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, param=param)
        self.hint = hint


def finite(value: Any, what: str) -> float:
    """``value`` as a float; :class:`InvalidOutcome` for a bool, a non-number, ``nan`` or ``inf``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidOutcome(f"{what} must be a number, got {value!r}", param=what.split("[")[0])
    f = float(value)
    if not math.isfinite(f):
        raise InvalidOutcome(f"{what} must be a finite number, got {value!r}", param=what.split("[")[0])
    return f


def _reward(value: Any) -> float | dict[str, float]:
    if isinstance(value, Mapping):
        if not value:
            raise InvalidOutcome("reward must name at least one reward (null clears it)", param="reward")
        return {str(k): _keep_int(v, f"reward[{k!r}]") for k, v in value.items()}
    return _keep_int(value, "reward")


def _keep_int(value: Any, what: str) -> Any:
    finite(value, what)
    return value


@dataclass(frozen=True)
class OutcomeChange:
    """What one call asks: the fields it sets (checked) and the ones it clears."""

    set: Mapping[str, Any] = field(default_factory=dict)
    """``reward``, ``status``, ``step_values`` (a tuple) and ``metadata`` (keys to add or replace)."""
    clear: frozenset[str] = frozenset()
    """Field names, or ``metadata.KEY`` for one metadata key."""

    def __post_init__(self) -> None:
        for name, value in self.set.items():
            if name not in FIELDS:
                raise InvalidOutcome(f"{name!r} is not an outcome field (one of: {', '.join(FIELDS)})")
            if name == "reward":
                _reward(value)
            elif name == "status" and value not in SESSION_STATUSES:
                raise InvalidOutcome(
                    f"status must be one of {', '.join(SESSION_STATUSES)}, got {value!r}", param="status"
                )
            elif name == "step_values":
                if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                    raise InvalidOutcome("step_values must be a list of numbers", param="step_values")
                for i, v in enumerate(value):
                    finite(v, f"step_values[{i}]")
            elif name == "metadata" and not isinstance(value, Mapping):
                raise InvalidOutcome("metadata must be an object", param="metadata")
        for name in self.clear:
            if name not in (*FIELDS, "all") and not (
                name.startswith("metadata.") and len(name) > len("metadata.")
            ):
                raise InvalidOutcome(
                    f"cannot clear {name!r}: name a field ({', '.join(FIELDS)}), metadata.KEY, or all"
                )
        both = set(self.set) & self.clear
        if both:
            raise InvalidOutcome(f"{', '.join(sorted(both))} is both set and cleared: give one")
        if not self.set and not self.clear:
            raise InvalidOutcome(
                "nothing to change: give a reward, status, step values or metadata, or clear one"
            )


def change_from_json(body: Mapping[str, Any]) -> OutcomeChange:
    """The HTTP body: a field present sets it, ``null`` clears it; in ``metadata``, a key whose
    value is ``null`` is removed. ``create`` (a control flag) is not a field."""
    unknown = sorted(set(body) - {*FIELDS, "create"})
    if unknown:
        raise InvalidOutcome(
            f"unknown outcome field(s) {', '.join(map(repr, unknown))}: one of {', '.join(FIELDS)}",
            param=unknown[0],
        )
    sets: dict[str, Any] = {}
    clear: set[str] = set()
    for name in FIELDS:
        if name not in body:
            continue
        value = body[name]
        if value is None:
            clear.add(name)
        elif name == "metadata" and isinstance(value, Mapping):
            kept = {k: v for k, v in value.items() if v is not None}
            clear.update(f"metadata.{k}" for k, v in value.items() if v is None)
            if kept:
                sets["metadata"] = kept
        elif name == "step_values" and isinstance(value, list):
            sets[name] = tuple(value)
        else:
            sets[name] = value
    return OutcomeChange(sets, frozenset(clear))


def merge(stored: Outcome | None, change: OutcomeChange) -> Outcome:
    """``stored`` with ``change`` applied (module docstring)."""
    base = stored or Outcome()
    if "all" in change.clear:
        base = Outcome()
    reward = None if "reward" in change.clear else base.reward
    status = None if "status" in change.clear else base.status
    steps = None if "step_values" in change.clear else base.step_values
    meta = {} if "metadata" in change.clear else dict(base.metadata)
    for name in change.clear:
        if name.startswith("metadata."):
            meta.pop(name[len("metadata.") :], None)
    s = change.set
    if "reward" in s:
        reward = _reward(s["reward"])
    if "status" in s:
        status = s["status"]
    if "step_values" in s:
        steps = tuple(float(v) for v in s["step_values"])
    meta.update(s.get("metadata") or {})
    return Outcome(reward=reward, status=status, step_values=steps, metadata=meta)


def check(outcome: Outcome) -> None:
    """Refuse an outcome that could not be read back as written (a whole outcome, ``set_outcome``)."""
    if outcome.reward is not None:
        _reward(outcome.reward)
    for i, v in enumerate(outcome.step_values or ()):
        finite(v, f"step_values[{i}]")
    if outcome.status is not None and outcome.status not in SESSION_STATUSES:
        raise InvalidOutcome(f"status must be one of {', '.join(SESSION_STATUSES)}, got {outcome.status!r}")


_warned: set[str] = set()


def sanitize(session_id: str, reward: Any, steps: Any, metadata: Any) -> tuple[Any, Any, dict[str, Any]]:
    """A stored outcome's columns made safe to read (module docstring): ``(reward, step_values, metadata)``."""
    bad: list[str] = []
    if reward is not None:
        if isinstance(reward, Mapping):
            good = {k: v for k, v in reward.items() if _is_finite(v)}
            if len(good) != len(reward):
                bad.append(f"reward {dict(reward)!r}")
                reward = good or None
        elif not _is_finite(reward):
            bad.append(f"reward {reward!r}")
            reward = None
    if steps is not None:
        if not isinstance(steps, list) or not all(_is_finite(v) for v in steps):
            bad.append(f"step_values {steps!r}"[:120])
            steps = None
        else:
            steps = tuple(float(v) for v in steps)
    if metadata is not None and not isinstance(metadata, Mapping):
        bad.append(f"metadata {metadata!r}"[:120])
        metadata = None
    if bad and session_id not in _warned:
        _warned.add(session_id)
        log.warning(
            "session %r has a stored outcome with %s (not finite numbers): read as missing;"
            " set it again with `orchard-rec outcome %s`",
            session_id,
            " and ".join(bad),
            session_id,
        )
    return reward, steps, dict(metadata or {})


def _is_finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def as_json(outcome: Outcome) -> dict[str, Any]:
    """An outcome as the HTTP route answers it and ``outcome`` prints it."""
    return {
        "reward": dict(outcome.reward) if isinstance(outcome.reward, Mapping) else outcome.reward,
        "status": outcome.status,
        "step_values": None if outcome.step_values is None else list(outcome.step_values),
        "metadata": dict(outcome.metadata),
    }
