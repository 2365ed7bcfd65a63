"""Train an attention-MIL head (gated attention, Ilse et al. 2018) on the bags of an embeddings output, on CPU or
GPUs, with an exact validation pass; one process or many under torchrun.

    wsishard embed SHARDS -o EMB --model mymodels:encoder
    python examples/train_mil.py EMB --steps 200 [--batch-size 8 --max-patches 512 --device cuda]
    torchrun --nproc_per_node=4 examples/train_mil.py EMB --steps 200

Training streams bags endlessly (resampled), each a random subset of at most ``--max-patches`` patches, classes
balanced (``weights="class"``); validation reads every slide exactly once over all ranks (``pad_last``: the
repeats padding the last batches are marked ``batch["valid"] == False`` and left out) with all of its patches.
The slides need labels (``wsishard build --labels``).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from wsishard import load_manifest, loader, stream


class GatedAttentionMIL(nn.Module):
    """Bags (B, N, D) with a mask (B, N) -> logits (B, classes): a gated attention pooling, then a linear head."""

    def __init__(self, dim: int, classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.attn_v, self.attn_u = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.attn_w = nn.Linear(hidden, 1)
        self.head = nn.Linear(hidden, classes)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(features)  # (B, N, H)
        scores = self.attn_w(torch.tanh(self.attn_v(h)) * torch.sigmoid(self.attn_u(h))).squeeze(-1)  # (B, N)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=1)  # padding gets no weight
        return self.head((weights.unsqueeze(-1) * h).sum(dim=1))  # (B, classes)


def validate(model: nn.Module, source: str, batch_size: int, device: torch.device) -> tuple[int, int]:
    """(correct, slides) over every slide once, summed over the ranks."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        ds = stream(source, batch_size=batch_size, resampled=False, pad_last=True, seed=0)
        for batch in loader(ds, num_workers=1):
            keep = batch["valid"] & (batch["label"] >= 0)
            logits = model(batch["features"].to(device), batch["mask"].to(device))
            correct += int((logits.argmax(1).cpu() == batch["label"])[keep].sum())
            total += int(keep.sum())
    counts = torch.tensor([correct, total])
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(counts)
    model.train()
    return int(counts[0]), int(counts[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="an embeddings output (wsishard embed)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8, help="slides per batch")
    p.add_argument("--max-patches", type=int, default=512, help="patches per bag per training draw")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    distributed = "RANK" in os.environ  # launched by torchrun
    if distributed:
        torch.distributed.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
    device = torch.device(args.device)
    manifest, _ = load_manifest(args.source)
    labels = [s.label for s in manifest.slides if s.label is not None]
    if not labels:
        raise SystemExit(f"{args.source}: no slide has a label (wsishard build --labels)")
    model: nn.Module = GatedAttentionMIL(int(manifest.extra["embed"]["dim"]), max(labels) + 1).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    train = stream(args.source, batch_size=args.batch_size, seed=0, weights="class", max_patches=args.max_patches)
    for step, batch in enumerate(loader(train, num_workers=args.workers), start=1):
        logits = model(batch["features"].to(device), batch["mask"].to(device))
        loss = F.cross_entropy(logits, batch["label"].to(device), ignore_index=-1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == args.steps:
            break
    correct, slides = validate(model, args.source, args.batch_size, device)
    if not distributed or torch.distributed.get_rank() == 0:
        print(
            json.dumps({"steps": args.steps, "loss": round(float(loss), 4), "val_correct": correct, "slides": slides})
        )
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
