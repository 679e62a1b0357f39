"""``verl`` and ``verl-sft``.

``verl``: parquet rows of verl's ``AgentLoopOutput`` fields, built by
``contracts.agent_loop_fields`` (the contract and its source are described there).
``AgentLoopOutput(**row)`` validates each row (pinned by a test).

``verl-sft``: parquet rows ``messages`` + ``tools`` (nested values, not JSON text) for verl's
multi-turn SFT dataset, assistant messages flagged with ``loss`` by the credit policy; the
column design and its limits are described on ``VerlSftExporter``.

Images: ``verl`` rows of samples with images carry them in an ``images`` column (a ``datasets``
``List(Image())`` feature, ``columnar``; present when the export has images): verl's
``RLHFDataset`` reads ``image_key = "images"`` entries that are PIL images or dicts with
``bytes`` (``vision_utils.process_image``), and ``AgentLoopOutput.multi_modal_data`` is
``{"images": row["images"]}`` once loaded (``contracts.agent_loop_fields`` builds it in process).
``verl-sft``: each image part of a message becomes the ``<image>`` placeholder in its text, in
order, and the row's ``images`` column holds the images, as ``MultiTurnSFTDataset._build_messages``
pairs them (present only when the export has images: verl asserts a processor for any row of a
file with an ``images`` column).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from orchard_rec.errors import ExportError
from orchard_rec.exporters.base import ExportStats, atomic_output, output_set
from orchard_rec.exporters.columnar import signed, with_images, write_parquet
from orchard_rec.exporters.contracts import agent_loop_fields
from orchard_rec.exporters.conversation import turn_flagged_messages
from orchard_rec.exporters.teacher_columns import TEACHER_FIELDS, teacher_columns
from orchard_rec.protocol.content import template_text
from orchard_rec.reconstruct import Sample, numeric_reward

__all__ = [
    "IMAGE_PLACEHOLDER",
    "SFT_MESSAGE",
    "VERL_SCHEMA",
    "VerlExporter",
    "VerlSftExporter",
    "sft_message",
    "sft_text",
]

VERL_SCHEMA = pa.schema(
    [
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float64())),
        ("reward_score", pa.float64()),
        ("num_turns", pa.int32()),
        ("metrics", pa.struct([("generate_sequences", pa.float64()), ("tool_calls", pa.float64())])),
        (
            "extra_fields",
            pa.struct(
                [
                    ("session_id", pa.string()),
                    ("index", pa.int64()),
                    ("group_index", pa.int64()),
                    ("status", pa.string()),
                    ("call_ids", pa.list_(pa.string())),
                    ("token_source", pa.string()),
                    ("reward_json", pa.string()),
                    ("policy_versions", pa.list_(pa.string())),
                ]
            ),
        ),
        *TEACHER_FIELDS,
    ]
)


def _verl_row(s: Sample) -> dict[str, Any]:
    return {**agent_loop_fields(s, multi_modal=False), **teacher_columns(s)}


class VerlExporter:
    name = "verl"

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_parquet(samples, out, VERL_SCHEMA, _verl_row, images=True)


_TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
SFT_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        ("tool_calls", pa.list_(_TOOL_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
        ("loss", pa.int64()),
    ]
)
_SFT_COLUMNS = [
    ("session_id", pa.string()),
    ("index", pa.int64()),
    ("reward", pa.float64()),
]
# pass 1 holds the tools as JSON text until every tool set of the export has been seen
_PASS1_SCHEMA = pa.schema([("messages", pa.list_(SFT_MESSAGE)), ("tools_json", pa.string()), *_SFT_COLUMNS])

log = logging.getLogger(__name__)


IMAGE_PLACEHOLDER = "<image>"
"""Where an image sits in a message's text, for verl's datasets (``re.split("(<image>|<video>)")``)."""

_IMAGE_PARTS = ("image_url", "input_image", "image")


def sft_text(content: Any) -> str | None:
    """Message content as text: text parts joined (as templates get it), each image part as
    ``<image>``; the text alone (``template_text``) when there is no image part."""
    if isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") in _IMAGE_PARTS for p in content
    ):
        return "".join(
            IMAGE_PLACEHOLDER if p.get("type") in _IMAGE_PARTS else (template_text([p]) or "")
            for p in content
            if isinstance(p, dict)
        )
    return template_text(content)


def sft_message(m: dict[str, Any]) -> dict[str, Any]:
    """A chat message in the fixed ``SFT_MESSAGE`` shape: content as text (parts joined, as
    templates get it, images as ``<image>``), tool-call arguments as the JSON text OpenAI sends;
    other keys dropped."""
    calls = None
    if m.get("tool_calls"):
        calls = []
        for tc in m["tool_calls"]:
            fn = tc.get("function") or {}
            args = fn.get("arguments")
            calls.append(
                {
                    "id": tc.get("id"),
                    "type": tc.get("type", "function"),
                    "function": {
                        "name": fn.get("name"),
                        "arguments": args
                        if args is None or isinstance(args, str)
                        else orjson.dumps(args).decode(),
                    },
                }
            )
    return {
        "role": m.get("role"),
        "content": sft_text(m.get("content")),
        "reasoning_content": m.get("reasoning_content"),
        "tool_calls": calls,
        "tool_call_id": m.get("tool_call_id"),
        "name": m.get("name"),
        "loss": m.get("loss"),
    }


class VerlSftExporter:
    """``verl-sft``: rows ``messages`` (list of ``SFT_MESSAGE`` structs) + ``tools`` (list of
    structs) + ``session_id``/``index``/``reward``, for verl's ``MultiTurnSFTDataset``
    (``verl/utils/dataset/multiturn_sft_dataset.py``): it ``pd.read_parquet``s the file, turns
    ``messages`` and ``tools`` into lists of dicts (``convert_nested_value_to_list_recursive``)
    and hands them to ``tokenizer.apply_chat_template``. JSON text would reach the template as a
    string, so both are nested parquet values.

    A parquet struct has one fixed set of keys, and every absent key comes back as ``None``.
    Messages therefore use one fixed struct holding only what chat templates read (``role``,
    ``content``, ``reasoning_content``, ``tool_calls``, ``tool_call_id``, ``name``) plus the
    ``loss`` flag; fields a message lacks are ``None``, which templates testing truthiness
    (``{% if message.tool_calls %}``: ChatML/Hermes/Qwen) render as if absent — templates that
    test ``is defined`` / ``'key' in message`` see every key. Tool-call ``arguments`` stay the JSON
    text OpenAI sends (an object would be a struct per argument set). Content parts are joined.

    Tools are JSON schemas of any shape, so no fixed struct holds them, and neither a ``map``
    (read back as a list of pairs) nor JSON text in a list (``apply_chat_template`` rejects a
    tool that is not a dict) reaches the template as a dict. The export runs in two passes:
    rows go to a temporary parquet with tools as JSON text, then the tools struct is inferred
    from the export's distinct tool sets and the final file is written. When every tool set
    has the same shape (one agent's tools) the loaded tools equal the recorded ones; when shapes
    differ, the union struct fills the missing keys with ``None`` (a tool shows its neighbours'
    parameter names as ``null``), and the export logs a warning naming how many tool sets
    changed — export such sets separately (``--session`` / filters) to keep them exact.

    verl's ``__getitem__`` renders the dataframe row's ``messages`` without that conversion,
    so nested lists (``tool_calls``) reach the template as numpy arrays, which recent
    ``transformers`` replace with a placeholder; any parquet list reads back that way, so that
    path is verl's to fix (its converted ``self.messages`` holds what this format promises).
    """

    name = "verl-sft"
    needs_messages = True

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        distinct: dict[str, None] = {}

        def row(s: Sample) -> dict[str, Any]:
            if s.messages is None:
                raise ExportError(f"sample {s.index} of session {s.session_id} has no messages to export")
            tools = orjson.dumps(s.tools or []).decode()
            distinct.setdefault(tools)
            messages = [sft_message(m) for m in turn_flagged_messages(s, "loss")]
            shown = sum((m["content"] or "").count(IMAGE_PLACEHOLDER) for m in messages)
            if shown != len(s.images):
                raise ExportError(
                    f"verl-sft: sample {s.index} of session {s.session_id} has {len(s.images)} images but its "
                    f"messages place {shown} {IMAGE_PLACEHOLDER} (an image inside a tool result the chat "
                    "view flattens, or the literal text); export it with jsonl, parquet or verl"
                )
            return {
                "messages": messages,
                "tools_json": tools,
                "session_id": s.session_id,
                "index": s.index,
                "reward": numeric_reward(s.reward),
            }

        with tempfile.TemporaryDirectory(prefix="orchard-verl-sft-") as tmp:
            first = Path(tmp) / "pass1.parquet"
            with output_set() as scratch:  # a scratch file, renamed now (not with the export's outputs)
                stats = write_parquet(samples, first, _PASS1_SCHEMA, row, images=True)
                scratch.commit()
            tools_type = self._tools_type(list(distinct))
            schema = pa.schema([("messages", pa.list_(SFT_MESSAGE)), ("tools", tools_type), *_SFT_COLUMNS])
            images = "images" in pq.read_schema(first).names
            if images:
                schema = with_images(schema)
            schema = signed(schema)
            with atomic_output(Path(out)) as f:
                writer = pq.ParquetWriter(f, schema, compression="zstd")
                try:
                    for batch in pq.ParquetFile(first, pre_buffer=False).iter_batches(
                        batch_size=32 if images else 512
                    ):
                        tools = pa.array(
                            [orjson.loads(t) for t in batch.column("tools_json").to_pylist()], tools_type
                        )
                        cols = [batch.column("messages"), tools, *(batch.column(n) for n, _ in _SFT_COLUMNS)]
                        if images:
                            cols.append(batch.column("images"))
                        writer.write_table(pa.Table.from_arrays(cols, schema=schema))
                    if stats.samples == 0:
                        writer.write_table(schema.empty_table())
                finally:
                    writer.close()
        stats.files = [Path(out)]
        return stats

    @staticmethod
    def _tools_type(distinct: list[str]) -> pa.DataType:
        sets = [orjson.loads(t) for t in distinct]
        if not any(sets):
            return pa.list_(
                pa.struct([("type", pa.string()), ("function", pa.struct([("name", pa.string())]))])
            )
        try:
            arr = pa.array(sets)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ExportError(
                f"verl-sft: the tools' JSON schemas cannot share one parquet type ({exc}); "
                "export sessions with different tool sets separately"
            ) from exc
        changed = sum(1 for a, b in zip(arr.to_pylist(), sets) if a != b)
        if changed:
            log.warning(
                "verl-sft: %d of %d distinct tool sets differ in shape; parquet fills their missing "
                "keys with null — export them separately to keep the tools exact",
                changed,
                len(sets),
            )
        return arr.type
