"""orchard-rec: a harness-agnostic LLM recording proxy and trajectory toolkit.

Point an unmodified agent harness at the proxy; every model call is forwarded,
streamed back unchanged and recorded in SQL, ready to be rebuilt into token-level
training samples.
"""

from orchard_rec.records import CallOutcome, CallRecord, Dialect

__all__ = ["CallOutcome", "CallRecord", "Dialect", "__version__"]
__version__ = "0.1.0"
