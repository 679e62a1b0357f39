"""Issue 37, items 1 and 4: no output path can damage a database or a stranger's file, and every
export is atomic, all its parts together (an empty selection, an error and Ctrl-C leave the
earlier output as it was).

On main before the fix: ``export --out orchard.db`` turned the database into JSONL (rc 0),
``show --html orchard.db`` did the same; a filter keeping nothing left ``keep.jsonl`` at 0 bytes;
a ``--rollout-size`` set was renamed file by file; Ctrl-C inside ``import torch`` either exited
130 without a word or said "needs torch: pip install" (rc 1).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import call, two_session_store

from orchard_rec.exporters.base import atomic_output, output_set
from orchard_rec.outputs import OutputRefused, check_output
from orchard_rec.storage import Store
from tests.cli.test_mistakes import assert_short, cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'orchard.db'}"
    store = two_session_store(url)
    store.close()
    return url


def _names(folder: Path) -> list[str]:
    """The files in ``folder`` but the database's own (orchard.db, -wal, -shm)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("orchard.db"))


def _still_a_database(path: Path) -> None:
    with sqlite3.connect(path) as con:
        assert con.execute("select count(*) from sessions").fetchone()[0] == 2


@pytest.mark.parametrize("name", ["orchard.db", "orchard.db-wal", "orchard.db-shm"])
def test_export_refuses_the_database_and_its_companions(tmp_path: Path, db: str, name: str) -> None:
    target = tmp_path / name
    before = target.read_bytes() if target.exists() else None
    rc, out = cli("export", "--out", name, "--db", db, "--force", cwd=tmp_path)
    assert rc == 2 and "is the database" in out, out
    assert len(out.strip().splitlines()) == 1
    assert (target.read_bytes() if target.exists() else None) == before
    _still_a_database(tmp_path / "orchard.db")


def test_show_html_refuses_the_database(tmp_path: Path, db: str) -> None:
    rc, out = cli("show", "alpha", "--html", "orchard.db", "--db", db, cwd=tmp_path)
    assert rc == 2 and "is the database" in out, out
    _still_a_database(tmp_path / "orchard.db")


def test_any_sqlite_file_is_refused_even_with_force(tmp_path: Path, db: str) -> None:
    other = tmp_path / "notes.bin"
    shutil.copy(tmp_path / "orchard.db", other)
    for args in (("export", "--out", str(other)), ("show", "alpha", "--html", str(other))):
        rc, out = cli(*args, "--force", "--db", db)
        assert rc == 2 and "is a SQLite database" in out, out
        assert_short(out)
    assert other.read_bytes() == (tmp_path / "orchard.db").read_bytes()


def test_a_stranger_file_is_replaced_only_with_force(tmp_path: Path, db: str) -> None:
    mine = tmp_path / "data.jsonl"
    mine.write_text('{"prompt": "my own dataset"}\n')
    rc, out = cli("export", "--out", str(mine), "--db", db)
    assert rc == 2 and "not an earlier orchard-rec output" in out and "--force" in out, out
    assert mine.read_text() == '{"prompt": "my own dataset"}\n'
    rc, out = cli("export", "--out", str(mine), "--db", db, "--force")
    assert rc == 0 and "wrote 2 samples" in out, out


@pytest.mark.parametrize(
    ("fmt", "name"),
    [("jsonl", "a.jsonl"), ("openrlhf", "a.jsonl"), ("parquet", "a.parquet"), ("value", "a.parquet")],
)
@pytest.mark.slow  # > 0.5 s: the fast tier stays under a minute
def test_our_own_earlier_output_is_replaced_without_force(
    tmp_path: Path, db: str, fmt: str, name: str
) -> None:
    out_file = tmp_path / name
    for _ in range(2):
        rc, out = cli("export", "-f", fmt, "--out", str(out_file), "--db", db)
        assert rc == 0 and "wrote 2 samples" in out, out


