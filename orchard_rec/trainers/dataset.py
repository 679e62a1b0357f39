"""Torch datasets over recorded samples (the ``train`` extra: ``torch==2.13.0``).

``OrchardDataset`` is map-style over an export file (jsonl, indexed by line offsets so only
the offsets stay in memory) and ``OrchardIterableDataset`` streams from the database or a
file. Each item holds, over the full sequence (prompt + response):
``input_ids``, ``labels`` (-100 wherever the loss mask is 0, prompt included),
``loss_mask``, ``attention_mask``, ``position_ids``, ``rollout_log_probs`` (0.0 off the
response), ``token_weights`` (credit weights, 1.0 where credited without weights) and
``advantages`` when an ``advantage_fn`` is given (a number broadcast over the response,
or one value per response token).

``collate`` right-pads a batch; ``collate_packed`` packs several samples into one row with
per-sample ``position_ids`` restarting at 0 and ``cu_seqlens`` marking the boundaries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import torch
from torch.utils.data import Dataset, IterableDataset

from orchard_rec.errors import UsageError
from orchard_rec.reconstruct import Sample

if TYPE_CHECKING:
    from orchard_rec.selection import Selection

__all__ = ["OrchardDataset", "OrchardIterableDataset", "collate", "collate_packed", "sample_tensors"]

AdvantageFn = Callable[[Sample], "float | Sequence[float] | None"]


def sample_tensors(s: Sample, advantage_fn: AdvantageFn | None = None) -> dict[str, torch.Tensor]:
    p, n = s.prompt_length, len(s.tokens)
    mask = [0] * p + list(s.loss_mask)
    weights = [0.0] * p + (
        list(s.token_weights) if s.token_weights is not None else [float(m) for m in s.loss_mask]
    )
    item = {
        "input_ids": torch.tensor(s.tokens, dtype=torch.long),
        "labels": torch.tensor([t if m else -100 for t, m in zip(s.tokens, mask)], dtype=torch.long),
        "loss_mask": torch.tensor(mask, dtype=torch.long),
        "attention_mask": torch.ones(n, dtype=torch.long),
        "position_ids": torch.arange(n, dtype=torch.long),
        "rollout_log_probs": torch.tensor([0.0] * p + list(s.rollout_log_probs), dtype=torch.float32),
        "token_weights": torch.tensor(weights, dtype=torch.float32),
    }
    if advantage_fn is not None:
        adv = advantage_fn(s)
        if adv is not None:
            resp = (
                [float(adv)] * s.response_length if isinstance(adv, (int, float)) else [float(a) for a in adv]
            )
            if len(resp) != s.response_length:
                raise ValueError(
                    f"advantage_fn gave {len(resp)} values for response_length {s.response_length}"
                )
            item["advantages"] = torch.tensor([0.0] * p + resp, dtype=torch.float32)
    return item


class OrchardDataset(Dataset):
    """Map-style over a jsonl export (``orchard-rec export --format jsonl``)."""

    def __init__(self, path: str | Path, advantage_fn: AdvantageFn | None = None) -> None:
        self.path = Path(path)
        self.advantage_fn = advantage_fn
        self.offsets: list[int] = []
        with open(self.path, "rb") as f:
            pos = 0
            for line in f:
                if line.strip():
                    self.offsets.append(pos)
                pos += len(line)

    def __len__(self) -> int:
        return len(self.offsets)

    def sample(self, i: int) -> Sample:
        with open(self.path, "rb") as f:
            f.seek(self.offsets[i])
            return Sample.from_dict(orjson.loads(f.readline()))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return sample_tensors(self.sample(i), self.advantage_fn)


class OrchardIterableDataset(IterableDataset):
    """Streams from the database (``db=``, reconstructing as it goes) or a jsonl file (``path=``)."""

    def __init__(
        self,
        *,
        db: str | None = None,
        path: str | Path | None = None,
        advantage_fn: AdvantageFn | None = None,
        selection: Selection | None = None,
        **options: Any,
    ) -> None:
        """``selection`` (``orchard_rec.selection.Selection``) and ``options`` (its fields, or
        ``iter_samples``' other keywords): which samples ``db=`` streams."""
        if (db is None) == (path is None):
            raise UsageError("give exactly one of db= or path=")
        self.db, self.path, self.advantage_fn = db, path, advantage_fn
        self.selection, self.options = selection, options

    def samples(self) -> Iterator[Sample]:
        if self.path is not None:
            from orchard_rec.exporters.jsonl import read_jsonl

            yield from read_jsonl(Path(self.path), images=False)  # tensors only: no image bytes
            return
        from orchard_rec.pipeline import iter_samples
        from orchard_rec.storage.store import Store

        store = Store(self.db)  # type: ignore[arg-type]
        try:
            yield from iter_samples(store, self.selection, **self.options)
        finally:
            store.close()

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        for k, s in enumerate(self.samples()):
            if info is None or k % info.num_workers == info.id:
                yield sample_tensors(s, self.advantage_fn)


_PAD = {"labels": -100}


def collate(batch: list[dict[str, torch.Tensor]], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence: pad id for inputs, -100 for labels, 0 elsewhere."""
    width = max(item["input_ids"].numel() for item in batch)
    out: dict[str, torch.Tensor] = {}
    for key in batch[0]:
        fill = pad_token_id if key == "input_ids" else _PAD.get(key, 0)
        rows = []
        for item in batch:
            t = item[key]
            rows.append(torch.cat([t, torch.full((width - t.numel(),), fill, dtype=t.dtype)]))
        out[key] = torch.stack(rows)
    return out


def collate_packed(
    batch: list[dict[str, torch.Tensor]], max_tokens: int | None = None, pad_token_id: int = 0
) -> dict[str, torch.Tensor]:
    """Pack samples into rows of at most ``max_tokens`` (default: all in one row).

    Adds ``cu_seqlens`` (per row, padded with the row length) so attention can be kept
    within each sample; ``position_ids`` restart at 0 for every sample.
    """
    limit = max_tokens or sum(item["input_ids"].numel() for item in batch)
    rows: list[list[dict[str, torch.Tensor]]] = [[]]
    used = 0
    for item in batch:
        n = item["input_ids"].numel()
        if n > limit:
            raise ValueError(f"a sample of {n} tokens does not fit max_tokens={limit}")
        if used + n > limit:
            rows.append([])
            used = 0
        rows[-1].append(item)
        used += n
    packed = []
    bounds = []
    for row in rows:
        merged = {k: torch.cat([it[k] for it in row]) for k in row[0]}
        merged["position_ids"] = torch.cat([torch.arange(it["input_ids"].numel()) for it in row])
        packed.append(merged)
        cu = [0]
        for it in row:
            cu.append(cu[-1] + it["input_ids"].numel())
        bounds.append(cu)
    out = collate(packed, pad_token_id)
    longest = max(len(b) for b in bounds)
    out["cu_seqlens"] = torch.tensor([b + [b[-1]] * (longest - len(b)) for b in bounds], dtype=torch.long)
    return out
