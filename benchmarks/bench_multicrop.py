#!/usr/bin/env python
"""Benchmark ``GpuCollate(crops=MultiCrop())``: images/s of the batched multi-crop views against a per-image loop.

    python benchmarks/bench_multicrop.py --device cpu --threads 1
    python benchmarks/bench_multicrop.py --smoke      # B=4, one round, nothing saved (CI)

Both make DINOv2's views (2 global of 224 px, 8 local of 96 px, each with a random flip, normalised) of a batch of
64 uint8 images of 256 px. The loop is what a torchvision pipeline in a DataLoader worker does, with torch ops: per
image and per view, ``RandomResizedCrop``'s box, a slice, ``interpolate(antialias=True)``, a flip, mean and std.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable

import benchkit as bk
import numpy as np
import torch
import torch.nn.functional as F

from wsishard import GpuCollate, MultiCrop

VIEWS = ((2, 224, (0.32, 1.0)), (8, 96, (0.05, 0.32)))  # (crops, size, scale): global, local


def _box(rng: random.Random, h: int, w: int, scale: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``."""
    for _ in range(10):
        area = h * w * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    return 0, 0, h, w


def per_image(image: torch.Tensor, rng: random.Random) -> dict[str, torch.Tensor]:
    """The per-image loop: every view of every image, one ``interpolate`` call each."""
    mean, std = torch.tensor(bk.MEAN).view(3, 1, 1), torch.tensor(bk.STD).view(3, 1, 1)
    out: dict[str, list[torch.Tensor]] = {"global": [], "local": []}
    for img in image:  # (h, w, 3) uint8
        x = img.permute(2, 0, 1).float().div_(255)  # (3, h, w)
        for name, (n, size, scale) in zip(out, VIEWS, strict=True):
            for _ in range(n):
                t, left, ch, cw = _box(rng, x.shape[1], x.shape[2], scale)
                crop = x[None, :, t : t + ch, left : left + cw]
                v = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
                out[name].append(((v.flip(-1) if rng.random() < 0.5 else v) - mean) / std)
    return {name: torch.stack(views) for name, views in out.items()}


def images_per_s(fn: Callable[[torch.Tensor], object], image: torch.Tensor) -> float:
    """Images/s of one call of ``fn`` on ``image`` (the device synchronised at both ends)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn(image)
    sync()
    return image.shape[0] / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("--device", {"default": "cuda" if torch.cuda.is_available() else "cpu"}),
        ("--rounds", {"type": int, "default": 3, "help": "interleaved rounds (each times both once)"}),
        ("--threads", {"type": int, "help": "torch threads for both sides (1: a core, as in a DataLoader worker)"}),
        argv=argv,
    )
    (batch, rounds), device = (4, 1) if args.smoke else (64, args.rounds), torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    image = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (batch, 256, 256, 3), dtype=np.uint8))
    collate, rng = (
        GpuCollate(device, mean=bk.MEAN, std=bk.STD, augment=True, seed=0, crops=MultiCrop()),
        random.Random(0),
    )
    collate.views(image)  # warm-up: first-call allocations
    arms = {
        f"MultiCrop (GpuCollate on {device}, batched)": lambda: images_per_s(collate.views, image),
        "per-image loop (cpu, interpolate per view)": lambda: images_per_s(lambda b: per_image(b, rng), image),
    }
    runs = bk.interleaved(rounds, arms)
    rows = [{"config": k, "images_per_s": bk.median_range([r[k] for r in runs])[0]} for k in arms]
    caption = (
        f"Multi-crop views of B={batch} uint8 256 px images on {device} (the loop on cpu), {torch.get_num_threads()} "
        f"threads, median of {rounds} interleaved rounds [range]"
    )
    table = bk.markdown(("config", "images/s"), [(k, bk.spread([r[k] for r in runs], 1, "")) for k in arms], caption)
    report = {"device": str(device), "batch": batch, "rounds": rounds, "rows": rows, "threads": torch.get_num_threads()}
    return bk.emit(report, table, json_only=args.json_only)


if __name__ == "__main__":
    import benchkit

    on_gpu = "cuda" in " ".join(sys.argv[1:])
    sys.exit(benchkit.run("bench_multicrop_gpu" if on_gpu else "bench_multicrop", main, script="bench_multicrop"))
