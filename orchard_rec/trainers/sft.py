"""A small reference loop for credit-assignment SFT: train only on credited tokens.

The loss is the per-token cross entropy weighted by ``token_weights`` (the credit
policy's weights; 1 on credited tokens, 0 elsewhere), summed and divided by the weight
total, so a token with mask 0 contributes nothing and receives no gradient. CPU-friendly:
meant to check a pipeline end to end and to read as the contract for a real trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from orchard_rec.errors import UsageError
from orchard_rec.reconstruct import Sample
from orchard_rec.trainers.dataset import collate, sample_tensors

__all__ = ["SftResult", "credited_loss", "train_sft"]


def credited_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, credited token count)``: next-token CE weighted by ``token_weights`` on the targets."""
    targets = batch["input_ids"][:, 1:]
    weights = batch["token_weights"][:, 1:] * (batch["labels"][:, 1:] != -100)
    ce = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none"
    ).view_as(targets)
    total = weights.sum()
    return (ce * weights).sum() / total.clamp_min(1e-8), (weights > 0).sum()


@dataclass
class SftResult:
    losses: list[float] = field(default_factory=list)
    credited_tokens: int = 0
    checkpoint: Path | None = None


def train_sft(
    model: Any,
    samples: Iterable[Sample],
    *,
    steps: int = 20,
    batch_size: int = 4,
    lr: float = 1e-3,
    pad_token_id: int = 0,
    out: Path | None = None,
    on_step: Callable[[int, float, int], None] | None = None,
) -> SftResult:
    """Train ``model`` (a causal LM returning ``.logits``) for ``steps`` steps over ``samples`` (cycled)."""
    items = [sample_tensors(s) for s in samples]
    if not items:
        raise UsageError("no samples to train on: the selection matched no session")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    result = SftResult()
    for step in range(steps):
        chunk = [items[(step * batch_size + k) % len(items)] for k in range(min(batch_size, len(items)))]
        batch = collate(chunk, pad_token_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss, n = credited_loss(logits, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        result.losses.append(float(loss.detach()))
        result.credited_tokens += int(n)
        if on_step is not None:
            on_step(step, float(loss), int(n))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(out)
        else:
            torch.save(model.state_dict(), out / "model.pt")
        result.checkpoint = out
    return result
