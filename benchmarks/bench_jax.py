#!/usr/bin/env python
"""The JAX loader against the torch loader, side by side: samples/s of ``wsishard.jax.loader`` (batches made global
``jax.Array`` s) and of ``wsishard.loader`` over the same stream, each bare and with its collate.

    python benchmarks/bench_jax.py             # 4 synthetic slides built once (cached in --workdir), 3 rounds
    python benchmarks/bench_jax.py --smoke     # a tiny build, one round, one timed batch; nothing saved (CI)

Rows, each the same resampled stream (batch 64 of 256 px patches at 0.5 mpp, 2 DataLoader workers, seed 0): the
torch loader's batches as they come; the JAX loader's (the copy onto the devices waited for); the torch loader into
``GpuCollate`` on the CPU; the JAX loader into ``wsishard.jax.Collate`` (its output waited for). Both collates
augment and normalise to float32. Rounds are interleaved (each round runs every row once, one after the other), so a
ratio sees one machine; the medians and ranges are printed. The devices are JAX's default ones (one CPU device unless
``XLA_FLAGS`` says more). Prints a Markdown table and ``JSON: {...}``; saved as ``benchmarks/results/bench_jax.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import torch
from benchkit import interleaved, logger, markdown, median_range, synthetic_build

import wsishard
import wsishard.jax as wjax

SEED, WORKERS = 0, 2
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
log = logger("bench_jax")


def build_output(workdir: Path, smoke: bool) -> str:
    """A cached build of synthetic slides at a scanner's 0.2520 mpp: 256 px patches at 0.5 mpp, shards of 200."""

    def make(slides: list[str], out: Path) -> None:
        wsishard.build(slides, str(out), shard_samples=200, seed=SEED, jobs=2, overwrite=True, qc=False)

    want = {"n_slides": 2 if smoke else 4, "size_px": 4096 if smoke else 6144, "slide_mpp": 0.2520}
    want |= {"tissue_fraction": 0.4, "shard_samples": 200}
    return str(synthetic_build(workdir / ("jax-smoke" if smoke else "jax"), want, make)[1])


def rate(batches: Iterator[Any], consume: Callable[[Any], int], warm: int, timed: int) -> float:
    """samples/s over ``timed`` batches after ``warm`` ones; ``consume`` returns a batch's samples once done."""
    for _ in range(warm):
        consume(next(batches))
    start, n = time.perf_counter(), 0
    for _ in range(timed):
        n += consume(next(batches))
    return n / (time.perf_counter() - start)


def runs(source: str, batch: int, warm: int, timed: int) -> dict[str, Callable[[], float]]:
    """Each row's run: a fresh loader over the same stream, its samples/s."""

    def ds() -> wsishard.ShardStream:
        return wsishard.stream(source, batch_size=batch, resampled=True, shuffle=500, seed=SEED)

    def torch_bare() -> float:
        return rate(
            iter(wsishard.loader(ds(), num_workers=WORKERS, pin_memory=False)), lambda b: len(b["key"]), warm, timed
        )

    def jax_bare() -> float:
        return rate(
            iter(wjax.loader(ds(), num_workers=WORKERS)), lambda b: b["image"].block_until_ready().shape[0], warm, timed
        )

    def torch_collate() -> float:
        collate = wsishard.GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=SEED)
        it = iter(wsishard.loader(ds(), num_workers=WORKERS, pin_memory=False))
        return rate(it, lambda b: collate(b)["image"].shape[0], warm, timed)

    def jax_collate() -> float:
        collate = wjax.Collate(mean=MEAN, std=STD, augment=True, seed=SEED)
        it = iter(wjax.loader(ds(), num_workers=WORKERS))
        return rate(it, lambda b: collate(b)["image"].block_until_ready().shape[0], warm, timed)

    return {
        "torch loader": torch_bare,
        "jax loader": jax_bare,
        "torch loader + GpuCollate (cpu)": torch_collate,
        "jax loader + jax Collate": jax_collate,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each runs every row once)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "wsishard-bench"))
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    p.add_argument("--smoke", action="store_true", help="a tiny build, one round, one timed batch; nothing saved")
    args = p.parse_args(argv)
    batch, warm, timed = (8, 1, 1) if args.smoke else (64, 3, 20)
    rounds = 1 if args.smoke else args.rounds
    source = build_output(Path(args.workdir), args.smoke)
    figures = interleaved(rounds, runs(source, batch, warm, timed), log)
    rows = []
    for name in figures[0]:
        mid, lo, hi = median_range([r[name] for r in figures])
        rows.append({"config": name, "samples_per_s": round(mid, 1), "range": [round(lo, 1), round(hi, 1)]})
    ratios = {
        "bare": [r["jax loader"] / r["torch loader"] for r in figures],
        "collate": [r["jax loader + jax Collate"] / r["torch loader + GpuCollate (cpu)"] for r in figures],
    }
    report: dict[str, Any] = {
        "bench": "jax",
        "batch": batch,
        "workers": WORKERS,
        "rounds": rounds,
        "timed_batches": timed,
        "rows": rows,
        "jax_over_torch": {k: round(median_range(v)[0], 3) for k, v in ratios.items()},
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 1),
    }
    if not args.json_only:
        caption = (
            f"samples/s, batch {batch} of 256 px, {WORKERS} workers, {timed} timed batches, jax on "
            f"{len(jax.devices())} {jax.devices()[0].platform} device(s), median of {rounds} interleaved rounds [range]"
        )
        table = [(r["config"], f"{r['samples_per_s']:,.1f} [{r['range'][0]:,.1f}-{r['range'][1]:,.1f}]") for r in rows]
        table += [(f"jax / torch, {k}", f"{np.median(v):.3f}x") for k, v in ratios.items()]
        print(markdown(("config", "samples/s"), table, caption, align="lr"))
    print("JSON: " + json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import benchkit  # saves benchmarks/results/bench_jax.json

    sys.exit(benchkit.run("bench_jax", main))
