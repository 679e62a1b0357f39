"""Writers of training data in each trainer's format, registered by name.

``get("jsonl").write(samples, path)``; ``available()`` lists the formats, including
those other packages register under the entry-point group ``orchard_rec.exporters``.

Owns: the exporter interface and registry (``base``), the trainers' data contracts in one
place (``contracts``: slime's ``Sample`` fields, verl's ``AgentLoopOutput``), one module per
format family, the chat view of a sample (``conversation``) and database → file
(``pipeline``). May import: ``reconstruct``, ``records``, ``errors``, ``dialects``, and (in
``pipeline`` only) ``orchard_rec.pipeline`` and ``storage``. Never ``proxy``, ``intercept``
or ``trainers`` (``tests/test_layering.py``). Each format imports only what it needs: the
jsonl-based ones (``jsonl``, ``openrlhf``, ``slime-sft``) need neither pyarrow nor torch;
the parquet ones need pyarrow (the ``parquet`` extra); ``slime`` imports torch when it writes
(the ``train`` extra). ``dataset`` writes a partitioned parquet dataset to any fsspec
filesystem (``export --out s3://...``, the ``objstore`` extra) and ``ray_engine`` shards that
export over a Ray cluster (the ``ray`` extra, imported only with ``--engine ray``); ``upload``
puts any format's files at a URL that names a file.
"""

from orchard_rec.errors import ExportError
from orchard_rec.exporters.base import (
    EXPORTERS,
    Exporter,
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
