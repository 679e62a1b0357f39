"""``slime`` and ``slime-sft``.

``slime``: torch files that slime's ``--load-debug-rollout-data`` loads:
``torch.load(path.format(rollout_id=...), weights_only=False)["samples"]``, each dict
passed to ``Sample.from_dict`` (slime/ray/rollout.py ``_get_rollout_data``). The file is
``{"rollout_id": int, "samples": [Sample.to_dict(), ...]}`` with exactly slime's fields
(``exporters.contracts``). ``--out`` may hold ``{rollout_id}``; with
``rollout_size`` the samples are split into files of that many samples, rollout ids
0, 1, ... (``out_0.pt, out_1.pt`` when ``--out`` has no template). torch is needed only
here, at write time (the ``train`` extra). Samples are pickled one at a time as they come
(without ``rollout_size`` too): memory holds one sample (one session when it has images, see
below) and the file's pickled bytes.

Runs and images, as Orchard's GUI recipe lays them out (MSR-Orchard/slime
``examples/orchard_gui/generate_browser.py``): every sample of a session carries the same
``group_id`` (the fork's rollout id; the export index of the session's first sample), and a
sample with images carries ``multimodal_inputs = {"images": [PIL.Image RGB, ...]}`` in prompt
order (``contracts``). When a harness dropped old screenshots, reconstruction split the session
into per-turn samples (``metadata.images_dropped``); their metadata then gets Orchard's
turn-level keys: ``turn_index`` (0, 1, ... within the session), ``is_last_turn`` and
``num_turns_in_trajectory`` (for ``--turn-level-loss-equal-turn-weight``), so a session
whose first sample has images is held in memory until its last sample.
``multimodal_train_inputs`` (``pixel_values``, ``image_grid_thw``) needs the model's processor:
it stays None, as in every sample that does not come from slime's own rollout, for the
trainer to compute.

``slime-sft``: jsonl rows ``{"messages": [...], "tools": [...]}`` for slime's SFT path,
each message with ``step_loss_mask`` (1 on assistant turns the credit policy trains on,
0 elsewhere), as slime's ``MultiTurnLossMaskGenerator`` reads it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from orchard_rec.errors import ExportError
from orchard_rec.exporters.base import ExportStats, atomic_output
from orchard_rec.exporters.contracts import slime_runs, to_slime_dict
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
        it = slime_runs(samples)
        size = self.rollout_size
        chunks: Iterator[Iterable[tuple[Sample, int]]] = (
            iter(lambda: list(islice(it, size)), []) if size else iter([it])
        )
        many = size is not None
        for k, chunk in enumerate(chunks):
            rollout_id = self.first_rollout_id + k
            if "{rollout_id}" in str(out):
                path = Path(str(out).format(rollout_id=rollout_id))
            elif many:
                path = out.with_name(f"{out.stem}_{k}{out.suffix}")
            else:
                path = out
            payload = {"rollout_id": rollout_id, "samples": _Streamed(_slime_dicts(chunk, stats))}
            with atomic_output(path) as f:
                torch.save(payload, f, pickle_module=_MemolessPickle)
            stats.files.append(path)
        return stats


def _slime_dicts(samples: Iterable[tuple[Sample, int]], stats: ExportStats) -> Iterator[dict[str, Any]]:
    import torch

    for s, run in samples:
        stats.add(s)
        row = to_slime_dict(s, prompt=s.messages_prompt(), response="", group_id=run)
        if row.get("teacher_log_probs") is not None:  # Orchard's fork holds them as a float32 tensor
            row["teacher_log_probs"] = torch.tensor(row["teacher_log_probs"], dtype=torch.float32)
        yield row


class _Streamed:
    """Pickles as a plain list whose items come from an iterator, one at a time."""

    def __init__(self, items: Iterator[Any]) -> None:
        self.items = items

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (list, (), None, self.items)


class _MemolessPickle:
    """``torch.save``'s pickle module, with the pickler's memo off (``fast``): the memo keeps
    every pickled dict and list alive until the end, which held all samples of a one-file
    export in memory (1.9 GB for 10k samples); without it only the pickled bytes accumulate.
    Sample dicts share nothing and hold no cycles, so nothing needs the memo."""

    class Pickler(pickle.Pickler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.fast = True

    Unpickler = pickle.Unpickler


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
