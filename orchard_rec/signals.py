"""Ctrl-C held back while code that must not be interrupted runs.

Two places need it: the renames that put an export's files into place (all or none), and
imports of native libraries (torch, pyarrow, transformers). A KeyboardInterrupt raised inside
Python code that pybind11 called during ``import torch`` becomes a C++ exception nobody
catches: the interpreter aborts (``terminate called after throwing an instance of
'pybind11::error_already_set'``, exit -6) instead of exiting 130. Inside
:func:`interrupt_deferred` the signal is only noted, and raised as KeyboardInterrupt when the
block ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["interrupt_deferred"]


@contextlib.contextmanager
def interrupt_deferred() -> Iterator[None]:
    """SIGINT during the block is held and raised as KeyboardInterrupt after it (main thread only;
    elsewhere, or when SIGINT is not Python's default handler, the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt
