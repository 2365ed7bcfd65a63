"""Train a small CNN for a number of steps on a wsishard build output, on CPU or one GPU.

    python examples/train_single.py OUT --steps 200 [--batch-size 64 --workers 4 --device cuda]

OUT is a build output folder, its manifest.json, or a URL prefix (s3://bucket/prefix). The loop is
step-based (resampled mode: the stream never ends) and prints throughput and the data-wait fraction:
how much of each step the model spent waiting for the loader.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from wsishard import GpuCollate, MonitoredLoader, load_manifest, loader, stream

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_model(classes: int) -> nn.Module:
    """A small CNN: three strided conv blocks, global pooling, a linear head."""

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(
        *block(3, 16), *block(16, 32), *block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)
    )


class Targets:
    """What the model learns: the slide labels of a labelled build, else which slide each patch came from.

    Slide identification is a weakly supervised pretext task that needs no annotation (rotation prediction, the
    usual alternative, is meaningless for pathology, which has no canonical orientation).
    """

    def __init__(self, source: str) -> None:
        manifest, _ = load_manifest(source)
        labels = [s.label for s in manifest.slides if s.label is not None]
        self.labelled = bool(labels)
        self.slides = {s.slide_id: i for i, s in enumerate(manifest.slides)}
        self.classes = max(labels) + 1 if labels else len(self.slides)

    def __call__(self, batch: dict[str, Any], device: torch.device) -> torch.Tensor:
        if self.labelled:
            return batch["label"].to(device)
        ids = [self.slides.get(m["slide_id"], -1) for m in batch["meta"]]
        return torch.tensor(ids, dtype=torch.int64, device=device)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy; samples without a label (-1) are ignored."""
    return F.cross_entropy(logits, target, ignore_index=-1)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="build output folder, manifest path or URL prefix")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--shuffle", type=int, default=1000, help="shuffle buffer, samples per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--log-every", type=int, default=20)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    ds = stream(args.source, batch_size=args.batch_size, resampled=True, shuffle=args.shuffle, seed=args.seed)
    batches = MonitoredLoader(loader(ds, num_workers=args.workers), every=args.log_every)
    to_device = GpuCollate(
        device, mean=IMAGENET_MEAN, std=IMAGENET_STD, augment=True, seed=args.seed, channels_last=device.type == "cuda"
    )
    targets = Targets(args.source)
    model = make_model(targets.classes).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, batch in zip(range(args.steps), batches, strict=False):
        x, y = to_device(batch)["image"], targets(batch, device)
        logits = model(x)
        loss = loss_fn(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % args.log_every == 0:  # .item() syncs: the wait fraction stays honest
            accuracy = (logits.argmax(1) == y).float().mean().item()
            print(f"step {step}: loss {loss.item():.4f}, accuracy {accuracy:.2f}")
    s = batches.summary()
    print(
        f"{s['samples_per_s']:.1f} samples/s, {s['batches_per_s']:.2f} batches/s, "
        f"data wait {100 * s['data_wait_fraction']:.0f}% of step time, start-up {s['startup_s']:.1f} s"
    )
    print(json.dumps({"device": str(device), "workers": args.workers, "batch_size": args.batch_size, **s}))


if __name__ == "__main__":
    main()
