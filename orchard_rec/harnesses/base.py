"""What every harness adapter provides, and the runner that uses it.

An adapter is data plus two small hooks: ``config_snippet`` (what a user pastes to point
the harness at the proxy) and ``prepare`` (a private home with that config, the command
line and the environment for one non-interactive run). ``run_harness`` starts the
process, waits, and reports the outcome to the proxy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

__all__ = ["Harness", "Launch", "RunResult", "default_cache", "post_outcome", "run_harness"]


def default_cache() -> Path:
    return Path(
        os.environ.get("ORCHARD_HARNESS_CACHE") or Path.home() / ".cache" / "orchard-rec" / "harnesses"
    )


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass
class RunResult:
    harness: str
    session_id: str
    exit_code: int
    duration_s: float
    stdout: str
    stderr: str
    workdir: Path


@dataclass(frozen=True)
class Harness:
    name: str
    npm: tuple[str, ...]
    """Pinned npm packages the harness installs from (tested versions)."""
    dialect: str
    """The wire API it speaks by default."""
    session_headers: tuple[str, ...]
    """Headers by which its requests name their session (none: use the ``/s/{id}`` route)."""
    on_mismatch: str = "split"
    """The reconstruction policy that keeps its sessions whole."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    # -- hooks ------------------------------------------------------------------------------

    def base_url(self, proxy: str, session: str | None) -> str:
        root = proxy.rstrip("/") + (f"/s/{session}" if session else "")
        return root if self.dialect == "messages" else root + "/v1"

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        raise NotImplementedError

    def prepare(
        self,
        home: Path,
        workdir: Path,
        proxy: str,
        session: str,
        model: str,
        args: list[str],
        binary: str | None,
    ) -> Launch:
        raise NotImplementedError

    def binary(self, explicit: str | None = None) -> str:
        """The harness executable: ``explicit``, ``$ORCHARD_<NAME>_BIN``, the install cache, or PATH."""
        env = os.environ.get(f"ORCHARD_{self.name.upper().replace('-', '_')}_BIN")
        for cand in (explicit, env, self.cached_binary(), self.path_binary()):
            if cand and Path(cand).exists():
                return cand
        if not self.npm:
            raise FileNotFoundError(
                f"{self.name} is not installed: it ships as a binary outside the npm registry; put it on PATH or pass --bin"
            )
        raise FileNotFoundError(f"{self.name} is not installed: orchard-rec harness install {self.name}")

    def cached_binary(self) -> str | None:
        return None

    def path_binary(self) -> str | None:
        return None


def _base_env(home: Path) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if k in ("PATH", "LANG", "LC_ALL", "TERM", "SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS")
    }
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {**keep, "HOME": str(home), "TMPDIR": str(tmp), "CI": "1", "NO_COLOR": "1"}


def post_outcome(proxy: str, session: str, outcome: dict[str, Any], api_key: str | None = None) -> None:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(
        f"{proxy.rstrip('/')}/sessions/{session}/outcome",
        data=orjson.dumps({"create": True, **outcome}),  # this run is the session, calls or not
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


def run_harness(
    harness: Harness,
    proxy: str,
    session: str,
    args: list[str],
    *,
    model: str = "orchard-model",
    workdir: Path | None = None,
    home: Path | None = None,
    binary: str | None = None,
    timeout: float = 300.0,
    report: bool = True,
) -> RunResult:
    """Run the harness once, pointed at ``proxy`` under ``session``; report exit and duration."""
    import tempfile

    home = home or Path(tempfile.mkdtemp(prefix=f"orchard-{harness.name}-home-"))
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"orchard-{harness.name}-work-"))
    workdir.mkdir(parents=True, exist_ok=True)
    launch = harness.prepare(home, workdir, proxy, session, model, args, binary)
    env = {**_base_env(home), **launch.env}
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            launch.argv,
            env=env,
            cwd=launch.cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, _s(exc.stdout), _s(exc.stderr) + f"\ntimed out after {timeout}s"
    duration = time.monotonic() - t0
    if report:
        post_outcome(
            proxy,
            session,
            {
                "status": "completed" if code == 0 else ("aborted" if code == 124 else "failed"),
                "metadata": {"harness": harness.name, "exit_code": code, "duration_s": round(duration, 3)},
            },
        )
    return RunResult(harness.name, session, code, duration, out, err, workdir)


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else (v or "")


def which(name: str) -> str | None:
    return shutil.which(name)
