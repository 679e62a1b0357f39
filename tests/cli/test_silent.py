"""Issue 37, items 5-12: what used to be silently wrong is an error or a warning now.

Each test names what main did before the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import two_session_store

from orchard_rec.errors import BadRequest
from orchard_rec.proxy.identity import validate_session_id
from orchard_rec.records import SESSION_ID_MAX, session_id_problem
from orchard_rec.storage import Store
from orchard_rec.storage.outcome import InvalidOutcome, OutcomeChange
from tests.cli.test_mistakes import assert_short, cli


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'orchard.db'}"
    store = two_session_store(url)
    store.update_outcome("alpha", OutcomeChange({"reward": {"tests": 1, "style": 0.5}}))
    store.update_outcome("beta", OutcomeChange({"reward": {"tests": 0}}))
    store.close()
    return url


# -- 5. --reward-key ------------------------------------------------------------------------------------------


def test_a_reward_key_no_session_has_is_refused(tmp_path: Path, db: str) -> None:
    """main: rc 0, every reward null."""
    out_file = tmp_path / "r.jsonl"
    rc, out = cli("export", "--out", str(out_file), "--reward-key", "tets", "--db", db)
    assert rc == 2 and "--reward-key tets" in out and "known here: style, tests" in out, out
    assert_short(out)
    assert not out_file.exists()


def test_a_reward_key_some_sessions_lack_warns(tmp_path: Path, db: str) -> None:
    out_file = tmp_path / "r.jsonl"
    rc, out = cli("export", "--out", str(out_file), "--reward-key", "style", "--db", db)
    assert rc == 0 and "warning: --reward-key style: 1 of 2 sessions have no 'style'" in out, out
    rewards = {
        json.loads(x)["session_id"]: json.loads(x)["reward"] for x in out_file.read_text().splitlines()
    }
    assert rewards == {"alpha": 0.5, "beta": None}


# -- 7. one session-id rule ---------------------------------------------------------------------------------------

BAD_IDS = ["", "..", "../../etc", "a/b?c=d#e", "a#b", "a?b", "a\nb", "a\x00b", "café", "x" * 300, "x" * 5000]


@pytest.mark.parametrize("sid", BAD_IDS)
def test_every_entry_point_refuses_the_same_ids(db: str, sid: str) -> None:
    """main: ``outcome ID --create`` stored them all (PostgreSQL refused 300 characters, SQLite took them)."""
    problem = session_id_problem(sid)
    assert problem is not None
    with pytest.raises(BadRequest):  # the proxy's routes, header and the intercept addon
        validate_session_id(sid)
    for args in (
        ("outcome", sid, "--reward", "1", "--create"),
        ("show", sid),
        ("calls", sid),
        ("export", "--session", sid, "--out", "x.jsonl"),
        ("harness", "config", "codex", "--session", sid),
    ):
        rc, out = cli(*args, "--db", db) if args[0] != "harness" else cli(*args)
        assert rc == 2 and "is not a session id" in out, (args, out)
        assert_short(out)
    store = Store(db)
    with pytest.raises(InvalidOutcome):
        store.update_outcome(sid, OutcomeChange({"reward": 1}))
    assert sorted(s.id for s in store.sessions()) == ["alpha", "beta"]
    store.close()


def test_the_same_length_limit_on_both_databases(db_url: str) -> None:
    store = Store(db_url)
    store.upgrade()
    longest = "x" * SESSION_ID_MAX
    store.update_outcome(longest, OutcomeChange({"reward": 1}))
    assert store.session(longest) is not None
    with pytest.raises(InvalidOutcome, match="129 characters"):
        store.update_outcome(longest + "x", OutcomeChange({"reward": 1}))
    store.close()


@pytest.mark.parametrize("sid", ["run-1", "h-claude-code-abc", "a.b:c@d=e+f_g", "x" * SESSION_ID_MAX])
def test_good_ids_pass_everywhere(db: str, sid: str) -> None:
    assert session_id_problem(sid) is None and validate_session_id(sid) == sid
    rc, out = cli("outcome", sid, "--reward", "1", "--create", "--db", db)
    assert rc == 0, out


# -- 10. reward --rules swe without grader data ---------------------------------------------------------------


def test_swe_rewards_need_grader_data(db: str) -> None:
    """main: stored -0.167 (a reward made up from the trajectory alone) for every session, no warning."""
    rc, out = cli("reward", "--rules", "swe", "--db", db)
    assert rc == 1 and "no selected session has grader data" in out and "nothing stored" in out, out
    assert_short(out)
    store = Store(db)
    assert all("process_reward" not in (s.outcome.metadata if s.outcome else {}) for s in store.sessions())
    store.close()
    assert cli("outcome", "alpha", "--metadata", "resolved=true", "--db", db)[0] == 0
    rc, out = cli("reward", "--rules", "swe", "--db", db)
    assert rc == 0 and "1 session(s) have no grader data" in out and "'beta'" in out, out
    store = Store(db)
    stored = {s.id: "process_reward" in s.outcome.metadata for s in store.sessions() if s.outcome}
    store.close()
    assert stored == {"alpha": True, "beta": False}
