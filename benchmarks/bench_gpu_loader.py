#!/usr/bin/env python
"""Device-ready throughput on a GPU: JPEG decode in the workers against decode on the device, with and without stain.

    python benchmarks/bench_gpu_loader.py             # on a machine with CUDA (and torchvision for decode="device")
    python benchmarks/bench_gpu_loader.py --smoke     # seconds, the "worker" rows on the CPU, nothing saved (CI)

Each row is one loader (resampled, batch 256, 256 px patches at 0.5 mpp) into ``GpuCollate`` on the device: decode
``"worker"`` and ``"device"`` (CUDA only), 2 and 8 workers (the machine's cores permitting), no stain and Macenko
(the slides' own matrices) + HED jitter + brightness/contrast.
"""

from __future__ import annotations

import os
import sys

import benchkit as bk
import torch

from wsishard import GpuCollate
from wsishard.augment.stain import StainOptions, StainTable


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(__doc__, argv=argv)
    cuda, cpus = torch.cuda.is_available(), os.cpu_count() or 1
    device = torch.device("cuda" if cuda else "cpu")
    size = {"n_slides": bk.sized(args, 2, 8, 8), "size_px": bk.sized(args, 4096, 8192, 8192)}
    source = str(bk.cached_build(args.workdir / f"gpu-loader-{args.mode}", **size, shard_samples=200)[1])
    jitter = {"hed_scale": 0.05, "hed_shift": 0.01, "brightness": 0.1, "contrast": 0.1}
    stain = StainOptions(normalize="macenko", slides=StainTable.from_build(source), **jitter)
    timed, rows = bk.sized(args, 1, 8, 30), []
    for decode in ("worker", "device") if cuda else ("worker",):
        for workers in (2,) if args.smoke else sorted({w for w in (2, 8) if w <= max(cpus - 1, 2)}):
            for st in (None, stain):
                collate = GpuCollate(device, mean=(0.5,) * 3, std=(0.25,) * 3, augment=True, seed=0, stain=st)
                warm = bk.sized(args, 1, 3, 3)
                r = bk.loader_rate(source, workers, timed, collate=collate, warm=warm, loader_kw={"decode": decode})
                rows.append(
                    {
                        "decode": decode,
                        "workers": workers,
                        "stain": st is not None,
                        "samples": timed * 256,
                        "samples_per_s": round(r["samples_per_s"], 1),
                    }
                )
    where = torch.cuda.get_device_name(0) if cuda else "CPU"
    caption = (
        f"Device-ready samples/s on {where} ({cpus} cores), batch 256 at 256 px, {timed} timed batches; stain = "
        "Macenko (per-slide matrices) + HED jitter + brightness/contrast"
    )
    cells = [
        (
            a["decode"],
            a["workers"],
            f"{a['samples_per_s']:,.0f}",
            f"{b['samples_per_s']:,.0f}",
            f"{b['samples_per_s'] / a['samples_per_s']:.2f}x",
        )
        for a, b in zip(rows[::2], rows[1::2], strict=True)
    ]
    table = bk.markdown(("decode", "workers", "no stain", "stain", "stain / no stain"), cells, caption)
    report = {"device": str(device), "gpu": where, "cpus": cpus, "timed_batches": timed, "rows": rows}
    return bk.emit(report, table, json_only=args.json_only)


if __name__ == "__main__":
    import benchkit

    sys.exit(benchkit.run("bench_gpu_loader", main))
