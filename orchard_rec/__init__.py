"""orchard-rec: a harness-agnostic LLM recording proxy and trajectory toolkit.

Point an unmodified agent harness at the proxy; every model call is forwarded,
streamed back unchanged and recorded in SQL, ready to be rebuilt into token-level
training samples.

``__version__`` is the one place the version is written (``pyproject.toml`` reads it:
``dynamic = ["version"]``). Importing this package loads only ``records``.
"""

from orchard_rec.records import CallOutcome, CallRecord, Dialect

__all__ = ["CallOutcome", "CallRecord", "Dialect", "__version__"]
__version__ = "0.1.0"
