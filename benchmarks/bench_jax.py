#!/usr/bin/env python
"""The JAX loader against the torch loader, side by side: samples/s of ``wsishard.jax.loader`` (batches made global
``jax.Array`` s, the copy onto the devices waited for) and of ``wsishard.loader``, each bare and with its collate.

    python benchmarks/bench_jax.py             # 4 synthetic slides built once (cached in --workdir), 3 rounds
    python benchmarks/bench_jax.py --smoke     # a tiny build, one round, one timed batch; nothing saved (CI)

The same resampled stream (batch 64 of 256 px patches at 0.5 mpp, 2 DataLoader workers), in interleaved rounds; the
collates (``GpuCollate`` on the CPU, ``wsishard.jax.Collate`` on JAX's device) both augment and normalise to float32.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import benchkit as bk
import jax
import torch

import wsishard
import wsishard.jax as wjax


def rate(
    source: str, jax_loader: bool, collate: Callable[[Any], Any] | None, batch: int, warm: int, timed: int
) -> float:
    """samples/s of a fresh loader over the stream, each batch waited for (``block_until_ready`` on JAX)."""
    ds = wsishard.stream(source, batch_size=batch, resampled=True, shuffle=500, seed=0)
    it = iter(wjax.loader(ds, num_workers=2) if jax_loader else wsishard.loader(ds, num_workers=2, pin_memory=False))
    done = (lambda b: b["image"].block_until_ready()) if jax_loader else (lambda b: b["image"])
    for i in range(warm + timed):
        if i == warm:
            start = time.perf_counter()
        done(collate(next(it)) if collate else next(it))
    return timed * batch / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(__doc__, ("--rounds", {"type": int, "default": 3, "help": "interleaved rounds"}), argv=argv)
    batch, warm, timed, rounds = (8, 1, 1, 1) if args.smoke else (64, 3, 20, args.rounds)
    size = {"n_slides": bk.sized(args, 2, 4, 4), "size_px": bk.sized(args, 4096, 6144, 6144)}
    source = str(bk.cached_build(args.workdir / f"jax-{args.mode}", **size, shard_samples=200)[1])
    torch_collate = wsishard.GpuCollate("cpu", mean=bk.MEAN, std=bk.STD, augment=True, seed=0)
    arms = {
        "torch loader": partial(rate, source, False, None),
        "jax loader": partial(rate, source, True, None),
        "torch loader + GpuCollate (cpu)": partial(rate, source, False, torch_collate),
        "jax loader + jax Collate": partial(
            rate, source, True, wjax.Collate(mean=bk.MEAN, std=bk.STD, augment=True, seed=0)
        ),
    }
    runs = bk.interleaved(rounds, {k: partial(arm, batch, warm, timed) for k, arm in arms.items()}, bk.logger("jax"))
    rows = [{"config": k, "samples_per_s": bk.median_range([r[k] for r in runs])[0]} for k in arms]
    ratios = {
        "bare": [r["jax loader"] / r["torch loader"] for r in runs],
        "collate": [r["jax loader + jax Collate"] / r["torch loader + GpuCollate (cpu)"] for r in runs],
    }
    cells = [(k, bk.spread([r[k] for r in runs], 1, "")) for k in arms]
    cells += [(f"jax / torch, {k}", bk.spread(v)) for k, v in ratios.items()]
    caption = (
        f"samples/s, batch {batch} of 256 px, 2 workers, {timed} timed batches, jax on {len(jax.devices())} "
        f"{jax.devices()[0].platform} device(s), median of {rounds} interleaved rounds [range]"
    )
    report = {"batch": batch, "rounds": rounds, "timed_batches": timed, "rows": rows, "cpus": os.cpu_count()}
    report |= {"jax_over_torch": {k: bk.median_range(v)[0] for k, v in ratios.items()}, "jax": jax.__version__}
    report |= {"torch": torch.__version__, "devices": [str(d) for d in jax.devices()]}
    return bk.emit(report, bk.markdown(("config", "samples/s"), cells, caption, "lr"), json_only=args.json_only)


if __name__ == "__main__":
    import benchkit

    sys.exit(benchkit.run("bench_jax", main))