def test_show_html_replaces_its_own_page_but_not_a_stranger(tmp_path: Path, db: str) -> None:
    page = tmp_path / "p.html"
    for _ in range(2):
        rc, out = cli("show", "alpha", "--html", str(page), "--db", db)
        assert rc == 0, out
    page.write_text("<html>my notes</html>")
    rc, out = cli("show", "alpha", "--html", str(page), "--db", db)
    assert rc == 2 and "not an earlier orchard-rec output" in out, out


def test_check_output_rules(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    check_output(tmp_path / "missing.jsonl", db_url=url)
    (tmp_path / "empty.jsonl").touch()
    check_output(tmp_path / "empty.jsonl", db_url=url)
    with pytest.raises(OutputRefused):
        check_output(tmp_path / "x.db-journal", db_url=url, force=True)
    with pytest.raises(OutputRefused):  # the database through another spelling of its path
        check_output(tmp_path / "sub" / ".." / "x.db", db_url=url, force=True)


# -- item 4: atomic, all parts together ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("--status", "aborted"),
        ("--min-reward", "5"),
        ("--group-by", "session", "--filter", "nonzero-std"),
    ],
)
@pytest.mark.parametrize(("fmt", "name"), [("jsonl", "keep.jsonl"), ("parquet", "keep.parquet")])
def test_a_filter_keeping_nothing_leaves_the_earlier_output(
    tmp_path: Path, db: str, args: tuple[str, ...], fmt: str, name: str
) -> None:
    out_file = tmp_path / name
    assert cli("export", "-f", fmt, "--out", str(out_file), "--db", db)[0] == 0
    before = out_file.read_bytes()
    rc, out = cli("export", "-f", fmt, "--out", str(out_file), "--db", db, *args)
    assert rc == 1 and "nothing written" in out and "wrote 0" not in out, out
    assert out_file.read_bytes() == before
    assert _names(tmp_path) == [name]  # no temp file left


def test_a_filter_keeping_nothing_creates_nothing(tmp_path: Path, db: str) -> None:
    rc, out = cli("export", "--out", str(tmp_path / "new.jsonl"), "--db", db, "--min-reward", "5")
    assert rc == 1 and not (tmp_path / "new.jsonl").exists(), out


def test_a_multi_file_set_is_renamed_together_or_not_at_all(tmp_path: Path) -> None:
    parts = [tmp_path / f"r_{k}.pt" for k in range(3)]
    for p in parts:
        p.write_bytes(b"old")
    with pytest.raises(RuntimeError), output_set():
        for k, p in enumerate(parts):
            with atomic_output(p) as f:
                f.write(b"new")
            if k == 1:
                raise RuntimeError("the third part failed")
    assert [p.read_bytes() for p in parts] == [b"old"] * 3
    with output_set() as outputs:
        for p in parts:
            with atomic_output(p) as f:
                f.write(b"new")
        assert [p.read_bytes() for p in parts] == [b"old"] * 3  # nothing renamed before the commit
        outputs.commit()
    assert [p.read_bytes() for p in parts] == [b"new"] * 3
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name for p in parts]


def test_a_part_that_may_not_be_replaced_stops_the_whole_set(tmp_path: Path, db: str) -> None:
    pytest.importorskip("torch")
    first = tmp_path / "r_0.pt"
    stranger = tmp_path / "r_1.pt"
    rc, out = cli("export", "-f", "slime", "--out", str(tmp_path / "r_{rollout_id}.pt"), "--db", db)
    assert rc == 0, out
    before = first.read_bytes()
    stranger.write_text("not ours")
    rc, out = cli(
        "export",
        "-f",
        "slime",
        "--rollout-size",
        "1",
        "--out",
        str(tmp_path / "r_{rollout_id}.pt"),
        "--db",
        db,
    )
    assert rc == 2 and "r_1.pt exists and is not an earlier orchard-rec output" in out, out
    assert first.read_bytes() == before and stranger.read_text() == "not ours"
    assert _names(tmp_path) == ["r_0.pt", "r_1.pt"]


