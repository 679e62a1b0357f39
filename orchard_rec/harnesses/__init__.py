"""Harness plug-ins: how each agent harness is installed, redirected, recognised and
grouped into sessions, its side conversations and probes, and its history quirks.

One small module per harness (data plus ``config_snippet``/``prepare`` hooks), all listed in
``HARNESSES`` (order = recognition order, most specific first); ``identify`` names the
harness and session of a request from that data (the proxy's recording core calls it),
``run_harness`` runs one against a proxy and reports the outcome.

May import: the standard library, orjson, ``orchard_rec.harnesses.*`` and ``orchard_rec.dialects``
(a request body is read by its wire dialect, never by its shape here); nothing of the
proxy, storage or reconstruction (they import this package, not the other way round).
"""

from orchard_rec.harnesses.base import Harness, Launch, RunResult, SideConversation, post_outcome, run_harness
from orchard_rec.harnesses.claude_code import CLAUDE_CODE
from orchard_rec.harnesses.codex import CODEX
from orchard_rec.harnesses.gemini_cli import GEMINI_CLI
from orchard_rec.harnesses.hermes import HERMES
from orchard_rec.harnesses.identify import identify, is_probe, side_conversation
from orchard_rec.harnesses.install import install, installed
from orchard_rec.harnesses.kimi import KIMI
from orchard_rec.harnesses.openclaw import OPENCLAW
from orchard_rec.harnesses.opencode import OPENCODE
from orchard_rec.harnesses.pi import PI
from orchard_rec.harnesses.zeroclaw import ZEROCLAW

HARNESSES = (CLAUDE_CODE, CODEX, OPENCODE, KIMI, PI, OPENCLAW, HERMES, ZEROCLAW, GEMINI_CLI)
BY_NAME = {h.name: h for h in HARNESSES}


def get(name: str) -> Harness:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown harness {name!r}; known: {', '.join(BY_NAME)}") from None


__all__ = [
    "BY_NAME",
    "CLAUDE_CODE",
    "CODEX",
    "GEMINI_CLI",
    "HARNESSES",
    "HERMES",
    "KIMI",
    "OPENCLAW",
    "OPENCODE",
    "PI",
    "ZEROCLAW",
    "Harness",
    "Launch",
    "RunResult",
    "SideConversation",
    "get",
    "identify",
    "install",
    "installed",
    "is_probe",
    "post_outcome",
    "run_harness",
    "side_conversation",
]
