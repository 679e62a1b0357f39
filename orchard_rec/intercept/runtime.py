"""A runtime for ``intercept`` where the running Python cannot have mitmproxy.

mitmproxy 12 needs Python >= 3.12, and mitmproxy 11 (the last for 3.11) pins ``h11<=0.14``
while the openai SDK this package depends on needs ``h11>=0.16``: on Python 3.11 the two
cannot share an environment. So ``orchard-rec intercept --install`` builds a venv under
``~/.cache/orchard-rec/mitm`` (``$ORCHARD_MITM_CACHE``) from a Python >= 3.12 found on the
machine, with this project and ``mitmproxy==MITM_VERSION`` in it, and ``orchard-rec
intercept`` re-executes itself from there when mitmproxy is not importable here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson

__all__ = ["MITM_VERSION", "find_python", "has_mitmproxy", "install", "runtime_orchard", "runtime_ready"]

MITM_VERSION = "12.3.1"


def _cache() -> Path:
    return Path(os.environ.get("ORCHARD_MITM_CACHE") or Path.home() / ".cache" / "orchard-rec" / "mitm")


def _source_root() -> Path | None:
    """The source tree this package runs from (an editable or source checkout), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def has_mitmproxy() -> bool:
    return sys.version_info >= (3, 12) and importlib.util.find_spec("mitmproxy") is not None


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_python() -> str | None:
    """A Python >= 3.12 on this machine: on PATH, or in pyenv's versions folder."""
    names = [f"python3.{m}" for m in range(14, 11, -1)]
    candidates = [p for n in names if (p := shutil.which(n))]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        for d in sorted(pyenv.iterdir(), reverse=True):
            candidates.append(str(d / "bin" / "python"))
    candidates += [f"/usr/bin/python3.{m}" for m in range(14, 11, -1)]
    for c in candidates:
        if Path(c).exists() and (v := _version_of(c)) is not None and v >= (3, 12):
            return c
    return None


def _venv() -> Path:
    return _cache() / "venv"


def runtime_orchard() -> Path:
    return _venv() / "bin" / "orchard-rec"


def _stamp() -> dict[str, str]:
    from importlib.metadata import version

    return {"mitmproxy": MITM_VERSION, "source": str(_source_root() or ""), "orchard_rec": version("orchard-rec")}


def runtime_ready() -> bool:
    stamp = _cache() / "stamp.json"
    try:
        return runtime_orchard().exists() and orjson.loads(stamp.read_bytes()) == _stamp()
    except (OSError, orjson.JSONDecodeError):
        return False


def install(*, force: bool = False, quiet: bool = True) -> Path:
    """Build (or refresh) the runtime venv; returns its ``orchard-rec`` executable."""
    if not force and runtime_ready():
        return runtime_orchard()
    python = find_python()
    if python is None:
        raise RuntimeError("intercept needs mitmproxy, which needs Python >= 3.12, and none was found "
                           "(looked on PATH and in ~/.pyenv/versions); install one, or pip install "
                           "'orchard-rec[mitm]' into a Python >= 3.12 environment")
    venv = _venv()
    if force and venv.exists():
        shutil.rmtree(venv)
    if not (venv / "bin" / "python").exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    root = _source_root()
    target = ["-e", f"{root}[mitm,postgres]"] if root is not None else [f"orchard-rec[mitm,postgres]=={_stamp()['orchard_rec']}"]
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"] + (["-q"] if quiet else [])
    subprocess.run(pip + target, check=True)
    (_cache() / "stamp.json").write_bytes(orjson.dumps(_stamp()))
    return runtime_orchard()
