"""The registry of wire dialects: one line per built-in dialect, plus the entry-point group.

``BUILTIN`` lists the dialect objects by import path (``module:ATTRIBUTE``); a package outside
orchard-rec adds one through the entry-point group ``orchard_rec.dialects`` (its value the same
kind of path). Order matters where routes or ``claims`` overlap: the first dialect wins. An
entry point that fails to load is logged and left out, never fatal (the proxy still serves the others).
"""

from __future__ import annotations

import functools
import importlib
import logging
from importlib.metadata import entry_points

from orchard_rec.dialects.base import WireDialect

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "registered"]

log = logging.getLogger("orchard_rec.dialects")

BUILTIN: tuple[str, ...] = (
    "orchard_rec.dialects.chat:DIALECT",
    "orchard_rec.dialects.completions:DIALECT",
    "orchard_rec.dialects.responses:DIALECT",
    "orchard_rec.dialects.anthropic:DIALECT",
    "orchard_rec.dialects.gemini:DIALECT",
)
"""The dialects orchard-rec ships, by import path."""

ENTRY_POINT_GROUP = "orchard_rec.dialects"


def _load(path: str) -> WireDialect:
    module, _, attr = path.partition(":")
    obj = getattr(importlib.import_module(module), attr or "DIALECT")
    if not isinstance(obj, WireDialect):
        raise TypeError(f"{path} is not a WireDialect")
    return obj


@functools.cache
def registered() -> dict[str, WireDialect]:
    """Every dialect by name: the built-in ones, then the entry points' (a name taken is kept)."""
    out = {d.name.value: d for d in map(_load, BUILTIN)}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            d = ep.load()
            if not isinstance(d, WireDialect):
                raise TypeError(f"{ep.value} is not a WireDialect")
        except Exception:  # a broken plug-in must not take the proxy down
            log.exception("dialect entry point %s could not be loaded", ep.name)
            continue
        out.setdefault(d.name.value, d)
    return out
