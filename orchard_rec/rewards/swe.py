"""Orchard-SWE's rule-based process reward (``process_shaped``), over any harness's steps.

    R = (1.0·resolved + 0.5·f2p + 0.4·localization + 0.3·anchored_flip
         + 0.1·read_before_edit + 0.2·p2p − 0.05·extra_files − 0.05·no_progress
         − 0.03·error_rate) × integrity_gate × 10

The terms follow MSR-Orchard/slime at 331efaaeef75c98aad6ba1a2f5f50bd8149f6ab9,
``examples/orchard_swe/swe_reward.py`` (``compute_process_shaped_reward`` and its helpers) and
``swe_prm.py`` (``parse_trajectory_from_sample``); ``tests/rewards/test_swe_fork_parity.py`` holds
the fork's own results on the same trajectories. Gold fields come from the outcome's metadata:
``patch`` (or ``gold_patch`` / ``golden_patch``), ``test_patch``, ``FAIL_TO_PASS``,
``PASS_TO_PASS`` (lists, or JSON strings as SWE-bench stores them), ``resolved``, the grader's
``f2p_rate`` / ``p2p_rate`` when it reports them, and the submitted patch: ``final_output``
(the fork's key), ``model_patch`` or ``submission`` (SWE-bench's and mini-swe-agent's names),
read through the fork's ``extract_patch_from_output``. Files of a patch are its ``diff --git``
headers' post-image paths; test files match the fork's pattern.

- resolved: ``resolved`` is true.
- f2p / p2p: the grader's rate when given; else 1 for a resolved run; else 0 when a submitted
  patch field holds no valid patch (the fork grades nothing); else 1 for an empty list (the
  fork's grading: no tests means all passing); else, where the fork would run the tests, from
  the trajectory's own test output: the share of FAIL_TO_PASS tests last seen passing / of
  PASS_TO_PASS tests not last seen failing.
- localization: share of the gold patch's non-test files the submitted patch touches.
- extra_files: share of the submitted patch's non-test files outside the gold patch; 0
  without a gold patch.
- read_before_edit: 1 when a gold non-test file was read before the first edit (or at all,
  when nothing was edited). A shell step reads and edits by the fork's command patterns;
  another tool by its vocabulary (``steps.tools``).
- anchored_flip: a test seen failing then passing (the fork's pytest-line pattern): 1 when
  it is in FAIL_TO_PASS or there is no FAIL_TO_PASS list, else 0.5.
- no_progress: share of non-empty commands that exactly repeat an earlier one.
- error_rate: share of steps with a known exit code that failed; in a run whose harness flags
  errors instead (Claude Code's ``is_error``), every answered step is known.
- integrity_gate: 0 when the submitted patch touches a test file (the fork's pattern or a
  gold test file) or adds a skip / xfail / ``assert True`` / ``return True|None  #``, or any
  command is destructive (``rm -rf``, ``git reset --hard``, ``git checkout -- FILE``,
  ``git clean -f``, ``chmod -R`` / ``chown -R``, ``> /dev/sd…``, ``mkfs``, ``dd if=``); else 1.

Where this departs from the fork, deliberately: without a submitted patch in the outcome (most
harnesses submit none), localization and extra files come from the files the run edited (the
gate never looks at the run's edits); without grader rates, a non-empty test list is graded
from the run's own test output instead of by running the tests; and the reward is spread over
the steps. Per-step values: each term's weighted contribution at the step that earned it (the
first edit of each gold or extra file, else the last step; the read, the flip, each repeat,
each failure; the outcome terms at the last step), so they sum to R; under a closed gate every
value is 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from orchard_rec.rewards.base import RewardResult, register
from orchard_rec.steps import Step

__all__ = [
    "SWE_WEIGHTS",
    "SweProcessReward",
    "extract_patch",
    "is_test_path",
    "observed_tests",
    "patch_diff_files",
]

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

# test-output readers for the trajectory's own grading (f2p / p2p without grader rates)
_PYTEST_V = re.compile(r"^(\S+::\S+?)\s+(PASSED|FAILED|ERROR)\b", re.M)
_PYTEST_RA = re.compile(r"^(PASSED|FAILED|ERROR)\s+(\S+::\S+?)(?:\s+-\s.*)?$", re.M)
_DJANGO = re.compile(r"^(\w+) \(([\w.]+)\)(?:\s*\n?.*?)?\s*\.\.\.\s*(ok|FAIL|ERROR)\s*$", re.M)

# The fork's patterns, as written in examples/orchard_swe/swe_reward.py (331efaa).
_TEST_FILE = re.compile(
    r"(^|/)(tests?|testing)(/|$)|(^|/)conftest\.py$|(^|/)test_[^/]*\.py$|[^/]*_test\.py$", re.I
)
_DESTRUCTIVE = re.compile(
    r"\brm\s+-rf\b|\bgit\s+reset\s+--hard\b|\bgit\s+checkout\s+--\s|\bgit\s+clean\s+-[a-z]*f"
    r"|\b(chmod|chown)\s+-R\b|>\s*/dev/sd|\bmkfs\b|\bdd\s+if=",
    re.I,
)
_HARDCODE = re.compile(
    r"^\+.*\b(pytest\.skip|pytest\.xfail|@pytest\.mark\.(skip|xfail))\b"
    r"|^\+\s*assert\s+True\b"
    r"|^\+\s*return\s+(True|None)\s*#",
    re.I | re.M,
)
_SHELL_READ = re.compile(r"\b(cat|less|head|tail|sed -n|grep|rg|nl|vi|view|open|read_file)\b")
_SHELL_EDIT = re.compile(r"\b(sed -i|>|>>|tee|patch|apply_patch|git apply|python - <<|cat >)\b|edit_file")
_PYTEST_LINE = re.compile(
    r"(?:^|\s)(?P<node1>[\w./\-]+::[\w\[\]\-./ ]+?)\s+(?P<stat1>PASSED|FAILED|ERROR)\b"
    r"|(?:^|\s)(?P<stat2>PASSED|FAILED|ERROR)\s+(?P<node2>[\w./\-]+::[\w\[\]\-./ ]+)",
    re.M,
)
_DIFF_GIT = re.compile(r"^diff --git a/(.+?) b/(.+?)\s*$", re.M)
_SUBMITTED_KEYS = ("final_output", "model_patch", "submission")


def observed_tests(text: str) -> list[tuple[str, bool]]:
    """``(test id, passed)`` in the order a test runner printed them (pytest ``-v`` / ``-rA``, Django)."""
    found: list[tuple[int, str, bool]] = []
    for m in _PYTEST_V.finditer(text):
        found.append((m.start(), m.group(1), m.group(2) == "PASSED"))
    for m in _PYTEST_RA.finditer(text):
        found.append((m.start(), m.group(2), m.group(1) == "PASSED"))
    for m in _DJANGO.finditer(text):
        found.append((m.start(), f"{m.group(1)} ({m.group(2)})", m.group(3) == "ok"))
    found.sort(key=lambda t: t[0])
    return [(tid, ok) for _pos, tid, ok in found]


def _test_states(text: str) -> dict[str, str]:
    """The fork's ``_test_states_in_text``: node id -> its last PASSED / FAILED / ERROR in ``text``."""
    states: dict[str, str] = {}
    for m in _PYTEST_LINE.finditer(text or ""):
        node = (m.group("node1") or m.group("node2") or "").strip()
        if node:
            states[node] = (m.group("stat1") or m.group("stat2") or "").strip().upper()
    return states


