"""Orchard-SWE's rule-based process reward (``process_shaped``), over any harness's steps.

    R = (1.0·resolved + 0.5·f2p + 0.4·localization + 0.3·anchored_flip
         + 0.1·read_before_edit + 0.2·p2p − 0.05·extra_files − 0.05·no_progress
         − 0.03·error_rate) × integrity_gate × 10

Gold fields come from the outcome's metadata: ``patch``, ``test_patch``,
``FAIL_TO_PASS``, ``PASS_TO_PASS`` (lists, or JSON strings as SWE-bench stores them),
``resolved``, and the grader's ``f2p_rate`` / ``p2p_rate`` when it reports them.

- resolved: ``resolved`` is true.
- f2p / p2p: the grader's rate when given; else 1 for a resolved run; else from the
  trajectory's own test output: the share of FAIL_TO_PASS tests last seen passing /
  of PASS_TO_PASS tests not last seen failing (0 without a list).
- localization: share of the gold patch's non-test files that the agent's edits touch.
- read_before_edit: 1 when a gold file was read before the first edit.
- anchored_flip: a test seen failing then passing: 1 if it is in FAIL_TO_PASS, else 0.5.
- extra_files: share of the edited non-test files that are outside the gold patch.
- no_progress: share of shell commands that exactly repeat an earlier one.
- error_rate: share of steps whose result failed (non-zero exit code or an error flag).
- integrity_gate: 0 when the agent edits tests or conftest, adds skip / xfail /
  ``assert True``, or runs ``rm -rf`` / ``git reset --hard``-like commands; else 1.

Per-step values: each term's weighted contribution at the step that earned it (the first
edit of each gold or extra file, the read, the flip, each repeat, each failure; the
outcome terms at the last step), so they sum to R; under a closed gate every value is 0.
Test results are read from pytest (``-v`` lines and ``-rA`` summaries) and Django runner
output in tool results.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from orchard_rec.rewards.base import RewardResult, register
from orchard_rec.steps import Step
from orchard_rec.steps.tools import patch_files

__all__ = ["SWE_WEIGHTS", "SweProcessReward", "is_test_path", "observed_tests"]

SWE_WEIGHTS: dict[str, float] = {
    "resolved": 1.0,
    "f2p": 0.5,
    "localization": 0.4,
    "anchored_flip": 0.3,
    "read_before_edit": 0.1,
    "p2p": 0.2,
    "extra_files": -0.05,
    "no_progress": -0.05,
    "error_rate": -0.03,
}
SCALE = 10.0

_PYTEST_V = re.compile(r"^(\S+::\S+?)\s+(PASSED|FAILED|ERROR)\b", re.M)
_PYTEST_RA = re.compile(r"^(PASSED|FAILED|ERROR)\s+(\S+::\S+?)(?:\s+-\s.*)?$", re.M)
_DJANGO = re.compile(r"^(\w+) \(([\w.]+)\)(?:\s*\n?.*?)?\s*\.\.\.\s*(ok|FAIL|ERROR)\s*$", re.M)
_SKIP = re.compile(
    r"pytest\.mark\.(?:skip|skipif|xfail)|pytest\.(?:skip|xfail)\(|unittest\.skip|@skip\w*\b|\bassert\s+True\b"
)
_DESTRUCTIVE = re.compile(
    r"\brm\s+-\w*(?:r\w*f|f\w*r)\w*\b|\brm\s+-\w*[rf]\w*\s+-\w*[rf]|\bgit\s+reset\s+--hard\b"
    r"|\bgit\s+clean\s+-\w*f|\bgit\s+checkout\s+(?:\S+\s+)?--\s+\.(?:\s|$)|\bgit\s+checkout\s+\.(?:\s|$)"
    r"|\bgit\s+restore\s+(?:--\S+\s+)*\.(?:\s|$)"
)


def observed_tests(text: str) -> list[tuple[str, bool]]:
    """``(test id, passed)`` in the order a test runner printed them."""
    found: list[tuple[int, str, bool]] = []
    for m in _PYTEST_V.finditer(text):
        found.append((m.start(), m.group(1), m.group(2) == "PASSED"))
    for m in _PYTEST_RA.finditer(text):
        found.append((m.start(), m.group(2), m.group(1) == "PASSED"))
    for m in _DJANGO.finditer(text):
        found.append((m.start(), f"{m.group(1)} ({m.group(2)})", m.group(3) == "ok"))
    found.sort(key=lambda t: t[0])
    return [(tid, ok) for _pos, tid, ok in found]


def is_test_path(path: str) -> bool:
    p = _norm(path)
    name = p.rsplit("/", 1)[-1]
    parts = p.split("/")[:-1]
    return (
        name == "conftest.py"
        or name.startswith("test_")
        or name.endswith(("_test.py", "_tests.py"))
        or any(d in ("test", "tests", "testing") for d in parts)
    )


def _norm(path: str) -> str:
    p = path.strip().replace("\\", "/")
    while p.startswith("./"):
        p = p[2:]
    if p.startswith(("a/", "b/")):
        p = p[2:]
    return p


def _same_file(agent: str, gold: str) -> bool:
    a, g = _norm(agent), _norm(gold)
    return a == g or a.endswith("/" + g)


def _same_test(seen: str, gold: str) -> bool:
    return seen == gold or seen.endswith("/" + gold) or gold.endswith("/" + seen)


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        try:
            v = orjson.loads(v)
        except orjson.JSONDecodeError:
            return [v] if v else []
    return [str(x) for x in v] if isinstance(v, (list, tuple)) else []


def _added_text(step: Step) -> str:
    """What an edit step adds: a patch's ``+`` lines, an edit's new text, a shell command."""
    a = step.arguments
    if step.kind == "shell":
        return step.command or ""
    if isinstance(a, str):
        text = a
    elif isinstance(a, dict):
        pieces = [
            a.get(k)
            for k in (
                "new_string",
                "new_str",
                "newText",
                "new_text",
                "content",
                "file_text",
                "text",
                "input",
                "patch",
                "new",
            )
        ]
        for e in a.get("edits") or ():
            if isinstance(e, dict):
                pieces.append(e.get("new_string"))
        text = "\n".join(p for p in pieces if isinstance(p, str))
    else:
        return ""
    if "*** Begin Patch" in text or text.startswith(("diff --git", "--- ")):
        return "\n".join(
            ln[1:] for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")
        )
    return text


def _first(it: Iterable[int]) -> int | None:
    return next(iter(it), None)


@register
class SweProcessReward:
    """``process_shaped``: weights overridable (``SweProcessReward(weights={"f2p": 0.6})``)."""

    name = "swe"
    gold_fields = ("patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "resolved", "f2p_rate", "p2p_rate")
    """The outcome metadata a grader writes; a session with none of them is not scored (its
    reward would be made up from the trajectory alone)."""

    def __init__(self, weights: Mapping[str, float] | None = None, scale: float = SCALE) -> None:
        unknown = set(weights or ()) - set(SWE_WEIGHTS)
        if unknown:
            raise ValueError(f"unknown reward term(s) {sorted(unknown)}; terms: {', '.join(SWE_WEIGHTS)}")
        self.weights = {**SWE_WEIGHTS, **(weights or {})}
        self.scale = scale

    def score(self, steps: Sequence[Step], gold: Mapping[str, Any], n_turns: int) -> RewardResult:
        w = self.weights
        n = len(steps)
        contrib = [0.0] * n
        notes: list[str] = []
        gold_files = [f for f in patch_files(str(gold.get("patch") or "")) if not is_test_path(f)]
        f2p_ids = _as_list(gold.get("FAIL_TO_PASS"))
        p2p_ids = _as_list(gold.get("PASS_TO_PASS"))
        resolved = 1.0 if gold.get("resolved") in (True, 1, "true", "True") else 0.0

        # localization and extra files: at the first edit of each file
        edited_nontest: list[str] = []
        touched_gold: set[str] = set()
        first_edit: int | None = None
        edit_at: dict[str, int] = {}
        for s in steps:
            if s.edits and first_edit is None:
                first_edit = s.index
            for f in s.edits:
                if is_test_path(f):
                    continue
                key = _norm(f)
                if key not in edit_at:
                    edit_at[key] = s.index
                    edited_nontest.append(f)
        for g in gold_files:
            hit = _first(edit_at[k] for k in edit_at if _same_file(k, g))
            if hit is not None:
                touched_gold.add(g)
                contrib[hit] += w["localization"] / len(gold_files)
        localization = len(touched_gold) / len(gold_files) if gold_files else 0.0
        extra = [f for f in edited_nontest if not any(_same_file(f, g) for g in gold_files)]
        extra_files = len(extra) / len(edited_nontest) if edited_nontest else 0.0
        for f in extra:
            contrib[edit_at[_norm(f)]] += w["extra_files"] / len(edited_nontest)

        # read before the first edit
        read_step = None
        if first_edit is not None:
            read_step = _first(
                s.index
                for s in steps
                if s.index < first_edit and any(_same_file(r, g) for r in s.reads for g in gold_files)
            )
        read_before_edit = 1.0 if read_step is not None else 0.0
        if read_step is not None:
            contrib[read_step] += w["read_before_edit"]

        # test results through the run: anchored flips and last observations
        last: dict[str, bool] = {}
        failed_once: set[str] = set()
        flip_value, flip_step = 0.0, None
        for s in steps:
            for tid, ok in observed_tests(s.output or ""):
                if ok and tid in failed_once:
                    v = 1.0 if any(_same_test(tid, g) for g in f2p_ids) else 0.5
                    if v > flip_value:
                        flip_value, flip_step = v, s.index
                if not ok:
                    failed_once.add(tid)
                last[tid] = ok
        if flip_step is not None:
            contrib[flip_step] += w["anchored_flip"] * flip_value

        def last_seen(gid: str) -> bool | None:
            hits = [ok for tid, ok in last.items() if _same_test(tid, gid)]
            return None if not hits else all(hits)

        if gold.get("f2p_rate") is not None:
            f2p = float(gold["f2p_rate"])
        elif resolved:
            f2p = 1.0
        elif f2p_ids:
            f2p = sum(1 for g in f2p_ids if last_seen(g) is True) / len(f2p_ids)
        else:
            f2p = 0.0
        if gold.get("p2p_rate") is not None:
            p2p = float(gold["p2p_rate"])
        elif resolved:
            p2p = 1.0
        elif p2p_ids:
            p2p = sum(1 for g in p2p_ids if last_seen(g) is not False) / len(p2p_ids)
        else:
            p2p = 0.0

        # repeats and failures
        shell = [s for s in steps if s.kind == "shell" and s.command is not None]
        seen_cmds: set[str] = set()
        repeats = 0
        for s in shell:
            assert s.command is not None
            if s.command in seen_cmds:
                repeats += 1
                contrib[s.index] += w["no_progress"] / len(shell)
            seen_cmds.add(s.command)
        no_progress = repeats / len(shell) if shell else 0.0
        failures = [s for s in steps if s.failed]
        error_rate = len(failures) / n if n else 0.0
        for s in failures:
            contrib[s.index] += w["error_rate"] / n

        outcome_terms = w["resolved"] * resolved + w["f2p"] * f2p + w["p2p"] * p2p
        if n:
            contrib[-1] += outcome_terms

        # the integrity gate
        for s in steps:
            bad_tests = [f for f in s.edits if is_test_path(f)]
            if bad_tests:
                notes.append(f"step {s.index}: edits test file {bad_tests[0]}")
            if (s.edits or s.kind in ("edit", "write")) and _SKIP.search(_added_text(s)):
                notes.append(f"step {s.index}: adds a skip/xfail/assert True")
            if s.kind == "shell" and s.command and _DESTRUCTIVE.search(s.command):
                notes.append(f"step {s.index}: destructive command {s.command.strip()[:80]!r}")
        gate = 0.0 if notes else 1.0

        components = {
            "resolved": resolved,
            "f2p": f2p,
            "localization": localization,
            "anchored_flip": flip_value,
            "read_before_edit": read_before_edit,
            "p2p": p2p,
            "extra_files": extra_files,
            "no_progress": no_progress,
            "error_rate": error_rate,
            "integrity_gate": gate,
        }
        raw = sum(w[k] * components[k] for k in SWE_WEIGHTS)
        total = raw * gate * self.scale
        step_values = [c * gate * self.scale for c in contrib]
        turns = max(n_turns, (steps[-1].turn + 1) if steps else 0)
        turn_values = [0.0] * turns
        for s, v in zip(steps, step_values):
            turn_values[s.turn] += v
        if not n and turns:
            turn_values[-1] += outcome_terms * gate * self.scale
        running = 0.0
        for t in range(turns):
            running += turn_values[t]
            turn_values[t] = running
        return RewardResult(total, components, step_values, turn_values, notes)
