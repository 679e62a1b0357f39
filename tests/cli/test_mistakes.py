"""A scripted tour of the mistakes a new user makes (issue 22), through the real command line.

Each one must end in one or two lines saying what to do (no traceback without --debug), the
documented exit code (2: usage, 1: failure), nothing created or left behind, no phantom
session, the right reward, and the promised warnings.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from factories import call, free_port
from typer.testing import CliRunner

from orchard_rec.cli import app
from orchard_rec.storage import Store, migrate

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[int, str]:
    """In-process, as `orchard-rec ARGS` (stdout + stderr)."""
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        r = runner.invoke(app, list(args), env=env)
    finally:
        os.chdir(old)
    return r.exit_code, r.output


def assert_short(out: str) -> None:
    assert "Traceback" not in out and "╭" not in out, out
    lines = [x for x in out.splitlines() if x.strip()]
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: "), out


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'rec.db'}"
    store = Store(url)
    store.upgrade()
    store.write_batch(
        [
            call("alpha", prompt_ids=[1, 2], completion_ids=[3, 4], logprobs=[-0.1, -0.2], model="m1"),
            call("beta", prompt_ids=[5], completion_ids=[6], logprobs=[-0.3], model="m2"),
        ]
    )
    store.close()
    return url


# -- configuration mistakes: checked before anything is created or listens -------------------------


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["serve", "--upstream", "localhost:8000/v1"], 2, "not an http(s) URL"),
        (["serve", "--upstream", "http://127.0.0.1:9/v1", "--db", "foo"], 2, "not a database URL"),
        (
            ["serve", "--upstream", "http://127.0.0.1:9/v1", "--db", "mysql://u@h/db"],
            2,
            "SQLite or PostgreSQL",
        ),
        (["serve", "--upstream", "http://127.0.0.1:9/v1", "--mode", "tito"], 2, "needs --tokenizer"),
        (
            ["serve", "--upstream", "http://127.0.0.1:9/v1", "--mode", "tito", "--tokenizer", "/nonexistent"],
            2,
            "no such file or folder",
        ),
        (["serve", "--upstream", "http://127.0.0.1:9/v1", "--mode", "fast"], 2, "'fast' is not one of"),
        (["demo", "--mode", "foo"], 2, "is not one of"),
        (
            ["serve", "--upstream", "http://127.0.0.1:9/v1", "--db", "sqlite:///./no/such/dir/x.db"],
            1,
            "does not exist",
        ),
        (["outcome", "s", "--reward-json", "{tests: 1"], 2, "--reward-json is not JSON"),
        (["outcome", "s", "--metadata", "task"], 2, "KEY=VALUE"),
        (["outcome", "s", "--reward", "1"], 1, "no orchard-rec database at ./orchard.db"),
        (["serve", "--upstream", "http://127.0.0.1:9", "--port", "99999"], 2, "--port"),
        (["export", "--format", "nope", "--out", "x.jsonl"], 2, "is not a format"),
        (["export", "--format", "trl", "--out", "x.jsonl"], 2, "writes parquet"),
        (["export", "--format", "slime", "--out", "-"], 2, "line-based format"),
        (["export", "--tokenizer", "./missing-tok", "--out", "x.jsonl"], 2, "no such file or folder"),
        (["sessions"], 1, "no orchard-rec database at ./orchard.db (use --db or ORCHARD_DB)"),
        (["calls", "x"], 1, "no orchard-rec database at ./orchard.db"),
        (["show", "x"], 1, "no orchard-rec database at ./orchard.db"),
        (["export", "--out", "x.jsonl"], 1, "no orchard-rec database at ./orchard.db"),
        (["bogus"], 2, "No such command"),
        # issue 37: refusals that were an "unexpected error", accepted, or hinted wrong
        (["ui", "--port", "99999"], 2, "--port"),  # was OverflowError after the banner
        (["intercept", "--listen", "127.0.0.1:99999"], 2, "port 0 to 65535"),
        (["serve", "--upstream", "http://127.0.0.1:9/v1", "--max-body-mb", "-1"], 2, "--max-body-mb -1"),
        (["serve", "--upstream", "ftp://x/v1"], 2, "e.g. --upstream http://x/v1"),  # was ftp://x/v1
        (  # was "port 8100 on 192.0.2.1 is in use"
            ["serve", "--upstream", "http://127.0.0.1:9/v1", "--host", "192.0.2.1", "--port", "0"],
            2,
            "--host 192.0.2.1 is not an address of this machine",
        ),
        (
            ["export", "--group-by", "t", "--pass-rate", "0.8:0.2", "--out", "x.jsonl"],
            2,
            "0 <= LO <= HI <= 1",
        ),
        (
            ["export", "--status", "bogus", "--out", "x.jsonl"],
            2,
            "'bogus' is not one of: completed, truncated",
        ),
        (["sessions", "--status", "bogus"], 2, "'bogus' is not one of: completed, truncated"),
        (["export", "--min-reward", "nan", "--out", "x.jsonl"], 2, "--min-reward nan: not a finite number"),
        (["sessions", "--min-reward", "inf"], 2, "--min-reward inf: not a finite number"),
        (["outcome", "s", "--reward", "nan"], 2, "--reward nan: not a finite number"),
        (["export", "--seed", "3", "--out", "x.jsonl"], 2, "without either it changes nothing"),
        (
            ["export", "--group-by", "t", "--filter", "nonzero-std", "--seed", "3", "--out", "x.jsonl"],
            2,
            "--seed orders",
        ),
    ],
)
def test_a_mistake_is_one_or_two_lines_and_leaves_nothing(
    tmp_path: Path, args: list[str], code: int, says: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    rc, out = cli(*args, cwd=work)
    assert rc == code, out
    assert says in out, out
    assert_short(out)
    assert files(work) == set()  # no orchard.db, -wal, -shm, spool, output file


def test_port_in_use_is_reported_before_the_banner_and_leaves_no_database(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, out = cli(
            "serve", "--upstream", "http://127.0.0.1:9/v1", "--port", str(port), "--db", "sqlite:///./port.db",
            cwd=tmp_path,
        )  # fmt: skip
    assert rc == 1 and f"port {port} on 127.0.0.1 is in use" in out and "ready:" not in out
    assert_short(out)
    assert files(tmp_path) == set()


@pytest.mark.parametrize(
    "var",
    [
        "ORCHARD_REQUEST_CACHE_MB",  # checked by Settings as serve builds its recorder: the fast tier keeps this one
        pytest.param("ORCHARD_SPOOL_BASES_MB", marks=pytest.mark.slow),  # a fresh interpreter each: 1.5-3.5 s
        pytest.param("ORCHARD_IDS_CACHE_MB", marks=pytest.mark.slow),
        pytest.param("ORCHARD_STATE_CACHE_MB", marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_a_cache_size_that_is_not_a_number_names_the_variable(tmp_path: Path, var: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), var: "256MB"}
    r = subprocess.run(
        [sys.executable, "-m", "orchard_rec.cli", "serve", "--upstream", "http://127.0.0.1:9/v1",
         "--port", str(free_port()), "--db", "sqlite:///./x.db"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 2 and f"{var} must be a number of megabytes" in out and "report it" not in out, out
    assert_short(out)


def test_postgresql_down_is_one_line(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none"
    rc, out = cli("serve", "--upstream", "http://127.0.0.1:9/v1", "--db", url, "--port", "0", cwd=tmp_path)
    assert rc == 1 and "cannot reach PostgreSQL" in out, out
    assert_short(out)
    rc, out = cli("sessions", "--db", url)
    assert rc == 1 and "cannot reach PostgreSQL" in out
    assert files(tmp_path) == set()


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["--debug", "sessions"], ["sessions", "--debug"]):  # before or after the command
        r = subprocess.run(
            [sys.executable, "-m", "orchard_rec.cli", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env,
        )
        assert r.returncode == 1 and "Traceback" in r.stderr and "no orchard-rec database" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "orchard_rec.cli", "sessions"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == "error: no orchard-rec database at ./orchard.db (use --db or ORCHARD_DB)\n"
    assert files(tmp_path) == set()


# -- reads never write ---------------------------------------------------------------------------------


def test_a_database_needing_a_migration_says_which_command_migrates_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate.upgrade(url, "0002")
    before = (tmp_path / "old.db").read_bytes()
    for args in (["sessions"], ["calls", "x"], ["show", "x"], ["export", "--out", str(tmp_path / "o.jsonl")]):
        rc, out = cli(*args, "--db", url)
        assert rc == 1 and "needs a migration" in out and f"orchard-rec db upgrade --db {url}" in out, out
        assert_short(out)
    assert (tmp_path / "old.db").read_bytes() == before and migrate.current(url) == "0002"
    rc, out = cli("db", "upgrade", "--db", url)
    assert rc == 0 and migrate.head() in out
    rc, out = cli("sessions", "--db", url)
    assert rc == 0


def test_db_current_on_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    rc, out = cli("db", "current", "--db", f"sqlite:///{tmp_path / 'none.db'}")
    assert rc == 0 and out.startswith("empty") and files(tmp_path) == set()


@pytest.mark.slow
def test_reads_work_in_a_read_only_folder(tmp_path: Path, db: str) -> None:
    """A user who cannot write the folder (root runs without capabilities, so modes apply)."""
    Store(db).write_batch([call("alpha")])  # the database is in WAL mode, as serve leaves it
    folder = tmp_path
    folder.chmod(0o555)
    argv = [sys.executable, "-m", "orchard_rec.cli"]
    prefix = ["setpriv", "--bounding-set=-all", "--"] if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*prefix, *argv, *args, "--db", db], capture_output=True, text=True, env=env, cwd=folder
        )

    try:
        before = files(folder)
        for args in (["sessions", "--json"], ["calls", "alpha", "--json"], ["show", "alpha", "--plain"]):
            r = run(*args)
            assert r.returncode == 0, r.stderr
        assert {s["id"] for s in json.loads(run("sessions", "--json").stdout)} == {"alpha", "beta"}
        r = run("export", "--out", "-")
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
        assert files(folder) == before  # no -wal, -shm or journal appeared
        r = run("outcome", "alpha", "--reward", "1")
        assert r.returncode == 1 and "read-only" in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        folder.chmod(0o755)


# -- outcomes: no phantom session, the right reward, metadata for --group-by -----------------------------


def test_outcome_on_an_unknown_session_is_an_error_unless_create(db: str) -> None:
    rc, out = cli("outcome", "alpah", "--reward", "1", "--db", db)
    assert rc == 1 and "no session 'alpah'" in out and "--create" in out
    assert_short(out)
    store = Store(db)
    assert store.session("alpah") is None
    rc, out = cli("outcome", "gamma", "--reward", "1", "--create", "--db", db)
    assert rc == 0 and store.session("gamma") is not None
    store.close()


@pytest.mark.slow
def test_reward_and_reward_json_keep_the_scalar(tmp_path: Path, db: str) -> None:
    rc, out = cli(
        "outcome", "alpha", "--reward", "0", "--reward-json", '{"tests": 0, "style": 0.5}', "--db", db
    )
    assert rc == 0, out
    store = Store(db)
    assert store.session("alpha").outcome.reward == {"reward": 0.0, "tests": 0, "style": 0.5}  # type: ignore[union-attr]
    store.close()
    rc, out = cli(
        "export", "-f", "parquet", "--session", "alpha", "--out", str(tmp_path / "a.parquet"), "--db", db
    )
    assert rc == 0, out
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "a.parquet").column("reward").to_pylist() == [0.0]


def test_outcome_metadata_feeds_group_by_and_a_missing_key_warns(tmp_path: Path, db: str) -> None:
    out_file = tmp_path / "g.jsonl"
    rc, out = cli("export", "--group-by", "task", "--out", str(out_file), "--db", db)
    assert rc == 0 and "warning: --group-by task: no selected session has 'task'" in out, out
    assert cli("outcome", "alpha", "--reward", "1", "--metadata", "task=t1", "--db", db)[0] == 0
    rc, out = cli("outcome", "beta", "--reward", "0", "--metadata-json", '{"task": "t2", "n": 3}', "--db", db)
    assert rc == 0, out
    store = Store(db)
    assert store.session("beta").outcome.metadata == {"task": "t2", "n": 3}  # type: ignore[union-attr]
    store.close()
    rc, out = cli("export", "--group-by", "task", "--out", str(out_file), "--db", db)
    assert rc == 0 and "warning" not in out
    groups = {
        json.loads(x)["session_id"]: json.loads(x)["group_index"] for x in out_file.read_text().splitlines()
    }
    assert groups["alpha"] != groups["beta"]


# -- exports: explicit selections that match nothing, safe outputs ------------------------------------------


def test_export_of_an_unknown_session_warns_and_fails_without_writing(tmp_path: Path, db: str) -> None:
    out_file = tmp_path / "x.jsonl"
    rc, out = cli("export", "--session", "nosuch", "--out", str(out_file), "--db", db)
    assert rc == 1 and "warning: no session 'nosuch'" in out and "nothing to export" in out, out
    assert not out_file.exists()


def test_export_of_an_empty_database_fails_without_writing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url).upgrade()
    rc, out = cli("export", "-f", "slime", "--out", str(tmp_path / "r.pt"), "--db", url)
    assert rc == 1 and "nothing to export" in out
    assert_short(out)
    assert not (tmp_path / "r.pt").exists()


def test_export_filters_that_keep_nothing_fail(tmp_path: Path, db: str) -> None:
    """Issue 37: the hint names the filters given (it said "try --tokenizer" for --filter and
    --select), and no "wrote 0 samples" line comes first."""
    for args, says in (
        (["--min-reward", "5"], "no sample passed --min-reward (2 sessions selected)"),
        (["--status", "failed"], "no sample passed --status"),
        (["--group-by", "session", "--filter", "nonzero-std"], "no sample passed --filter"),
        (["--require-teacher"], "no sample passed --require-teacher"),
    ):
        rc, out = cli("export", *args, "--out", str(tmp_path / "x.jsonl"), "--db", db)
        assert rc == 1 and says in out and "tokenizer" not in out and "wrote" not in out, out
        assert_short(out)


def test_a_second_serve_on_the_same_spool_is_one_line(tmp_path: Path, db: str) -> None:
    """Issue 37: it was `RuntimeError: spool ... in use` with "an unexpected error"."""
    from orchard_rec.proxy.config import ProxyConfig
    from orchard_rec.proxy.server import RecordingProxy

    with RecordingProxy(ProxyConfig(upstream="http://127.0.0.1:9/v1", db=db)):
        rc, out = cli("serve", "--upstream", "http://127.0.0.1:9/v1", "--port", "0", "--db", db, cwd=tmp_path)
    assert rc == 1 and "is in use by another orchard-rec" in out and "--spool" in out, out
    assert_short(out)


@pytest.mark.slow
def test_out_dash_is_stdout(db: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "orchard_rec.cli", "export", "--out", "-", "--db", db],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert sorted(x["session_id"] for x in rows) == ["alpha", "beta"]
    assert "wrote 2 samples" in r.stderr and not (tmp_path / "-").exists()


def test_outputs_never_replace_a_device_and_get_umask_permissions(tmp_path: Path, db: str) -> None:
    rc, out = cli("export", "--out", "/dev/null", "--db", db)
    assert rc == 0, out
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    rc, out = cli("export", "--out", str(fifo), "--db", db)
    got = reader.communicate(timeout=30)[0]
    assert rc == 0 and len(got.splitlines()) == 2 and stat.S_ISFIFO(os.stat(fifo).st_mode)
    old = os.umask(0o022)
    try:
        assert cli("export", "--out", str(tmp_path / "o.jsonl"), "--db", db)[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "o.jsonl").st_mode) == 0o644


# -- looking at calls -------------------------------------------------------------------------------------------


def test_calls_json_has_request_and_response_and_sessions_has_the_outcome(db: str) -> None:
    store = Store(db)
    store.write_batch(
        [
            call(
                "alpha",
                request={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
                response={"id": "r1"},
            )
        ]
    )
    store.close()
    rc, out = cli("calls", "alpha", "--json", "--db", db)
    rows = json.loads(out)
    assert (
        rc == 0
        and rows[-1]["request"]["messages"][0]["content"] == "hi"
        and rows[-1]["response"] == {"id": "r1"}
    )
    cli("outcome", "alpha", "--reward", "1", "--status", "completed", "--db", db)
    rc, out = cli("sessions", "--db", db)
    header, *lines = out.splitlines()
    assert header.split("\t")[:6] == ["session", "calls", "status", "reward", "model", "tokens"]
    alpha = next(x.split("\t") for x in lines if x.startswith("alpha"))
    assert alpha[1:3] == ["2", "completed"] and float(alpha[3]) == 1.0
    rc, out = cli("sessions", "--limit", "1", "--db", db)
    assert len(out.splitlines()) == 3 and "--limit 0" in out  # header, the newest, the note
    rc, out = cli("sessions", "--status", "completed", "--json", "--db", db)
    assert [s["id"] for s in json.loads(out)] == ["alpha"]


def test_show_plain_and_json(db: str) -> None:
    rc, out = cli("show", "alpha", "--plain", "--db", db)
    assert rc == 0 and "<train>3 4 </train>" in out
    rc, out = cli("show", "alpha", "--json", "--db", db)
    assert rc == 0 and json.loads(out)["tokens"] == [1, 2, 3, 4]


def test_version_and_list_formats() -> None:
    rc, out = cli("--version")
    assert rc == 0 and out.startswith("orchard-rec ")
    rc, out = cli("export", "--list-formats")
    assert rc == 0 and "trl-grpo" in out and "GRPOTrainer" in out and "orchard_rec.exporters" not in out


# -- litter -------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_leaves_no_temp_folder_unless_kept(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "orchard_rec.cli", "demo", "--mode", "tito"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []  # no orchard-demo-*, no orchard-tok-*
    r = subprocess.run(
        [sys.executable, "-m", "orchard_rec.cli", "demo", "--keep"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0 and "kept: " in r.stderr
    [kept] = tmp_path.iterdir()
    assert (kept / "orchard.db").exists()
    shutil.rmtree(kept)
