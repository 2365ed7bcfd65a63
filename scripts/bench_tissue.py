#!/usr/bin/env python
"""Tissue detection with and without the artefact filters, scored on generated slides against their true masks.

Example::

    python scripts/bench_tissue.py            # 4 seeds per set, about a minute
    python scripts/bench_tissue.py --seeds 8 --json-only

Sets of generated slides (3072x3072 px at 1 mpp: 3 mm, with 30% tissue): each artefact kind alone (marker ``ink``:
a blue circle and green and black strokes over glass and tissue; black ``dots``; a black ``edge`` band along two
sides; air ``bubbles``), ``all`` of them, and the ``clean`` twins. Patches are 128 px at 1 mpp (128 um: markers are
two to four patches wide). Each slide is scanned as the build scans it (``tissue_eval.score_slide``) with the
default options ("filters") and with ``ink_filter``, ``dark_filter`` off and ``max_artefact`` 1 ("no filters").

Figures per set: kept patches; dirty = kept patches more than 25% ink or artefact (true mask); clean-tissue cells
kept = grid cells with >= 50% true clean tissue and <= 25% artefact that were kept; clean area = the true clean
tissue's area inside kept patches (it also counts clean tissue inside mostly-ink patches). Targets: dirty <= 2% of
kept patches with the filters; clean-tissue cells kept no lower than without the filters minus 3 points (per set,
pooled). Prints a table, then one line ``JSON: {...}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from wsishard.builder.grid import PatchOptions
from wsishard.builder.tissue import TissueOptions
from wsishard.testing.artefacts import ARTEFACT_KINDS
from wsishard.testing.synthetic import make_slide
from wsishard.testing.tissue_eval import SlideScore, score_slide

SETS: dict[str, tuple[str, ...]] = {"ink": ("ink",), "dots": ("dots",), "edge": ("edge",), "bubbles": ("bubbles",),
                                    "all": ARTEFACT_KINDS, "clean": ()}  # fmt: skip
PATCH = PatchOptions(target_mpp=1.0, patch_size_px=128)
FILTERS = (TissueOptions(), PATCH)
NO_FILTERS = (TissueOptions(ink_filter=False, dark_filter=False), dataclasses.replace(PATCH, max_artefact=1.0))
MAX_DIRTY, MAX_COVERAGE_LOSS = 0.02, 0.03


def _pooled(scores: list[SlideScore]) -> dict[str, float]:
    kept = sum(s.kept for s in scores)
    return {
        "kept": kept,
        "dirty": sum(s.dirty for s in scores) / max(kept, 1),
        "clean_cells": sum(s.clean_coverage for s in scores) / len(scores),
        "clean_area": sum(s.clean_area_coverage for s in scores) / len(scores),
    }


def run(seeds: int, workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"sets": {}, "seconds": 0.0}
    start = time.perf_counter()
    for name, kinds in SETS.items():
        on, off = [], []
        for seed in range(1, seeds + 1):
            slide = make_slide(workdir / f"{name}-{seed}.svs", width=3072, height=3072, mpp=1.0, seed=seed,
                               artefacts=kinds)  # fmt: skip
            on.append(score_slide(slide, *FILTERS))
            off.append(score_slide(slide, *NO_FILTERS))
        f, n = _pooled(on), _pooled(off)
        worst = min(a.clean_coverage - b.clean_coverage for a, b in zip(on, off, strict=True))
        report["sets"][name] = {"filters": f, "no_filters": n, "worst_slide_cells_delta": worst,
                                "dirty_pass": f["dirty"] <= MAX_DIRTY,
                                "coverage_pass": f["clean_cells"] >= n["clean_cells"] - MAX_COVERAGE_LOSS}  # fmt: skip
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["all_pass"] = all(s["dirty_pass"] and s["coverage_pass"] for s in report["sets"].values())
    return report


def table(report: dict[str, Any]) -> str:
    head = ("| set | kept (filters / none) | dirty >25% (filters / none) | clean-tissue cells kept (filters / none) "
            "| clean area (filters / none) | dirty <= 2% | cells >= none - 3 pts |")  # fmt: skip
    lines = [head, "|" + "---|" * 7]
    for name, s in report["sets"].items():
        f, n = s["filters"], s["no_filters"]
        verdicts = " | ".join("pass" if s[k] else "MISS" for k in ("dirty_pass", "coverage_pass"))
        lines.append(f"| {name} | {f['kept']} / {n['kept']} | {f['dirty']:.1%} / {n['dirty']:.1%} | "
                     f"{f['clean_cells']:.1%} / {n['clean_cells']:.1%} | "
                     f"{f['clean_area']:.1%} / {n['clean_area']:.1%} | {verdicts} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=4, help="slides per set")
    p.add_argument("--workdir", type=Path, default=None, help="where the slides go (default: a temporary folder)")
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-tissue-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        report = run(args.seeds, workdir)
    if not args.json_only:
        print(f"{args.seeds} generated slides per set, 3072x3072 px at 1 mpp, 128 um patches ({report['seconds']} s)")
        print(table(report))
    print("JSON: " + json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    import benchresults  # the script's own names stay its own (bench_tissue has a run())

    sys.exit(benchresults.run("bench_tissue", main))