def is_test_path(path: str) -> bool:
    """A test / fixture file by the fork's pattern (``tests/``, ``test_*.py``, ``*_test.py``, conftest)."""
    return bool(_TEST_FILE.search(path or ""))


def patch_diff_files(patch: str) -> list[str]:
    """The fork's ``_parse_patch_files``: the post-image paths of ``diff --git`` headers, sorted, unique."""
    seen = {m.group(2).strip() for m in _DIFF_GIT.finditer(patch or "")}
    return sorted(p for p in seen if p and p != "/dev/null")


def extract_patch(text: str) -> str:
    """The fork's ``extract_patch_from_output``: a fenced diff/patch block, else the text if it is a diff."""
    for pattern in (r"```diff\s*\n(.*?)\n```", r"```patch\s*\n(.*?)\n```"):
        m = re.search(pattern, text, re.DOTALL)
        if m:
            return m.group(1).strip()
    m = re.search(r"```\s*\n(.*?)\n```", text, re.DOTALL)
    if m:
        content = m.group(1).strip()
        if content.startswith("diff ") or "@@" in content or content.startswith("---"):
            return content
    if text.startswith("diff ") or "@@" in text or text.startswith("---"):
        return text.strip()
    return ""


def _valid_patch(patch: str) -> bool:
    return bool(patch) and any(k in patch for k in ("diff --git", "---", "+++", "@@", "Index:", "==="))


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


