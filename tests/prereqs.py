"""What the selected tests need beyond ``pip install -e '.[dev]'``, set up before the first test.

The README's test command, ``pip install -e '.[dev]' -c constraints.txt && python -m pytest``,
passes on a fresh machine because pytest installs what is missing here, after collection and
only for the tests selected (the fast tier, ``-m "not slow"``, needs none of the big ones):

==================  =================================================  ====================================
need                present when                                       installed by
==================  =================================================  ====================================
PostgreSQL          ``initdb`` (``/usr/lib/postgresql/*/bin``, PATH)   ``apt-get install postgresql``
Chromium            ``$ORCHARD_CHROMIUM`` (``/usr/bin/chromium``)      ``apt-get install chromium``
harness CLIs        every installable harness in its cache folder      ``orchard-rec harness install all``
intercept runtime   mitmproxy importable, or its runtime venv built    ``orchard-rec intercept --install``
vLLM venv           ``tests/vllm/install.sh``'s markers                ``tests/vllm/install.sh``
==================  =================================================  ====================================

Each check is a file test (milliseconds); an install runs once and is reused by later runs
(``~/.cache/orchard-rec``; Debian's packages system-wide). A failed install stops the run with
one line naming what failed and how to do it by hand. ``ORCHARD_TEST_INSTALL=0`` installs
nothing: what is missing is listed in one warning line and the tests needing it fail as they would.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
OPT_OUT = "ORCHARD_TEST_INSTALL"
"""Set to 0 to install nothing."""


@dataclass(frozen=True)
class Need:
    name: str
    wanted: Callable[[pytest.Item], bool]
    """Does this test need it?"""
    present: Callable[[], bool]
    command: list[str]
    """What installs it (also what the failure line tells a person to run)."""
    apt: bool = False

    @property
    def shown(self) -> str:
        """The command as a person would type it."""
        if self.command[: len(_CLI)] == _CLI:
            return " ".join(["orchard-rec", *self.command[len(_CLI) :]])
        return " ".join(
            os.path.relpath(x, HERE.parent) if x.startswith(str(HERE)) else x for x in self.command
        )


def _has_postgres() -> bool:
    return bool(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or shutil.which("initdb") is not None


def _chromium() -> Path:
    return Path(os.environ.get("ORCHARD_CHROMIUM", "/usr/bin/chromium"))


def _has_harnesses() -> bool:
    from orchard_rec.harnesses import HARNESSES
    from orchard_rec.harnesses.install import installed

    return all(installed(h) for h in HARNESSES if h.installable)


def _has_intercept_runtime() -> bool:
    from orchard_rec.intercept import runtime

    return runtime.has_mitmproxy() or runtime.runtime_ready()


def _vllm_venv() -> Path:
    return Path(os.environ.get("ORCHARD_VLLM_VENV", Path.home() / ".cache" / "orchard-rec" / "vllm"))


def _has_vllm() -> bool:
    # install.sh's own fast path (markers and a fingerprint, no interpreter) is the real check:
    # present means both markers exist; install.sh then confirms in milliseconds or repairs.
    venv = _vllm_venv()
    return (venv / ".orchard-vllm-ok").is_file() and (venv / ".orchard-vllm-vlm-ok").is_file()


def _marked(name: str) -> Callable[[pytest.Item], bool]:
    return lambda item: item.get_closest_marker(name) is not None


def _uses(*fixtures: str) -> Callable[[pytest.Item], bool]:
    return lambda item: any(f in getattr(item, "fixturenames", ()) for f in fixtures)


_CLI = [sys.executable, "-m", "orchard_rec.cli"]

NEEDS = (
    Need(
        "PostgreSQL server binaries",
        lambda i: _marked("postgres")(i) or _uses("pg")(i),
        _has_postgres,
        ["apt-get", "install", "-y", "-qq", "postgresql"],
        apt=True,
    ),
    Need(
        "Chromium",
        lambda i: _marked("browser")(i) or _uses("browser_context", "page")(i),
        lambda: _chromium().exists(),
        ["apt-get", "install", "-y", "-qq", "chromium"],
        apt=True,
    ),
    Need("harness CLIs", _marked("harness"), _has_harnesses, [*_CLI, "harness", "install", "all"]),
    Need(
        "intercept runtime",
        _uses("intercept_cmd"),
        _has_intercept_runtime,
        [*_CLI, "intercept", "--install"],
    ),
    Need("vLLM venv", _marked("vllm"), _has_vllm, ["bash", str(HERE / "vllm" / "install.sh")]),
)


def _run(need: Need, say: Callable[[str], None]) -> None:
    start = time.monotonic()
    say(f"test setup: installing {need.name} ({need.shown}) ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = [["apt-get", "update", "-qq"], need.command] if need.apt else [need.command]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            why = ([x for x in (r.stderr + r.stdout).splitlines() if x.strip()] or [f"exit {r.returncode}"])[
                -1
            ]
            pytest.exit(
                f"test setup: installing {need.name} failed ({need.shown if cmd is need.command else ' '.join(cmd)}: "
                f"{why.strip()}); "
                f"install it by hand, or {OPT_OUT}=0 to run without installs",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )
    if not need.present():
        pytest.exit(
            f"test setup: {need.shown} ran but {need.name} is still missing",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
    say(f"test setup: {need.name} installed in {time.monotonic() - start:.0f} s")


def ensure(
    items: Iterable[pytest.Item], say: Callable[[str], None], needs: Iterable[Need] = NEEDS
) -> list[str]:
    """Install what ``items`` need and is missing; returns the names installed (or, opted out, missing)."""
    items = list(items)
    wanted = [n for n in needs if any(n.wanted(i) for i in items)]
    missing = [n for n in wanted if not n.present()]
    if not missing:
        return []
    if os.environ.get(OPT_OUT, "1") == "0":
        say(f"test setup: {OPT_OUT}=0, not installing: {', '.join(n.name for n in missing)}")
        return [n.name for n in missing]
    for need in missing:
        if need.apt and os.geteuid() != 0:
            pytest.exit(
                f"test setup: {need.name} is missing and installing it needs root: "
                f"sudo {need.shown} (or {OPT_OUT}=0 to run without it)",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )
        _run(need, say)
    return [n.name for n in missing]
