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

Runs and images, as Orchard's GUI recipe lays them out (MSR-Orchard/slime at 331efaa,
``examples/orchard_gui/generate_browser.py``): every sample of a session carries the same
``group_id`` (the fork's rollout id; the export index of the session's first sample). A session
whose first sample has images is held in memory until its last sample and written one sample per
turn, with ``turn_index`` = the turn's step, ``is_last_turn`` and ``num_turns_in_trajectory`` on
each (``contracts.slime_runs``). A sample with images carries ``multimodal_inputs = {"images":
[PIL.Image RGB, ...]}`` in prompt order and ``multimodal_train_inputs``, the model's image
processor's output for them (``pixel_values``, ``image_grid_thw`` as torch tensors), as the
fork's ``_encode_with_processor`` keeps its processor's output but ``input_ids`` and
``attention_mask``: the fork's ``--load-debug-rollout-data`` path computes nothing, so without
it the model never sees the images. ``processor`` names it: a model folder or hub id
(``transformers.AutoImageProcessor``), or ``demo`` (the demo VLM's Qwen2-VL geometry); images
without one are an error. With ``teacher_fill`` (set by the export pipeline when the database
holds teacher log-probs), a sample the teacher did not cover gets zeros under an all-zero
``teacher_valid_mask``, as the fork's SWE post-processing fills it, so the file trains.

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

    def __init__(
        self,
        rollout_size: int | None = None,
        rollout_id: int = 0,
        processor: str | None = None,
        teacher_fill: bool = False,
    ) -> None:
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
        self.processor = processor
        self.teacher_fill = teacher_fill

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
            rows = _slime_dicts(chunk, stats, _Processor(self.processor), self.teacher_fill)
            payload = {"rollout_id": rollout_id, "samples": _Streamed(rows)}
            with atomic_output(path) as f:
                torch.save(payload, f, pickle_module=_MemolessPickle)
            stats.files.append(path)
        return stats


def _slime_dicts(
    samples: Iterable[tuple[Sample, int]], stats: ExportStats, processor: _Processor, teacher_fill: bool
) -> Iterator[dict[str, Any]]:
    import torch

    for s, run in samples:
        stats.add(s)
        row = to_slime_dict(
            s, prompt=s.messages_prompt(), response="", group_id=run, teacher_fill=teacher_fill
        )
        if row.get("teacher_log_probs") is not None:  # Orchard's fork holds them as a float32 tensor
            row["teacher_log_probs"] = torch.tensor(row["teacher_log_probs"], dtype=torch.float32)
        if row["multimodal_inputs"]:
            row["multimodal_train_inputs"] = processor.train_inputs(s, row["multimodal_inputs"]["images"])
        yield row


class _Processor:
    """The model's image processor, loaded on the first sample with images."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        self._proc: Any = None

    def train_inputs(self, s: Sample, images: list[Any]) -> dict[str, Any]:
        if self.name is None:
            raise ExportError(
                f"sample {s.index} of session {s.session_id} shows images: slime trains on them only with "
                "the model's processor output; pass --processor MODEL (a model folder, a hub id or 'demo')"
            )
        if self._proc is None:
            self._proc = _load_processor(self.name)
        out = self._proc(images=images, return_tensors="pt")
        return {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}


def _load_processor(name: str) -> Any:
    try:
        if name == "demo":
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

            from orchard_rec.demo.vision import VisionConfig

            vc = VisionConfig()
            return Qwen2VLImageProcessorPil(
                min_pixels=vc.min_pixels,
                max_pixels=vc.max_pixels,
                patch_size=vc.patch_size,
                merge_size=vc.merge_size,
                temporal_patch_size=vc.temporal_patch_size,
            )
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(name)
    except ImportError as exc:
        raise ExportError("--processor needs transformers: pip install 'orchard-rec[hf]'") from exc
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot load the image processor {name!r}: {exc}") from exc


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
