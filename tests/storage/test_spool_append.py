"""The spool's append: what a failed append leaves behind, and the zeroed tail of a segment.

- A write or fsync that fails leaves the spool as it was before the append (its counts and its
  file): the next append's lines get the indexes the caller is told, and a replay reads them,
  not the failed batch's lines (which the caller sent elsewhere).
- A segment keeps zeros ahead of its last line (written once, then overwritten in place, so
  an fdatasync need not journal a size change): zeros are the end, a torn line before them is
  set aside, and files of earlier builds (no zeros) still read.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
from pathlib import Path

import orjson
import pytest

from orchard_rec.storage.spool import Spool


def _line(k: int, size: int = 40) -> bytes:
    return orjson.dumps({"_v": 3, "k": k, "pad": "x" * size})


def _ks(sp: Spool) -> list[tuple[int, int]]:
    lines, _ = sp.lines()
    return [(idx, orjson.loads(line)["k"]) for idx, line in lines]


@pytest.mark.parametrize("preallocate", [0, 1 << 16])
def test_a_failed_fsync_leaves_the_counts_and_the_file_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preallocate: int
) -> None:
    sp = Spool(tmp_path / "f.spool", preallocate=preallocate)
    assert sp.append_lines([_line(0)]) == 1
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync")}
    failures = []

    def failing(fd: int) -> None:
        failures.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    for name in real:
        monkeypatch.setattr(os, name, failing)
    with pytest.raises(OSError):
        sp.append_lines([_line(1), _line(2)])  # the caller sends these to the database instead
    for name, fn in real.items():
        monkeypatch.setattr(os, name, fn)
    assert failures
    assert (sp.end, sp.depth) == (1, 1)
    assert sp.append_lines([_line(3)]) == 2
    assert _ks(sp) == [(0, 0), (1, 3)]
    sp.ack(1)
    assert _ks(sp) == [(1, 3)]
    sp.close()
    reopened = Spool(tmp_path / "f.spool", preallocate=preallocate)
    assert _ks(reopened) == [(0, 0), (1, 3)]  # nothing of the failed batch comes back
    assert reopened.rejected == 0
    reopened.close()


@pytest.mark.parametrize("preallocate", [0, 1 << 16])
def test_a_write_cut_short_by_the_file_size_limit_leaves_no_part_line(
    tmp_path: Path, preallocate: int
) -> None:
    """A real short write (``RLIMIT_FSIZE``: the kernel writes up to the limit, then EFBIG)."""
    sp = Spool(tmp_path / "w.spool", preallocate=preallocate)
    sp.append_lines([_line(0)])
    size = (tmp_path / "w.spool").stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 3000, hard))
    try:
        with pytest.raises(OSError):
            sp.append_lines([_line(k, 100_000) for k in (1, 2)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert (sp.end, sp.depth) == (1, 1)
    assert sp.append_lines([_line(3)]) == 2
    assert _ks(sp) == [(0, 0), (1, 3)]
    sp.close()
    reopened = Spool(tmp_path / "w.spool", preallocate=preallocate)
    assert _ks(reopened) == [(0, 0), (1, 3)]
    assert reopened.rejected == 0
    reopened.close()


def _crashed(tmp_path: Path, sp: Spool, name: str) -> Spool:
    """The spool's files as a ``kill -9`` would leave them now (copied: the original stays locked)."""
    (tmp_path / name).mkdir()
    for f in sp.path.parent.glob(sp.path.name + "*"):
        (tmp_path / name / f.name).write_bytes(f.read_bytes())
    return Spool(tmp_path / name / sp.path.name)


def test_zeros_after_the_last_line_are_its_end_and_trimmed_at_close(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "z.spool", preallocate=1 << 16)
    sp.append_lines([_line(0), _line(1)])
    size = len(_line(0)) + len(_line(1)) + 2
    assert sp.path.stat().st_size == size + (1 << 16)  # zeros ahead, written once
    sp.append_lines([_line(2)])
    assert sp.path.stat().st_size == size + (1 << 16)  # overwritten in place: same length
    crashed = _crashed(tmp_path, sp, "c1.spool")
    assert _ks(crashed) == [(0, 0), (1, 1), (2, 2)] and crashed.rejected == 0
    assert crashed.append_lines([_line(3)]) == 4  # continues after the last line, not the zeros
    assert _ks(crashed) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    crashed.close()
    sp.ack(2)
    sp.close()
    assert sp.path.read_bytes() == b"".join(_line(k) + b"\n" for k in range(3))  # no zeros: what
    # an earlier build reads
    assert _ks(Spool(tmp_path / "c1.spool" / "z.spool")) == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_a_torn_append_into_the_zeros_is_set_aside_never_read_as_a_line(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "t.spool", preallocate=1 << 16)
    sp.append_lines([_line(0)])
    end = len(_line(0)) + 1
    sp.close()
    raw = bytearray((tmp_path / "t.spool").read_bytes().ljust(end + (1 << 16), b"\0"))
    torn = _line(1, 9000) + b"\n" + _line(2) + b"\n"
    # a crash mid-append: the batch's first page did not reach the disk, its later pages did
    page = 4096 - end % 4096
    raw[end + page : end + len(torn)] = torn[page:]
    (tmp_path / "t.spool").write_bytes(bytes(raw))
    sp = Spool(tmp_path / "t.spool", preallocate=1 << 16)
    assert _ks(sp) == [(0, 0)]
    assert sp.rejected == 1 and "torn line" in (sp.last_rejection or "")
    assert sp.append_lines([_line(3)]) == 2
    sp.close()
    again = Spool(tmp_path / "t.spool", preallocate=1 << 16)
    assert _ks(again) == [(0, 0), (1, 3)] and again.rejected == 0
    again.close()


def test_acknowledged_lines_are_zeroed_by_the_next_append(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "a.spool", preallocate=1 << 16)
    end = sp.append_lines([_line(k, 500) for k in range(3)])
    sp.ack(end)
    assert sp.depth == 0 and sp.lines() == ([], 3)
    # killed now: the stored lines come back, as after a truncation lost to a crash (idempotent)
    assert [k for _, k in _ks(_crashed(tmp_path, sp, "c1.spool"))] == [0, 1, 2]
    assert sp.append_lines([_line(3)]) == 4  # shorter than what it replaces
    assert _ks(sp) == [(3, 3)]
    assert _ks(_crashed(tmp_path, sp, "c2.spool")) == [(0, 3)]  # the stale lines are zeros now
    sp.close()
    assert (tmp_path / "a.spool").read_bytes() == _line(3) + b"\n"


def test_the_database_a_batch_behind_still_rotates_and_deletes_segments(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "r.spool", segment_bytes=2000, preallocate=4096)
    prev = 0
    for k in range(100):
        end = sp.append_lines([_line(k)])
        sp.ack(prev)
        prev = end
    assert len(list(tmp_path.iterdir())) <= 3, list(tmp_path.iterdir())
    assert _ks(sp) == [(99, 99)]
    crashed = _crashed(tmp_path, sp, "x.spool")  # the open segment alone: its zeros end it
    assert [k for _, k in _ks(crashed)][-1] == 99 and crashed.rejected == 0
    crashed.close()
    sp.close()
