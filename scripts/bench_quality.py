#!/usr/bin/env python
"""What the per-patch quality scores cost: their CPU time against the build's, on generated 40x slides.

Example::

    python scripts/bench_quality.py            # one 40960x30720 slide (a 40x slide), about three minutes
    python scripts/bench_quality.py --quick    # one 16384x12288 slide

A build with default options (256 px at 0.5 mpp, JPEG q90; every patch is scored) runs at ``--jobs 1``; its wall
time and the CPU time of the process and its workers are taken. Then ``quality_scores`` (the function the build
calls on every patch, in memory) is timed alone on every written patch, decoded back to the same 256 px RGB image,
three times (the fastest kept). The cost is the scores' CPU time over the build's CPU time (target: under 5%).
Prints a table, then one line ``JSON: {...}``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from PIL import Image

from wsishard.builder.options import BuildOptions
from wsishard.builder.quality import quality_scores
from wsishard.builder.run import build
from wsishard.testing.synthetic import make_slides

TARGET = 0.05


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _patches(out: Path) -> list[Image.Image]:
    images = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith(".jpg"):
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    images.append(Image.open(io.BytesIO(data)).convert("RGB"))
    return images


def run(workdir: Path, quick: bool) -> dict[str, Any]:
    size, n = ((16384, 12288), 1) if quick else ((40960, 30720), 1)
    slides = workdir / "slides"
    if not slides.exists():
        make_slides(slides, n, seed=3, width=size[0], height=size[1], tissue_fraction=0.2)
    out = workdir / "out"
    cpu0, wall0 = _cpu(), time.perf_counter()
    manifest = build([str(slides)], str(out), BuildOptions(jobs=1, qc=False), overwrite=True)
    wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
    images = _patches(out)
    timings = []
    for _ in range(3):
        start = time.process_time()
        for image in images:
            quality_scores(image)
        timings.append(time.process_time() - start)
    scores_s = min(timings)
    return {"slides": n, "slide_px": list(size), "patches": manifest.total_samples, "build_wall_s": round(wall, 2),
            "build_cpu_s": round(cpu, 2), "scores_cpu_s": round(scores_s, 3),
            "scores_ms_per_patch": round(1000 * scores_s / max(len(images), 1), 3),
            "cost_of_build_cpu": round(scores_s / cpu, 4), "cost_of_build_wall": round(scores_s / wall, 4),
            "target": TARGET, "pass": scores_s / cpu < TARGET}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one 16384x12288 slide")
    p.add_argument("--workdir", type=Path, default=None, help="slides and output (default: a temporary folder)")
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        r = run(args.workdir or Path(tmp), args.quick)
    if not args.json_only:
        print("| slides | patches | build wall s | build CPU s | scores CPU s | ms / patch | scores / build CPU | "
              "target | |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        print(f"| {r['slides']} x {r['slide_px'][0]}x{r['slide_px'][1]} | {r['patches']} | {r['build_wall_s']} | "
              f"{r['build_cpu_s']} | {r['scores_cpu_s']} | {r['scores_ms_per_patch']} | {r['cost_of_build_cpu']:.2%} "
              f"| < {TARGET:.0%} | {'pass' if r['pass'] else 'MISS'} |")  # fmt: skip
    print("JSON: " + json.dumps(r, sort_keys=True))
    return 0


if __name__ == "__main__":
    import benchresults  # the script's own names stay its own (bench_tissue has a run())

    sys.exit(benchresults.run("bench_quality", main))
