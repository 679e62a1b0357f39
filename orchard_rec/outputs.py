"""Which files a command may write over: never a database, and only its own earlier output.

Every command that writes a file (``export --out``, ``show --html``) asks :func:`check_output`
first, and an export asks again for each part of a multi-file output just before it renames
them into place. The rules:

- A database is never written over, ``--force`` or not: the ``--db`` URL's SQLite file and its
  ``-wal``, ``-shm`` and ``-journal`` companions, and any file that starts with SQLite's
  16-byte header (``SQLite format 3\\0``), whatever its name.
- A file that does not exist, or is empty, is written.
- An existing file is replaced only when it is this tool's own earlier output, recognised by
  its format's signature:

  - JSON lines (``jsonl``, ``slime-sft``, ``openrlhf``): the first line is a JSON object with a
    ``session_id`` or ``observation_tokens`` key;
  - parquet (``parquet``, ``verl``, ``verl-sft``, ``trl``, ``trl-grpo``, ``value``): the footer's
    key-value metadata holds ``orchard_rec`` (written since this rule; older exports need ``--force``);
  - slime ``.pt``: a torch zip archive whose pickled payload starts with the ``rollout_id`` key;
  - ``show --html`` pages: ``<meta name="generator" content="orchard-rec">`` in the head.

  Anything else (someone's dataset, a text file) is refused unless ``--force`` is given.
- A device, FIFO or ``-`` (stdout) is written in place, as before.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import orjson

from orchard_rec.errors import UsageError

__all__ = [
    "HTML_SIGNATURE",
    "PARQUET_SIGNATURE",
    "OutputRefused",
    "check_output",
    "database_files",
    "is_sqlite",
]

SQLITE_HEADER = b"SQLite format 3\x00"
HTML_SIGNATURE = '<meta name="generator" content="orchard-rec">'
PARQUET_SIGNATURE = b"orchard_rec"
"""The parquet footer metadata key every parquet export carries."""

_JSONL_KEYS = ("session_id", "observation_tokens")
_FIRST_LINE_BYTES = 1 << 24


class OutputRefused(UsageError):
    """An output path that would overwrite a database or a file that is not ours (exit code 2)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def database_files(db_url: str | None) -> set[Path]:
    """The files of a SQLite ``db_url`` (the database and its journal companions), resolved."""
    if not db_url or not db_url.startswith("sqlite"):
        return set()
    try:
        from sqlalchemy.engine import make_url

        name = make_url(db_url).database
    except Exception:
        return set()
    if not name or name == ":memory:":
        return set()
    base = Path(name).expanduser().resolve()
    return {base, *(base.with_name(base.name + s) for s in ("-wal", "-shm", "-journal"))}


def is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_HEADER
    except OSError:
        return False


def check_output(
    path: Path, *, db_url: str | None = None, force: bool = False, option: str = "--out"
) -> None:
    """Raise :class:`OutputRefused` when writing ``path`` would destroy something (module docstring)."""
    path = Path(path)
    if str(path) == "-":
        return
    resolved = path.expanduser().resolve()
    if resolved in database_files(db_url):
        raise OutputRefused(f"{option} {path} is the database (--db {db_url}): give another file name")
    if not path.exists() or not path.is_file():
        return  # missing (created), or a device/FIFO/folder (the writer decides)
    if is_sqlite(path):
        raise OutputRefused(f"{option} {path} is a SQLite database: give another file name")
    if force or path.stat().st_size == 0 or own_output(path):
        return
    raise OutputRefused(
        f"{option} {path} exists and is not an earlier orchard-rec output: give another file name, or --force to replace it"
    )


def own_output(path: Path) -> bool:
    """Whether ``path`` carries one of our formats' signatures (module docstring)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
            if head.startswith(b"PAR1"):
                return _own_parquet(path)
            if head.startswith(b"PK\x03\x04"):
                return _own_torch(path)
            if HTML_SIGNATURE.encode() in head:
                return True
            if head.lstrip().startswith(b"{"):
                f.seek(0)
                line = f.readline(_FIRST_LINE_BYTES)
                row = orjson.loads(line)
                return isinstance(row, dict) and any(k in row for k in _JSONL_KEYS)
    except (OSError, orjson.JSONDecodeError, ValueError):
        return False
    return False


def _own_parquet(path: Path) -> bool:
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
    except Exception:
        return False
    return PARQUET_SIGNATURE in meta


def _own_torch(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None:
                return False
            with z.open(name) as f:
                return b"rollout_id" in f.read(64)
    except (OSError, zipfile.BadZipFile):
        return False
