"""Device-ready throughput on a GPU: JPEG decode in the workers against decode on the device, with and without stain.

    python benchmarks/bench_gpu_loader.py             # on a machine with CUDA (and torchvision for decode="device")
    python benchmarks/bench_gpu_loader.py --quick     # fewer batches

Each row is one loader (resampled, batch 256, 256 px patches at 0.5 mpp) into ``GpuCollate`` on the device: warm-up
batches, then samples/s over the timed batches with the device synchronised at both ends. Rows: decode ``"worker"``
and ``"device"``, 2 and 8 workers (the machine's cores permitting), no stain and Macenko (the slides' own matrices)
+ HED jitter + brightness/contrast. Without CUDA only the ``"worker"`` rows run, on the CPU (``decode="device"`` is
refused there). Prints a Markdown table and ``JSON: {...}``; saved as ``benchmarks/results/bench_gpu_loader.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchkit import markdown, synthetic_build

from wsishard import GpuCollate, loader, stream

BATCH = 256
SEED = 0


def build_output(workdir: Path, jobs: int, smoke: bool = False) -> str:
    """A cached build of synthetic slides at a scanner's 0.2520 mpp: 256 px patches at 0.5 mpp in shards of 200."""
    from wsishard import build

    def make(slides: list[str], out: Path) -> None:
        build(slides, str(out), shard_samples=200, seed=SEED, jobs=jobs, overwrite=True, qc=False)

    want = {"n_slides": 8, "size_px": 8192, "slide_mpp": 0.2520, "tissue_fraction": 0.4, "shard_samples": 200}
    if smoke:  # two small slides
        want |= {"n_slides": 2, "size_px": 4096}
    return str(synthetic_build(workdir / ("gpu-loader-smoke" if smoke else "gpu-loader"), want, make)[1])


def run_one(
    source: str, device: torch.device, decode: str, workers: int, stain: Any, warm: int, timed: int
) -> dict[str, Any]:
    """samples/s of one loader into GpuCollate on ``device``."""
    ds = stream(source, batch_size=BATCH, seed=SEED)
    collate = GpuCollate(device, mean=(0.5,) * 3, std=(0.25,) * 3, augment=True, seed=SEED, stain=stain)
    dl = loader(ds, num_workers=workers, decode=decode)
    it = iter(dl)
    for _ in range(warm):
        collate(next(it))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, n = time.perf_counter(), 0
    for _ in range(timed):
        n += collate(next(it))["image"].shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    del it, dl
    return {
        "decode": decode,
        "workers": workers,
        "stain": stain is not None,
        "samples": n,
        "seconds": round(elapsed, 3),
        "samples_per_s": round(n / elapsed, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer timed batches (8 instead of 30)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "wsishard-bench"))
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    p.add_argument("--smoke", action="store_true", help="a tiny build, one timed batch, 2 workers; nothing saved")
    args = p.parse_args(argv)
    from wsishard.augment.stain import StainOptions, StainTable

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    cpus = os.cpu_count() or 1
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    source = build_output(workdir, jobs=min(cpus, 2) if args.smoke else cpus, smoke=args.smoke)
    stained = StainOptions(
        normalize="macenko",
        slides=StainTable.from_build(source),
        hed_scale=0.05,
        hed_shift=0.01,
        brightness=0.1,
        contrast=0.1,
    )
    timed = 1 if args.smoke else 8 if args.quick else 30
    rows = []
    for decode in ("worker", "device") if cuda else ("worker",):
        for workers in (2,) if args.smoke else sorted({w for w in (2, 8) if w <= max(cpus - 1, 2)}):
            for stain in (None, stained):
                rows.append(run_one(source, device, decode, workers, stain, warm=1 if args.smoke else 3, timed=timed))
                if not args.json_only:
                    r = rows[-1]
                    print(
                        f"  decode={r['decode']} workers={r['workers']} stain={r['stain']}: "
                        f"{r['samples_per_s']:,.0f} samples/s",
                        flush=True,
                    )
    gpu = torch.cuda.get_device_name(0) if cuda else None
    report = {
        "bench": "gpu_loader",
        "device": str(device),
        "gpu": gpu,
        "torch": torch.__version__,
        "cpus": cpus,
        "batch": BATCH,
        "timed_batches": timed,
        "rows": rows,
    }
    if not args.json_only:
        where = report["gpu"] or "CPU"
        caption = (
            f"Device-ready samples/s on {where} ({cpus} cores), batch {BATCH} at 256 px, {timed} timed batches; "
            "stain = Macenko (per-slide matrices) + HED jitter + brightness/contrast"
        )
        table = [
            (
                a["decode"],
                a["workers"],
                f"{a['samples_per_s']:,.0f}",
                f"{b['samples_per_s']:,.0f}",
                f"{b['samples_per_s'] / a['samples_per_s']:.2f}x",
            )
            for a, b in zip(rows[::2], rows[1::2], strict=True)
        ]
        print("\n" + markdown(("decode", "workers", "no stain", "stain", "stain / no stain"), table, caption))
    print("JSON: " + json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import benchkit

    sys.exit(benchkit.run("bench_gpu_loader", main))
