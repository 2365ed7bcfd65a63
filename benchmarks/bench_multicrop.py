#!/usr/bin/env python
"""Benchmark ``GpuCollate(crops=MultiCrop())``: images/s of the batched multi-crop views against a per-image loop.

Example::

    python benchmarks/bench_multicrop.py
    python benchmarks/bench_multicrop.py --device cuda --json-only

Both sides make DINOv2's views (2 global of 224 px, 8 local of 96 px, each with a random flip, normalised) of a
batch of 64 uint8 images of 256 px. The loop is what a torchvision pipeline in a DataLoader worker does, written
with torch ops: per image and per view, torchvision's ``RandomResizedCrop`` box (Python ``random``), a slice,
``interpolate(antialias=True)``, a flip, then mean and std. Rounds are interleaved (each round runs both, one after
the other), so a ratio sees one machine.

Prints a Markdown table, then one line ``JSON: {...}``; ``benchkit`` saves both to
``benchmarks/results/bench_multicrop.json``. Wall-clock figures on a shared machine are what they are: reported,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from wsishard import GpuCollate, MultiCrop

BATCH, PATCH_PX = 64, 256
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
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
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    out: dict[str, list[torch.Tensor]] = {"global": [], "local": []}
    for img in image:  # (h, w, 3) uint8
        x = img.permute(2, 0, 1).float().div_(255)  # (3, h, w)
        for name, (n, size, scale) in zip(out, VIEWS, strict=True):
            for _ in range(n):
                t, left, ch, cw = _box(rng, x.shape[1], x.shape[2], scale)
                crop = x[None, :, t : t + ch, left : left + cw]
                v = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
                if rng.random() < 0.5:
                    v = v.flip(-1)
                out[name].append((v - mean) / std)
    return {name: torch.stack(views) for name, views in out.items()}


def timed(fn: Any, image: torch.Tensor, device: torch.device) -> float:
    """Images/s of one call of ``fn`` on ``image``."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn(image)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return image.shape[0] / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each times both once)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for both sides (default: torch's)")
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    p.add_argument("--smoke", action="store_true", help="a few seconds: B=4, one round, nothing saved (CI)")
    args = p.parse_args(argv)
    batch = 4 if args.smoke else BATCH
    if args.smoke:
        args.rounds = 1
    if args.threads:
        torch.set_num_threads(args.threads)  # 1: per core, as in a DataLoader worker
    device = torch.device(args.device)
    image = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (batch, PATCH_PX, PATCH_PX, 3), dtype=np.uint8))
    collate = GpuCollate(device, mean=MEAN, std=STD, augment=True, seed=0, crops=MultiCrop())
    rng = random.Random(0)
    batched, loop = f"MultiCrop (GpuCollate on {device}, batched)", "per-image loop (cpu, interpolate per view)"
    collate.views(image)  # warm-up: first-call allocations
    figures: dict[str, list[float]] = {batched: [], loop: []}
    for _ in range(args.rounds):
        figures[batched].append(timed(collate.views, image, device))
        figures[loop].append(timed(lambda b: per_image(b, rng), image, torch.device("cpu")))
    rows = []
    for name, values in figures.items():
        spread = [round(min(values), 1), round(max(values), 1)]
        rows.append({"config": name, "images_per_s": round(float(np.median(values)), 1), "range": spread})
    report: dict[str, Any] = {
        "bench": "multicrop",
        "device": str(device),
        "batch": batch,
        "patch_px": PATCH_PX,
        "views": "2 x 224 px + 8 x 96 px",
        "rounds": args.rounds,
        "rows": rows,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    if not args.json_only:
        caption = (
            f"Multi-crop views of B={batch} uint8 {PATCH_PX} px images on {device} (the loop on cpu), "
            f"{torch.get_num_threads()} threads, median of {args.rounds} interleaved rounds [range]"
        )
        table = [(r["config"], f"{r['images_per_s']:.1f} [{r['range'][0]:.1f}-{r['range'][1]:.1f}]") for r in rows]
        from benchkit import markdown

        print(markdown(("config", "images/s"), table, caption, align="lr"))
    print("JSON: " + json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import benchkit  # saves benchmarks/results/bench_multicrop.json

    on_gpu = "cuda" in " ".join(sys.argv[1:])
    sys.exit(benchkit.run("bench_multicrop_gpu" if on_gpu else "bench_multicrop", main, script="bench_multicrop"))
