"""The exporter interface, the registry of formats, and the shared file discipline.

An exporter writes an iterable of samples to a path and never holds more than one
batch of them. Formats are registered by import path, so ``--format jsonl`` never
imports torch or pyarrow; an external package adds its own through the entry-point
group ``orchard_rec.exporters``. Output is atomic: written to a temp file beside the
target, then renamed, so a failure never leaves a half-written file. Inside
:func:`output_set` (every CLI export) the renames wait for the end: all parts of a
multi-file output (slime's ``{rollout_id}`` files, the jsonl image folder) are renamed
together on :meth:`OutputSet.commit`, or all dropped on :meth:`OutputSet.discard` (an
export that kept no sample, an error, Ctrl-C), so an earlier output is never half replaced.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import IO, Any, Protocol

from orchard_rec.errors import ExportError
from orchard_rec.reconstruct import Sample
from orchard_rec.signals import interrupt_deferred

__all__ = [
    "EXPORTERS",
    "ExportError",
    "ExportStats",
    "Exporter",
    "OutputSet",
    "atomic_output",
    "available",
    "current_output_set",
    "get",
    "output_set",
]


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
        with interrupt_deferred():  # Ctrl-C inside ``import torch`` would abort the interpreter
            cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise ExportError(
            f"format {name!r} needs a package that is not installed ({exc.name}): {_install_hint(exc.name)}"
        ) from exc
    with interrupt_deferred():  # some import their library on construction (slime: torch)
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
        pending = _CURRENT.get()
        if pending is None:
            os.replace(tmp, out)
        else:
            pending.add(Path(tmp), out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class OutputSet:
    """The files of one export under temporary names, renamed into place together at the end.

    ``check``: called with each final path before any is renamed (``outputs.check_output``),
    so a part that may not be replaced stops the whole set, not half of it."""

    def __init__(self, check: Callable[[Path], None] | None = None) -> None:
        self.check = check
        self.files: list[tuple[Path, Path]] = []
        """``(temporary, final)`` per file."""
        self.folders: list[tuple[Path, Path]] = []
        """``(staging, final)`` per folder whose new files wait in ``staging``."""
        self.done = False

    def add(self, tmp: Path, final: Path) -> None:
        self.files.append((tmp, final))

    def staging(self, final: Path) -> Path:
        """A fresh folder beside ``final`` whose files move into ``final`` on commit."""
        for staging, target in self.folders:
            if target == final:
                return staging
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        os.chmod(staging, 0o777 & ~_umask())
        self.folders.append((staging, final))
        return staging

    def commit(self) -> None:
        """Rename every part into place (Ctrl-C waits until the last rename is done)."""
        if self.check is not None:
            for _, final in self.files:
                self.check(final)
        with interrupt_deferred():
            for staging, final in self.folders:
                final.mkdir(exist_ok=True)
                for f in staging.iterdir():
                    os.replace(f, final / f.name)
                staging.rmdir()
            for tmp, final in self.files:
                os.replace(tmp, final)
            self.folders.clear()
            self.files.clear()
            self.done = True

    def discard(self) -> None:
        """Remove every temporary part; the earlier output stays as it was."""
        for tmp, _ in self.files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        for staging, _ in self.folders:
            shutil.rmtree(staging, ignore_errors=True)
        self.files.clear()
        self.folders.clear()
        self.done = True


_CURRENT: contextvars.ContextVar[OutputSet | None] = contextvars.ContextVar("output_set", default=None)


def current_output_set() -> OutputSet | None:
    return _CURRENT.get()


@contextlib.contextmanager
def output_set(check: Callable[[Path], None] | None = None) -> Iterator[OutputSet]:
    """Collect the files written inside; the caller commits (or discards). Leaving without a
    commit, by an exception or Ctrl-C included, discards every part."""
    outputs = OutputSet(check)
    token = _CURRENT.set(outputs)
    try:
        yield outputs
    finally:
        _CURRENT.reset(token)
        if not outputs.done:
            outputs.discard()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
