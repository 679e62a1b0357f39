"""The mistakes tour, continued (issue 37, items 1-12): what a user types must never damage what
was recorded, and what used to be silently wrong now says so.

Every case runs the real command line in the folder where ``orchard.db`` lives, as a new
user would, and checks: the exit code, the words, one or two lines (no traceback), and that the
database afterwards is byte-for-byte what it was (or, for a command that writes an outcome,
that only what was asked changed). The per-item tests with the reasons are in
``test_outputs.py`` (1, 4), ``test_outcome.py`` and ``tests/storage/test_outcome_merge.py``
(2, 3), ``test_silent.py`` and ``test_silent_serve.py`` (5-12).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from factories import call

from orchard_rec.storage import Store
from orchard_rec.storage.outcome import OutcomeChange
from tests.cli.test_mistakes import assert_short, cli


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder with ``orchard.db`` (two sessions with outcomes) and an earlier export ``keep.jsonl``."""
    store = Store(f"sqlite:///{tmp_path / 'orchard.db'}")
    store.upgrade()
    store.write_batch(
        [
            call("my-run", prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2], harness="codex"),
            call("other", prompt_ids=[5], completion_ids=[6], logprobs=[-0.3]),
        ]
    )
    store.update_outcome(
        "my-run", OutcomeChange({"reward": 1, "status": "completed", "metadata": {"task": "t1"}})
    )
    store.update_outcome("other", OutcomeChange({"reward": {"tests": 0}}))
    store.close()
    assert cli("export", "--out", "keep.jsonl", cwd=tmp_path)[0] == 0
    (tmp_path / "notes.txt").write_text("my notes\n")
    return tmp_path


def _digest(folder: Path) -> dict[str, str]:
    """Every file's content (the database's through its rows: SQLite may rewrite pages)."""
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith("orchard.db"):
            continue
        out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    store = Store(f"sqlite:///{folder / 'orchard.db'}", readonly=True)
    try:
        out["sessions"] = json.dumps(
            [(s.id, s.call_count, s.harness, repr(s.outcome)) for s in store.sessions()], sort_keys=True
        )
    finally:
        store.close()
    return out


TOUR = [
    # 1. outputs that are databases, or not ours
    (["export", "--out", "orchard.db"], 2, "is the database"),
    (["export", "--out", "orchard.db", "--force"], 2, "is the database"),
    (["export", "--out", "orchard.db-wal"], 2, "is the database"),
    (["show", "my-run", "--html", "orchard.db"], 2, "is the database"),
    (["export", "--out", "notes.txt", "--format", "jsonl"], 2, "not an earlier orchard-rec output"),
    (["show", "my-run", "--html", "notes.txt"], 2, "not an earlier orchard-rec output"),
    (["train", "sft", "--model", ".", "--out", "orchard.db"], 2, "is the database"),
    # 2. numbers that are not finite
    (["outcome", "my-run", "--reward", "nan"], 2, "not a finite number"),
    (["outcome", "my-run", "--reward", "inf"], 2, "not a finite number"),
    (["outcome", "my-run", "--reward", "1", "--step-values", "1,nan,2"], 2, "finite"),
    (["outcome", "my-run", "--reward-json", '{"tests": NaN}'], 2, "finite"),
    (["outcome", "my-run", "--reward-json", '{"tests": 1e999}'], 2, "finite"),
    (["export", "--out", "x.jsonl", "--min-reward", "nan"], 2, "not a finite number"),
    # 3. an outcome call that changes nothing
    (["outcome", "my-run"], 2, "nothing to change"),
    (["outcome", "my-run", "--clear", "rewards"], 2, "cannot clear 'rewards'"),
    # 4. filters that keep nothing leave the earlier output
    (
        ["export", "--out", "keep.jsonl", "--status", "aborted"],
        1,
        "nothing written (keep.jsonl left as it was)",
    ),
    (["export", "--out", "keep.jsonl", "--min-reward", "5"], 1, "nothing written"),
    (
        ["export", "--out", "keep.jsonl", "--group-by", "session", "--filter", "nonzero-std"],
        1,
        "nothing written",
    ),
    # 5. a reward key nobody has
    (["export", "--out", "keep.jsonl", "--reward-key", "tets"], 2, "--reward-key tets"),
    # 7. session ids the proxy would refuse
    (["outcome", "", "--reward", "1", "--create"], 2, "is not a session id"),
    (["outcome", "../../etc", "--reward", "1", "--create"], 2, "is not a session id"),
    (["outcome", "a/b?c=d#e", "--reward", "1", "--create"], 2, "is not a session id"),
    (["outcome", "café", "--reward", "1", "--create"], 2, "is not a session id"),
    (["outcome", "x" * 5000, "--reward", "1", "--create"], 2, "at most 128"),
    (["show", "../etc"], 2, "is not a session id"),
    # 10. process rewards without grader data
    (["reward", "--rules", "swe"], 1, "no selected session has grader data"),
]


@pytest.mark.parametrize(("args", "code", "says"), TOUR, ids=[" ".join(a)[:60] for a, _, _ in TOUR])
def test_the_tour_damages_nothing(work: Path, args: list[str], code: int, says: str) -> None:
    before = _digest(work)
    rc, out = cli(*args, cwd=work)
    assert rc == code and says in out, out
    assert_short(
        "\n".join(x for x in out.splitlines() if not x.startswith("selection: "))
    )  # what --filter kept
    assert "wrote 0" not in out
    assert _digest(work) == before


def test_the_readme_recipe_keeps_the_task_key(work: Path) -> None:
    """3: ``--status completed`` after ``--metadata task=...`` keeps what --group-by needs."""
    assert cli("outcome", "other", "--metadata", "task=t1", cwd=work)[0] == 0
    assert cli("outcome", "other", "--status", "completed", cwd=work)[0] == 0
    rc, out = cli("export", "--out", "g.jsonl", "--group-by", "task", cwd=work)
    assert rc == 0 and "warning" not in out, out
    groups = {json.loads(x)["group_index"] for x in (work / "g.jsonl").read_text().splitlines()}
    assert len(groups) == 1


def test_serve_on_a_damaged_database_is_one_line_and_never_listens(tmp_path: Path) -> None:
    """6: main printed ``ready`` and spooled every call."""
    from tests.cli.test_silent_serve import _damaged

    db = _damaged(tmp_path)
    rc, out = cli("serve", "--upstream", "http://127.0.0.1:9/v1", "--port", "0", "--db", db, cwd=tmp_path)
    assert rc == 1 and "malformed" in out and "ready" not in out, out
    assert_short(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orchard.db"]
