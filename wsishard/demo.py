"""``wsishard demo``: the whole path on an embedded default, offline.

Generates a few synthetic slides, builds them into shards, prints the build summary, then streams a few
batches through the training pipeline and the collate, and prints what a training loop would get.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from wsishard.builder.options.buildopts import BuildOptions, BuildProgress
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.grid import PatchOptions
from wsishard.progress import ProgressCallback, ignore_progress
from wsishard.report import plural, summary
from wsishard.testing.synthetic import make_slides

DEMO_SLIDE_PX = 8192
DEMO_BATCH = 64
DEMO_BATCHES = 8
DEMO_MEAN, DEMO_STD = (0.85, 0.63, 0.77), (0.13, 0.18, 0.10)  # the demo slides' own channel statistics


Say = Callable[[str], None]


def run_demo(
    output: str,
    say: Say,
    *,
    n_slides: int = 8,
    jobs: int | None = None,
    progress: ProgressCallback[BuildProgress] = ignore_progress,
) -> int:
    """Run the demo into ``output`` (slides reused when already there), narrating through ``say``.

    Returns:
        The exit status: 0, or 1 when a slide failed.
    """
    slides_dir = os.path.join(output, "slides")
    shards_dir = os.path.join(output, "shards")
    existing = sorted(os.listdir(slides_dir)) if os.path.isdir(slides_dir) else []
    if len([n for n in existing if n.endswith((".svs", ".tif"))]) < n_slides:
        say(
            f"generating {plural(n_slides, 'synthetic slide')} ({DEMO_SLIDE_PX}x{DEMO_SLIDE_PX} px at 0.25 mpp) "
            f"in {slides_dir}"
        )
        make_slides(slides_dir, n_slides, seed=0, width=DEMO_SLIDE_PX, height=DEMO_SLIDE_PX)
    options = BuildOptions(
        patch=PatchOptions(target_mpp=0.5, patch_size_px=256), shard_samples=64, jobs=jobs, qc=True
    )  # the demo shows its pictures: drawn while building
    say(f"building shards into {shards_dir}")
    start = time.perf_counter()
    manifest = build([slides_dir], shards_dir, options, progress=progress)
    say(summary(manifest, shards_dir))
    say(f"  built in {time.perf_counter() - start:.1f} s; QC pictures in {os.path.join(shards_dir, 'qc')}")
    _stream_batches(shards_dir, jobs or min(2, os.cpu_count() or 1), say)
    return 1 if manifest.failed_slides else 0


def _stream_batches(shards_dir: str, workers: int, say: Say) -> None:
    import torch

    from wsishard.streaming.collate import GpuCollate
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = stream(shards_dir, batch_size=DEMO_BATCH, resampled=True, shuffle=1000, seed=0)
    to_device = GpuCollate(device, mean=DEMO_MEAN, std=DEMO_STD, augment=True, seed=0)
    say(f"streaming {DEMO_BATCHES} batches of {DEMO_BATCH} (resampled mode, {plural(workers, 'worker')}) to {device}")
    start = time.perf_counter()
    for step, batch in zip(range(DEMO_BATCHES), loader(dataset, num_workers=workers), strict=False):
        x = to_device(batch)["image"]
        slides = len({m["slide_id"] for m in batch["meta"]})
        say(
            f"  batch {step}: image {tuple(x.shape)} {x.dtype} on {x.device}, mean {x.mean().item():+.3f}, "
            f"{plural(slides, 'slide')} in the batch"
        )
    rate = DEMO_BATCHES * DEMO_BATCH / (time.perf_counter() - start)
    say(f"  {rate:.0f} samples/s including worker start-up")
