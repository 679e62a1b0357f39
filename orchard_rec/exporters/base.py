"""The exporter interface, the registry of formats, and the shared file discipline.

An exporter writes an iterable of samples to a path and never holds more than one
batch of them. Formats are registered by import path, so ``--format jsonl`` never
imports torch or pyarrow; an external package adds its own through the entry-point
group ``orchard_rec.exporters``. Output is atomic: written to a temp file beside the
target, then renamed, so a failure never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import IO, Any, Protocol

from orchard_rec.errors import ExportError
from orchard_rec.reconstruct import Sample

__all__ = ["EXPORTERS", "ExportError", "ExportStats", "Exporter", "atomic_output", "available", "get"]


@dataclass
class ExportStats:
    samples: int = 0
    tokens: int = 0
    files: list[Path] = field(default_factory=list)

    def add(self, s: Sample) -> None:
        self.samples += 1
        self.tokens += len(s.tokens)


class Exporter(Protocol):
    name: str

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats: ...


EXPORTERS: dict[str, str] = {
    "jsonl": "orchard_rec.exporters.jsonl:JsonlExporter",
    "parquet": "orchard_rec.exporters.parquet:ParquetExporter",
    "slime": "orchard_rec.exporters.slime:SlimeExporter",
    "slime-sft": "orchard_rec.exporters.slime:SlimeSftExporter",
    "verl": "orchard_rec.exporters.verl:VerlExporter",
    "verl-sft": "orchard_rec.exporters.verl:VerlSftExporter",
    "trl": "orchard_rec.exporters.trl:TrlExporter",
    "trl-grpo": "orchard_rec.exporters.trl:TrlGrpoExporter",
    "openrlhf": "orchard_rec.exporters.openrlhf:OpenRLHFExporter",
    "value": "orchard_rec.exporters.value:ValueExporter",
}


def available() -> dict[str, str]:
    """Built-in formats plus those registered by other packages' entry points."""
    found = dict(EXPORTERS)
    with contextlib.suppress(Exception):
        for ep in entry_points(group="orchard_rec.exporters"):
            found.setdefault(ep.name, ep.value)
    return found


def get(name: str, **options: Any) -> Exporter:
    known = available()
    if name not in known:
        raise ExportError(f"unknown format {name!r}; known formats: {', '.join(sorted(known))}")
    module, _, attr = known[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ExportError(
            f"format {name!r} needs a package that is not installed ({exc.name}): {_install_hint(exc.name)}"
        ) from exc
    return cls(**options)


def _install_hint(module: str | None) -> str:
    extra = {"torch": "train", "transformers": "hf"}.get((module or "").split(".")[0])
    return f"pip install 'orchard-rec[{extra}]'" if extra else f"pip install {module}"


@contextlib.contextmanager
def atomic_output(out: Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write to a temp file in the target's folder; rename over the target only on success.

    ``-`` is stdout, and an existing target that is not a regular file (a FIFO, ``/dev/stdout``,
    a terminal) is written in place: a rename would replace the device or pipe with a file. A
    symlink to a regular file is followed. The new file gets the usual permissions (the target's
    if it existed, else 0666 minus the umask), not the temp file's 0600.
    """
    out = Path(out)
    if str(out) == "-":
        stream = sys.stdout.buffer if "b" in mode else sys.stdout
        yield stream
        stream.flush()
        return
    if out.exists() and (not out.is_file() or str(out).startswith(("/dev/", "/proc/"))):
        if out.is_dir():
            raise ExportError(f"cannot write {out}: it is a folder")
        with open(out, mode.replace("w", "a") if out.is_char_device() else mode) as f:
            yield f
        return
    if out.is_symlink():
        out = out.resolve()
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        raise ExportError(f"cannot write {out}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ExportError(f"cannot write {out}: folder {parent} is not writable")
    try:
        perms = stat.S_IMODE(os.stat(out).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        perms = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), perms)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
