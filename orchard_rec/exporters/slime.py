"""``slime`` and ``slime-sft``.

``slime``: torch files that slime's ``--load-debug-rollout-data`` loads:
``torch.load(path.format(rollout_id=...), weights_only=False)["samples"]``, each dict
passed to ``Sample.from_dict`` (slime/ray/rollout.py ``_get_rollout_data``). The file is
``{"rollout_id": int, "samples": [Sample.to_dict(), ...]}`` with exactly slime's fields
(``exporters.contracts``). ``--out`` may hold ``{rollout_id}``; with
``rollout_size`` the samples are split into files of that many samples, rollout ids
0, 1, ... (``out_0.pt, out_1.pt`` when ``--out`` has no template). torch is needed only
here, at write time (the ``train`` extra). Memory holds one file's samples at a time.

``slime-sft``: jsonl rows ``{"messages": [...], "tools": [...]}`` for slime's SFT path,
each message with ``step_loss_mask`` (1 on assistant turns the credit policy trains on,
0 elsewhere), as slime's ``MultiTurnLossMaskGenerator`` reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

from orchard_rec.errors import ExportError
from orchard_rec.exporters.base import ExportStats, atomic_output
from orchard_rec.exporters.contracts import to_slime_dict
from orchard_rec.exporters.conversation import turn_flagged_messages
from orchard_rec.exporters.jsonl import write_jsonl_rows
from orchard_rec.reconstruct import Sample

__all__ = ["SlimeExporter", "SlimeSftExporter"]


class SlimeExporter:
    name = "slime"

    def __init__(self, rollout_size: int | None = None, rollout_id: int = 0) -> None:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise ExportError(
                "format 'slime' writes torch files and needs torch: pip install 'orchard-rec[train]'"
            ) from exc
        if rollout_size is not None and rollout_size < 1:
            raise ExportError("--rollout-size must be at least 1")
        self.rollout_size = rollout_size
        self.first_rollout_id = rollout_id

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        import torch

        out = Path(out)
        stats = ExportStats()
        it = iter(samples)
        size = self.rollout_size
        chunks = iter(lambda: list(islice(it, size)), []) if size else iter([list(it)])
        many = size is not None
        for k, chunk in enumerate(chunks):
            if not chunk and k > 0:
                break
            rollout_id = self.first_rollout_id + k
            if "{rollout_id}" in str(out):
                path = Path(str(out).format(rollout_id=rollout_id))
            elif many:
                path = out.with_name(f"{out.stem}_{k}{out.suffix}")
            else:
                path = out
            rows = [to_slime_dict(s, prompt=s.messages_prompt(), response="") for s in chunk]
            for row in rows:  # Orchard's fork holds the teacher log-probs as a float32 tensor
                if row["teacher_log_probs"] is not None:
                    row["teacher_log_probs"] = torch.tensor(row["teacher_log_probs"], dtype=torch.float32)
            payload = {"rollout_id": rollout_id, "samples": rows}
            with atomic_output(path) as f:
                torch.save(payload, f)
            for s in chunk:
                stats.add(s)
            stats.files.append(path)
        return stats


class SlimeSftExporter:
    name = "slime-sft"
    needs_messages = True

    def write(self, samples: Iterable[Sample], out: Path) -> ExportStats:
        return write_jsonl_rows(samples, out, _sft_row)


def _sft_row(s: Sample) -> dict[str, Any]:
    if s.messages is None:
        raise ExportError(f"sample {s.index} of session {s.session_id} has no messages to export")
    return {
        "messages": turn_flagged_messages(s, "step_loss_mask"),
        "tools": s.tools or [],
        "session_id": s.session_id,
        "index": s.index,
        "group_index": s.group_index,
        "reward": s.reward,
        "status": str(s.status),
    }
