"""Feed recorded samples to a PyTorch training loop (pip install 'orchard-rec[train]')."""

import sys

from torch.utils.data import DataLoader

from orchard_rec.trainers.dataset import OrchardDataset, OrchardIterableDataset, collate, collate_packed

path = (
    sys.argv[1] if len(sys.argv) > 1 else "samples.jsonl"
)  # orchard-rec export --format jsonl --out samples.jsonl
ds = OrchardDataset(path, advantage_fn=lambda s: (s.reward or 0.0) - 0.5)  # map-style, shuffles
for batch in DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate):
    print({k: tuple(v.shape) for k, v in batch.items()})  # input_ids, labels (-100 off-mask), loss_mask, ...
    break
stream = OrchardIterableDataset(db="sqlite:///./orchard.db", group_by="task")  # straight from the database
for batch in DataLoader(stream, batch_size=4, collate_fn=lambda b: collate_packed(b, max_tokens=32768)):
    print(batch["cu_seqlens"])
    break
