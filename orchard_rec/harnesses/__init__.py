"""Adapters for agent harnesses: how each is redirected, tags sessions, and its quirks.

One small module per harness (data plus ``config_snippet``/``prepare`` hooks), all
listed in ``HARNESSES``; ``run_harness`` runs one against a proxy and reports the outcome.
"""

from orchard_rec.harnesses.base import Harness, Launch, RunResult, post_outcome, run_harness
from orchard_rec.harnesses.claude_code import CLAUDE_CODE
from orchard_rec.harnesses.codex import CODEX
from orchard_rec.harnesses.install import install, installed
from orchard_rec.harnesses.openclaw import OPENCLAW
from orchard_rec.harnesses.zeroclaw import ZEROCLAW

HARNESSES = (CODEX, CLAUDE_CODE, OPENCLAW, ZEROCLAW)
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
    "HARNESSES",
    "OPENCLAW",
    "ZEROCLAW",
    "Harness",
    "Launch",
    "RunResult",
    "get",
    "install",
    "installed",
    "post_outcome",
    "run_harness",
]
