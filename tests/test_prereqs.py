"""The test command sets itself up (issue 37): ``prereqs.ensure`` installs what the selected
tests need and the machine lacks, once, says so, stops with one line when an install fails,
and installs nothing under ``ORCHARD_TEST_INSTALL=0``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import prereqs
import pytest


class _Item:
    """What ``ensure`` reads of a collected test: its markers and fixtures."""

    def __init__(self, *markers: str, fixtures: tuple[str, ...] = ()) -> None:
        self.markers = set(markers)
        self.fixturenames = fixtures

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None


def _need(tmp_path: Path, command: list[str]) -> prereqs.Need:
    flag = tmp_path / "installed"
    return prereqs.Need("the widget", prereqs._marked("widget"), flag.exists, command)


def test_installs_what_a_selected_test_needs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(prereqs.OPT_OUT, raising=False)
    need = _need(tmp_path, [sys.executable, "-c", f"open({str(tmp_path / 'installed')!r}, 'w')"])
    said: list[str] = []
    assert prereqs.ensure([_Item("slow")], said.append, [need]) == []  # nobody needs it: not even checked
    assert not (tmp_path / "installed").exists() and said == []
    assert prereqs.ensure([_Item("widget")], said.append, [need]) == ["the widget"]
    assert (tmp_path / "installed").exists() and "test setup: the widget installed" in said[-1]
    said.clear()
    assert prereqs.ensure([_Item("widget")], said.append, [need]) == [] and said == []  # present: nothing


def test_a_failed_install_stops_the_run_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(prereqs.OPT_OUT, raising=False)
    need = _need(tmp_path, [sys.executable, "-c", "import sys; sys.exit('no route to the registry')"])
    with pytest.raises(pytest.exit.Exception) as exc:
        prereqs.ensure([_Item("widget")], lambda _: None, [need])
    msg = str(exc.value)
    assert "\n" not in msg and "installing the widget failed" in msg and "no route to the registry" in msg
    assert f"{prereqs.OPT_OUT}=0" in msg and exc.value.returncode == pytest.ExitCode.USAGE_ERROR


def test_opting_out_installs_nothing_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(prereqs.OPT_OUT, "0")
    need = _need(tmp_path, [sys.executable, "-c", f"open({str(tmp_path / 'installed')!r}, 'w')"])
    said: list[str] = []
    assert prereqs.ensure([_Item("widget")], said.append, [need]) == ["the widget"]
    assert not (tmp_path / "installed").exists() and said == [
        "test setup: ORCHARD_TEST_INSTALL=0, not installing: the widget"
    ]


def test_the_real_needs_are_checked_in_milliseconds() -> None:
    """On a machine that has everything, the checks cost the run nothing noticeable."""
    start = time.monotonic()
    for need in prereqs.NEEDS:
        need.present()
    assert time.monotonic() - start < 2.0
    assert {n.name for n in prereqs.NEEDS} == {
        "PostgreSQL server binaries",
        "Chromium",
        "harness CLIs",
        "intercept runtime",
        "vLLM venv",
    }
