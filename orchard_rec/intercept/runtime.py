"""A runtime for ``intercept`` where the running Python cannot have mitmproxy.

mitmproxy 12 needs Python >= 3.12, and mitmproxy 11 (the last for 3.11) pins ``h11<=0.14``
while the openai SDK this package depends on needs ``h11>=0.16``: on Python 3.11 the two
cannot share an environment. So ``orchard-rec intercept --install`` builds a venv under
``~/.cache/orchard-rec/mitm`` (``$ORCHARD_MITM_CACHE``) and ``orchard-rec intercept``
re-executes itself from there when mitmproxy is not importable here:
- from a Python >= 3.12 found on the machine (or ``$ORCHARD_MITM_PYTHON``): this project with
  its ``mitm`` and ``postgres`` extras, i.e. ``mitmproxy==MITM_VERSION``;
- else from this Python (3.11): ``mitmproxy==MITM_311_VERSION`` with this project's
  dependencies less those the intercept path never imports (openai, tokenizers, pyarrow),
  which is what lets mitmproxy 11's pins resolve.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson

from orchard_rec.settings import Settings

__all__ = [
    "MITM_311_VERSION",
    "MITM_VERSION",
    "find_python",
    "has_mitmproxy",
    "install",
    "runtime_orchard",
    "runtime_ready",
]

MITM_VERSION = "12.3.1"
MITM_311_VERSION = "11.0.2"
_NOT_FOR_INTERCEPT = ("openai", "tokenizers", "pyarrow")


def _cache() -> Path:
    return Path(Settings.one("mitm_cache") or Path.home() / ".cache" / "orchard-rec" / "mitm")


def _source_root() -> Path | None:
    """The source tree this package runs from (an editable or source checkout), if any."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def has_mitmproxy() -> bool:
    return importlib.util.find_spec("mitmproxy") is not None


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_python() -> str | None:
    """A Python >= 3.12 on this machine: ``$ORCHARD_MITM_PYTHON``, on PATH, or in pyenv's versions folder."""
    if Settings.one("mitm_python"):
        return str(Settings.one("mitm_python"))
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

    return {
        "source": str(_source_root() or ""),
        "orchard_rec": version("orchard-rec"),
        "python": Settings.one("mitm_python"),
        "extras": "mitm,postgres,hf",  # hf: tito mode's tokenizer (a runtime built without it is rebuilt)
    }


def _intercept_requirements() -> list[str]:
    """This project's own dependencies that the intercept path imports (read from its metadata)."""
    from importlib.metadata import requires

    reqs = [r for r in requires("orchard-rec") or () if "extra ==" not in r]
    keep = [r for r in reqs if re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() not in _NOT_FOR_INTERCEPT]
    return keep + ["psycopg[binary]>=3.1"]


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
    found = find_python()
    modern = found is not None and (_version_of(found) or (0, 0)) >= (3, 12)
    python = found if modern and found is not None else sys.executable
    venv = _venv()
    venv_python = venv / "bin" / "python"
    if venv.exists() and (
        force or not venv_python.exists() or _version_of(str(venv_python)) != _version_of(python)
    ):
        shutil.rmtree(venv)
    if not venv_python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    root = _source_root()
    version = _stamp()["orchard_rec"]
    pip = [str(venv_python), "-m", "pip", "install", "--disable-pip-version-check"] + (
        ["-q"] if quiet else []
    )
    if modern:  # mitmproxy 12 with the project's own extras
        subprocess.run(
            pip
            + (
                ["-e", f"{root}[mitm,postgres,hf]"]
                if root is not None
                else [f"orchard-rec[mitm,postgres,hf]=={version}"]
            ),
            check=True,
        )
    else:  # Python 3.11: mitmproxy 11, and only what the intercept path imports
        subprocess.run(pip + [f"mitmproxy=={MITM_311_VERSION}", *_intercept_requirements()], check=True)
        subprocess.run(
            pip + ["--no-deps"] + (["-e", str(root)] if root is not None else [f"orchard-rec=={version}"]),
            check=True,
        )
    (_cache() / "stamp.json").write_bytes(orjson.dumps(_stamp()))
    return runtime_orchard()