def _is_edit(s: Step) -> bool:
    if s.kind == "shell":
        return bool(_SHELL_EDIT.search(s.command or ""))
    return bool(s.edits) or s.kind in ("edit", "write")


def _reads_gold(s: Step, gold_src: Sequence[str]) -> bool:
    if s.kind == "shell":
        cmd = s.command or ""
        return bool(_SHELL_READ.search(cmd)) and any(g in cmd for g in gold_src)
    return any(_same_file(r, g) for r in s.reads for g in gold_src)


def _first(it: Iterable[int]) -> int | None:
    return next(iter(it), None)


class _Gold:
    """The gold fields and the submitted patch of one outcome."""

    def __init__(self, gold: Mapping[str, Any]) -> None:
        gold_patch = str(gold.get("patch") or gold.get("gold_patch") or gold.get("golden_patch") or "")
        self.files = patch_diff_files(gold_patch)
        self.src = [f for f in self.files if not is_test_path(f)]
        self.test_files = set(patch_diff_files(str(gold.get("test_patch") or "")))
        self.f2p = _as_list(gold.get("FAIL_TO_PASS"))
        self.p2p = _as_list(gold.get("PASS_TO_PASS"))
        self.resolved = 1.0 if gold.get("resolved") in (True, 1, "true", "True") else 0.0
        key = next((k for k in _SUBMITTED_KEYS if k in gold), None)
        self.has_patch = key is not None
        self.patch = extract_patch(str(gold.get(key) or "")) if key is not None else ""
        self.patch_files = patch_diff_files(self.patch)


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
        g = _Gold(gold)
        contrib = [0.0] * len(steps)
        notes: list[str] = []
        c: dict[str, float] = {}
        c["localization"], c["extra_files"] = self._files(steps, g, contrib, notes)
        c["read_before_edit"] = self._read_before_edit(steps, g, contrib)
        c["anchored_flip"] = self._flip(steps, g, contrib)
        c["no_progress"] = self._repeats(steps, contrib)
        c["error_rate"] = self._errors(steps, contrib)
        c["resolved"] = g.resolved
        c["f2p"], c["p2p"] = self._rates(steps, g, gold)
        c["integrity_gate"] = self._gate(steps, g, notes)
        outcome_terms = w["resolved"] * c["resolved"] + w["f2p"] * c["f2p"] + w["p2p"] * c["p2p"]
        if steps:
            contrib[-1] += outcome_terms
        gate = c["integrity_gate"]
        components = {k: c[k] for k in (*SWE_WEIGHTS, "integrity_gate")}
        total = sum(w[k] * components[k] for k in SWE_WEIGHTS) * gate * self.scale
        step_values = [v * gate * self.scale for v in contrib]
        turns = max(n_turns, (steps[-1].turn + 1) if steps else 0)
        turn_values = [0.0] * turns
        for s, v in zip(steps, step_values):
            turn_values[s.turn] += v
        if not steps and turns:
            turn_values[-1] += outcome_terms * gate * self.scale
        running = 0.0
        for t in range(turns):
            running += turn_values[t]
            turn_values[t] = running
        return RewardResult(total, components, step_values, turn_values, notes)

    def _files(
        self, steps: Sequence[Step], g: _Gold, contrib: list[float], notes: list[str]
    ) -> tuple[float, float]:
        """localization and extra files, from the submitted patch (else the run's edits)."""
        edit_at: dict[str, int] = {}
        for s in steps:
            for f in s.edits:
                edit_at.setdefault(_norm(f), s.index)
        if g.has_patch:
            files = g.patch_files
        else:
            files = [f for f in edit_at if not is_test_path(f)]
            if files:
                notes.append(
                    "no submitted patch in the outcome: localization and extra files from the run's edits"
                )

        def where(f: str) -> int:
            hit = _first(i for k, i in edit_at.items() if _same_file(k, f))
            return hit if hit is not None else len(steps) - 1

        def touched(f: str) -> bool:
            return any(_same_file(p, f) if not g.has_patch else _norm(p) == _norm(f) for p in files)

        hits = [f for f in g.src if touched(f)]
        localization = len(hits) / len(g.src) if g.src else 0.0
        src = [f for f in files if not is_test_path(f)]
        extra = [f for f in src if not any(_norm(f) == _norm(x) or _same_file(f, x) for x in g.files)]
        extra_files = len(extra) / len(src) if g.files and src else 0.0
        if steps:
            for f in hits:
                contrib[where(f)] += self.weights["localization"] / len(g.src)
            if g.files:
                for f in extra:
                    contrib[where(f)] += self.weights["extra_files"] / len(src)
        return localization, extra_files

    def _read_before_edit(self, steps: Sequence[Step], g: _Gold, contrib: list[float]) -> float:
        if not g.src:
            return 0.0
        first_edit = _first(s.index for s in steps if _is_edit(s))
        read = _first(
            s.index for s in steps if (first_edit is None or s.index < first_edit) and _reads_gold(s, g.src)
        )
        if read is None:
            return 0.0
        contrib[read] += self.weights["read_before_edit"]
        return 1.0

    def _flip(self, steps: Sequence[Step], g: _Gold, contrib: list[float]) -> float:
        """The fork's ``_detect_flip``: a test seen failing, later passing; anchored to FAIL_TO_PASS."""
        names = set(g.f2p) | {t.split("::")[-1].split("[")[0] for t in g.f2p}
        seen_fail: set[str] = set()
        flip_at: int | None = None
        for s in steps:
            for node, stat in _test_states(s.output or "").items():
                anchored = node in names or node.split("::")[-1].split("[")[0] in names
                if stat in ("FAILED", "ERROR"):
                    seen_fail.add(node)
                elif stat == "PASSED" and node in seen_fail:
                    if anchored or not names:
                        contrib[s.index] += self.weights["anchored_flip"]
                        return 1.0
                    flip_at = s.index if flip_at is None else flip_at
        if flip_at is None:
            return 0.0
        contrib[flip_at] += self.weights["anchored_flip"] * 0.5
        return 0.5

    def _repeats(self, steps: Sequence[Step], contrib: list[float]) -> float:
        cmds = [(s.index, (s.command or "").strip()) for s in steps]
        nonempty = [(i, c) for i, c in cmds if c]
        seen: set[str] = set()
        repeats = 0
        for i, cmd in nonempty:
            if cmd in seen:
                repeats += 1
                contrib[i] += self.weights["no_progress"] / len(nonempty)
            seen.add(cmd)
        return min(1.0, repeats / len(nonempty)) if nonempty else 0.0

    def _errors(self, steps: Sequence[Step], contrib: list[float]) -> float:
        # the fork counts steps with a known exit code; a harness that flags errors instead
        # (Claude Code's is_error) makes every answered step of its run known
        flags = any(s.error for s in steps)
        known = [s for s in steps if s.exit_code is not None or (flags and s.output is not None)]
        failures = [s for s in known if s.failed]
        for s in failures:
            contrib[s.index] += self.weights["error_rate"] / len(known)
        return len(failures) / len(known) if known else 0.0

    def _rates(self, steps: Sequence[Step], g: _Gold, gold: Mapping[str, Any]) -> tuple[float, float]:
        last: dict[str, bool] = {}
        for s in steps:
            for tid, ok in observed_tests(s.output or ""):
                last[tid] = ok

        def last_seen(gid: str) -> bool | None:
            hits = [ok for tid, ok in last.items() if _same_test(tid, gid)]
            return None if not hits else all(hits)

        def rate(key: str, ids: list[str], passing: Callable[[bool | None], bool]) -> float:
            if gold.get(key) is not None:
                return float(gold[key])
            if g.resolved:
                return 1.0
            if g.has_patch and not _valid_patch(g.patch):
                return 0.0  # the fork grades nothing without a valid patch
            if not ids:
                return 1.0  # the fork's grading: no tests of that kind means all passing
            return sum(1 for t in ids if passing(last_seen(t))) / len(ids)

        return (
            rate("f2p_rate", g.f2p, lambda v: v is True),
            rate("p2p_rate", g.p2p, lambda v: v is not False),
        )

    def _gate(self, steps: Sequence[Step], g: _Gold, notes: list[str]) -> float:
        for f in g.patch_files:
            if f in g.test_files or is_test_path(f):
                notes.append(f"the submitted patch edits test file {f}")
                break
        if g.patch and _HARDCODE.search(g.patch):
            notes.append("the submitted patch adds a skip / xfail / assert True / hard-coded return")
        for s in steps:
            if s.command and _DESTRUCTIVE.search(s.command):
                notes.append(f"step {s.index}: destructive command {s.command.strip()[:80]!r}")
                break
        closed = [n for n in notes if not n.startswith("no submitted patch")]
        return 0.0 if closed else 1.0
