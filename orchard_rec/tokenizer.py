"""Loading a tokenizer by name or path, offline.

``demo`` is the bundled demo tokenizer; a folder or a ``tokenizer.json`` file loads with
``tokenizers``; anything else is tried with ``transformers.AutoTokenizer`` from local
files only (the ``hf`` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchard_rec.errors import UsageError

__all__ = ["load_hf_tokenizer", "load_tokenizer"]


def load_tokenizer(name_or_path: str) -> Any:
    """An object with ``decode(ids)`` (and ``encode``), for display and retokenization."""
    if name_or_path == "demo":
        from orchard_rec.demo.tokenizer import build_tokenizer

        return build_tokenizer()
    p = Path(name_or_path)
    from tokenizers import Tokenizer

    if p.is_file():
        return Tokenizer.from_file(str(p))
    if (p / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(p / "tokenizer.json"))
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise UsageError(
            f"no tokenizer.json at {name_or_path!r}, and transformers is not installed: pip install 'orchard-rec[hf]'"
        ) from exc
    return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)


def load_hf_tokenizer(name_or_path: str) -> Any:
    """A ``transformers`` tokenizer (with ``apply_chat_template``), from local files only."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise UsageError("retokenizing needs transformers: pip install 'orchard-rec[hf]'") from exc
    if name_or_path == "demo":
        import tempfile

        from orchard_rec.demo.tokenizer import save_tokenizer

        with tempfile.TemporaryDirectory(prefix="orchard-tok-") as folder:  # loaded whole: no file kept
            return AutoTokenizer.from_pretrained(str(save_tokenizer(folder)), local_files_only=True)
    return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