def test_image_sidecar_waits_for_the_commit(tmp_path: Path) -> None:
    from orchard_rec.dialects.images import ImageRef
    from orchard_rec.exporters.images import ImageSidecar

    folder = tmp_path / "s.jsonl.images"
    ref = ImageRef(digest="ab" * 32, mime="image/png", data=b"png bytes")
    with output_set() as outputs:
        path = ImageSidecar(folder, tmp_path).path_of(ref)
        assert not folder.exists()
        outputs.discard()
    assert not folder.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    with output_set() as outputs:
        path = ImageSidecar(folder, tmp_path).path_of(ref)
        outputs.commit()
    assert (tmp_path / str(path)).read_bytes() == b"png bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl.images"]


# -- Ctrl-C: a real SIGINT to a real process ---------------------------------------------------------------------

_POKE = """
import os, signal, sys, threading, time
def poke():
    while {module!r} not in sys.modules:
        time.sleep(0.0002)
    time.sleep({delay})
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=poke, daemon=True).start()
from orchard_rec.cli import main
sys.argv = ["orchard-rec", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "module"), [("slime", "torch"), ("parquet", "pyarrow")])
def test_ctrl_c_during_the_import_and_the_write(tmp_path: Path, db: str, fmt: str, module: str) -> None:
    """SIGINT at several moments from the start of ``import torch`` (``pyarrow``) on: always
    "interrupted" and 130 (or a finished export), the earlier output untouched, no temp file."""
    pytest.importorskip(module)
    name = "r.pt" if fmt == "slime" else "r.parquet"
    out_file = tmp_path / name
    assert cli("export", "-f", fmt, "--out", str(out_file), "--db", db)[0] == 0
    before = out_file.read_bytes()
    outcomes = []
    for delay in (0.0, 0.05, 0.3):
        script = tmp_path / "poke.py"
        script.write_text(_POKE.format(module=module, delay=delay))
        r = subprocess.run(
            [sys.executable, str(script), "export", "-f", fmt, "--out", str(out_file), "--db", db],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
        outcomes.append(r.returncode)
        assert r.returncode in (130, 0), r.stderr
        assert "terminate called" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        if r.returncode == 130:
            assert r.stderr.strip().splitlines()[-1] == "interrupted", r.stderr
            assert "wrote" not in r.stderr and "pip install" not in r.stderr
            assert out_file.read_bytes() == before
        assert _names(tmp_path) == sorted([name, "poke.py"])
    assert 130 in outcomes


@pytest.mark.slow
def test_ctrl_c_while_writing_leaves_no_partial_set(tmp_path: Path) -> None:
    """Interrupted between two parts of a set: nothing renamed, no temp file, 130."""
    url = f"sqlite:///{tmp_path / 'orchard.db'}"
    store = Store(url)
    store.upgrade()
    store.write_batch([call(f"s{i}", prompt_ids=[1] * 2000, completion_ids=[2] * 500) for i in range(400)])
    store.close()
    template = str(tmp_path / "r_{rollout_id}.pt")
    args = ["export", "-f", "slime", "--rollout-size", "20", "--out", template, "--db", url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert (
        subprocess.run([sys.executable, "-m", "orchard_rec.cli", *args], env=env, timeout=300).returncode == 0
    )
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("r_*.pt")}
    assert len(before) == 20
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchard_rec.cli", *args], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().endswith("interrupted"), err
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("r_*.pt")} == before
    assert [n for n in _names(tmp_path) if not n.startswith("r_")] == []


def test_interrupt_deferred_holds_ctrl_c_until_the_block_ends() -> None:
    from orchard_rec.signals import interrupt_deferred

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupt_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler has run by now: it only noted the signal
            reached.append(True)
    assert reached == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
