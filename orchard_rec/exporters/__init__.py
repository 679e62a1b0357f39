"""Writers of training data in each trainer's format, registered by name.

``get("jsonl").write(samples, path)``; ``available()`` lists the formats, including
those other packages register under the entry-point group ``orchard_rec.exporters``.
"""

from orchard_rec.exporters.base import (
    EXPORTERS,
    Exporter,
    ExportError,
    ExportStats,
    atomic_output,
    available,
    get,
)
from orchard_rec.exporters.jsonl import JsonlExporter, read_jsonl

__all__ = [
    "EXPORTERS",
    "ExportError",
    "ExportStats",
    "Exporter",
    "JsonlExporter",
    "atomic_output",
    "available",
    "get",
    "read_jsonl",
]
