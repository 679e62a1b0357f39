"""What every harness adapter provides, and the runner that uses it.

An adapter is data plus two small hooks: ``config_snippet`` (what a user pastes to point
the harness at the proxy) and ``prepare`` (a private home with that config, the command
line and the environment for one non-interactive run). ``run_harness`` starts the
process, waits, and reports the outcome to the proxy.

What a request body says (its instructions, first user message, tools) is read by its wire
dialect (``instructions_of``, ``first_user_text``, ``tool_names``: the dialect registry's),
never by its shape here, so a plug-in recognising a body works for every registered dialect,
Gemini's and one added by an entry point included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from orchard_rec import dialects
from orchard_rec.settings import Settings

__all__ = [
    "Harness",
    "Launch",
    "RunResult",
    "SideConversation",
    "default_cache",
    "first_user_text",
    "instructions_of",
    "post_outcome",
    "run_harness",
    "tool_names",
]


# What a request body says, read by its wire dialect (the dialect registry's readers, bound here
# under the names plug-ins import; ``identify`` runs them on every call, so no wrapper between):
# ``instructions_of(body, dialect=None)``, ``first_user_text(body, dialect=None)`` and
# ``tool_names(body, dialect=None)``: the call's ``dialect`` when given, else each registered
# dialect whose shape the body has; None when no dialect reads the body.
instructions_of = dialects.instructions_of
first_user_text = dialects.first_user_text
tool_names = dialects.tool_names_of


def default_cache() -> Path:
    return Path(Settings.one("harness_cache") or Path.home() / ".cache" / "orchard-rec" / "harnesses")


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass
class RunResult:
    harness: str
    session_id: str | None
    exit_code: int
    duration_s: float
    stdout: str
    stderr: str
    workdir: Path


@dataclass(frozen=True)
class SideConversation:
    """A conversation the harness holds for itself beside the agent's (a title, a summary...).

    Recognised by how its instructions (the first system/developer text) begin; its calls are
    recorded with ``metadata.auxiliary = kind`` and reconstruct into their own samples, flagged
    ``metadata.auxiliary = true``.
    """

    kind: str
    system_prefix: str


@dataclass(frozen=True)
class Harness:
    name: str
    npm: tuple[str, ...]
    """Pinned npm packages the harness installs from (tested versions)."""
    dialect: str
    """The wire API it speaks by default."""
    session_headers: tuple[str, ...]
    """Headers by which its requests name their session, first present wins (none: use the ``/s/{id}`` route)."""
    on_mismatch: str = "split"
    """The reconstruction policy that keeps its runs one exact sample."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    pypi: tuple[str, ...] = ()
    """Pinned PyPI packages, installed into a venv of their own (``python`` picks its interpreter)."""
    python: tuple[int, int, int] | None = None
    """The lowest Python the PyPI install runs on (a newer minor is taken when found)."""
    python_below: tuple[int, int] | None = None
    """The first Python minor it does not support."""
    version: str = ""
    """The tested version."""
    user_agents: tuple[str, ...] = ()
    """Lower-case ``User-Agent`` prefixes that name it."""
    header_marks: tuple[tuple[str, str], ...] = ()
    """``(header, value prefix)`` pairs that name it (an empty prefix: the header is present)."""
    tool_marks: tuple[str, ...] = ()
    """Tool names that, all offered together, name it (for harnesses with an SDK's user agent)."""
    session_fields: tuple[str, ...] = ()
    """Top-level request body fields that carry its session id (Kimi CLI ``prompt_cache_key``)."""
    side_conversations: tuple[SideConversation, ...] = ()
    side_headers: tuple[str, ...] = ()
    """Headers the harness itself puts on its side requests (the value is the kind)."""
    probes: tuple[str, ...] = ()
    """GET paths (after any ``/s/{id}``) it sends to learn what the server is: relayed, not recorded."""
    probe_agents: tuple[str, ...] = ()
    """Lower-case ``User-Agent`` prefixes its probes come with (empty: any)."""
    command: str = ""
    """Its executable's name on PATH (empty: not looked up on PATH)."""
    cache_bin: str = ""
    """Its executable under the install cache (``default_cache()``), as ``harness install`` lays it out."""
    history: str = ""
    """How it resends history, and the policy that keeps a run one exact sample (docs, ``harness config``)."""
    base_path: str = "/v1"
    """What its base URL has after the proxy's root: ``/v1`` for OpenAI-style clients; empty for
    SDKs that add their API's version themselves (Anthropic's ``/v1/messages``, Gemini's ``/v1beta/...``)."""

    # -- recognition --------------------------------------------------------------------------

    def recognises(self, headers: Mapping[str, str], body: Any = None) -> bool:
        """Whether this request comes from this harness (``headers``: lower-case names)."""
        return declared_match(self, headers.get("user-agent", "").lower(), headers, body)

    def session_of(self, headers: Mapping[str, str], body: Any = None) -> str | None:
        """The session id the harness itself sent, from its headers or body."""
        for h in self.session_headers:
            v = headers.get(h)
            if v:
                return v
        if isinstance(body, dict):
            for f in self.session_fields:
                v = body.get(f)
                if isinstance(v, str) and v:
                    return v
        return None

    def side_conversation(self, headers: Mapping[str, str], body: Any) -> str | None:
        """The kind of side conversation this request belongs to, or None for the agent's own."""
        for h in self.side_headers:
            v = headers.get(h)
            if v:
                return v[:64]
        if not self.side_conversations or not isinstance(body, dict):
            return None
        text = instructions_of(body)
        if text is None:
            return None
        for side in self.side_conversations:
            if text.startswith(side.system_prefix):
                return side.kind
        return None

    @property
    def installable(self) -> bool:
        return bool(self.npm or self.pypi)

    # -- hooks ------------------------------------------------------------------------------

    def base_url(self, proxy: str, session: str | None) -> str:
        """What the harness is given as its base URL: the proxy (under ``/s/{session}``) plus ``base_path``."""
        return proxy.rstrip("/") + (f"/s/{session}" if session else "") + self.base_path

    def config_snippet(self, proxy: str, session: str | None = None, model: str = "MODEL") -> str:
        raise NotImplementedError

    def prepare(
        self,
        home: Path,
        workdir: Path,
        proxy: str,
        session: str | None,
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
        if not self.installable:
            raise FileNotFoundError(
                f"{self.name} is not installed: it ships as a binary outside the npm registry and PyPI; put it on PATH or pass --bin"
            )
        raise FileNotFoundError(f"{self.name} is not installed: orchard-rec harness install {self.name}")

    def cached_binary(self) -> str | None:
        """Where ``orchard-rec harness install`` puts its executable (None: it does not install one)."""
        return str(default_cache() / self.cache_bin) if self.cache_bin else None

    def path_binary(self) -> str | None:
        """Its executable found on PATH, if any."""
        return which(self.command) if self.command else None


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
    session: str | None,
    args: list[str],
    *,
    model: str = "orchard-model",
    workdir: Path | None = None,
    home: Path | None = None,
    binary: str | None = None,
    timeout: float = 300.0,
    report: bool = True,
) -> RunResult:
    """Run the harness once, pointed at ``proxy`` under ``session`` (None: the plain base URL,
    the proxy groups calls by the harness's own session id); report exit and duration."""
    import tempfile

    home = home or Path(tempfile.mkdtemp(prefix=f"orchard-{harness.name}-home-"))
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"orchard-{harness.name}-work-"))
    workdir.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
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
    if report and session is not None:
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


def declared_match(harness: Harness, ua: str, headers: Mapping[str, str], body: Any = None) -> bool:
    """Whether what ``harness`` declares (user agents, header marks, tool marks) names this
    request: ``Harness.recognises`` of a plug-in that does not override it (``ua``: the lower-case
    ``User-Agent``, taken once per request by ``identify``; ``headers``: lower-case names)."""
    if harness.user_agents and ua.startswith(harness.user_agents):
        return True
    for h, prefix in harness.header_marks:
        v = headers.get(h)
        if v is not None and v.lower().startswith(prefix):
            return True
    if harness.tool_marks and isinstance(body, dict):
        names = tool_names(body)
        return (
            names is not None
            and len(names) >= len(harness.tool_marks)
            and set(names).issuperset(harness.tool_marks)
        )
    return False
