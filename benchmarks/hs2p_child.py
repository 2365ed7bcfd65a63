#!/usr/bin/env python
"""Run hs2p (https://github.com/clemsgrs/hs2p), the pathology tiler, as ``bench_build.py --hs2p PYTHON`` compares it.

Runs under an interpreter that has hs2p installed (its own virtual environment: hs2p pins its own OpenCV and
pulls pandas and wandb), never imports wsishard::

    python3.11 -m venv /tmp/hs2p-venv && /tmp/hs2p-venv/bin/pip install "hs2p[openslide]==6.1.0"
    /tmp/hs2p-venv/bin/python benchmarks/hs2p_child.py --mpp 0.2520 --out /tmp/hs2p-out --workers 2 a.svs b.svs

hs2p's defaults (``hs2p/configs/default.yaml``) but for the settings the issue's comparison named: Otsu tissue
segmentation, tiles saved to tar (``save_tiles``), ``--workers`` processes; previews off. That is 256 px tiles at
0.5 um/px with tolerance 0.05, tissue coverage >= 0.01, JPEG q90 through Pillow. The slides' level-0 spacing is
``--mpp`` (hs2p's ``spacing_at_level_0``: the benchmark's slides are tagged 0.25 and re-tagged per scanner).

Prints one final line ``JSON: {...}``: patches (JPEG members of the tars hs2p wrote), ``wall_s`` and ``cpu_s`` of
``tile_slides`` (this process and its reaped children), ``cpu0_s`` (this process's CPU when the clock started: the
benchmark takes it off the polled process tree's, as off a build's), ``import_s`` (importing hs2p, before the clock
starts, as the build's figures start at ``build()``), per-slide counts, hs2p's version and the call made. Exits 1
when a slide failed or nothing was written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
import warnings
from pathlib import Path

_OVERRIDE_WARNING = "Slide spacing override conflict"  # hs2p warns on each open of a slide whose tag differs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mpp", type=float, required=True, help="the slides' level-0 spacing (um/px)")
    ap.add_argument("--out", type=Path, required=True, help="hs2p's output folder")
    ap.add_argument("--workers", type=int, default=1, help="hs2p's num_workers (processes, one slide each)")
    ap.add_argument("slides", nargs="+", type=Path)
    args = ap.parse_args()

    # the re-tagging is intended: silence that one warning here and in hs2p's spawned workers (which print it)
    os.environ["PYTHONWARNINGS"] = ",".join(
        w for w in (os.environ.get("PYTHONWARNINGS"), f"ignore:{_OVERRIDE_WARNING}:UserWarning") if w
    )
    warnings.filterwarnings("ignore", message=_OVERRIDE_WARNING, category=UserWarning)

    t_import = time.perf_counter()
    import hs2p
    from hs2p import SegmentationConfig, SlideSpec, TilingConfig, tile_slides

    import_s = time.perf_counter() - t_import
    specs = [SlideSpec(sample_id=p.stem, image_path=p.resolve(), spacing_at_level_0=args.mpp) for p in args.slides]
    if len({s.sample_id for s in specs}) != len(specs):
        sys.exit("hs2p_child: slide file names must be unique (they are hs2p's sample ids)")
    tiling = TilingConfig(backend="openslide", mask_backend="openslide", requested_spacing_um=0.5,
                          requested_tile_size_px=256, tolerance=0.05, overlap=0.0)  # fmt: skip
    segmentation = SegmentationConfig(method="otsu")
    args.out.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), os.times()
    artifacts = tile_slides(
        specs,
        tiling=tiling,
        segmentation=segmentation,
        preview=None,
        output_dir=args.out,
        num_workers=args.workers,
        save_tiles=True,
    )
    wall, c1 = time.perf_counter() - t0, os.times()
    cpu = sum(c1[i] - c0[i] for i in range(4))  # user, system; children's user, system (reaped ones)

    per_slide: dict[str, int | None] = {}
    by_id = {a.sample_id: a for a in artifacts}
    for spec in specs:
        found = by_id.get(spec.sample_id)
        tar = getattr(found, "tiles_tar_path", None)
        if tar is None or not Path(tar).is_file():
            per_slide[spec.sample_id] = None  # hs2p failed the slide: see <out>/process_list.csv
            continue
        with tarfile.open(tar) as tf:
            per_slide[spec.sample_id] = sum(1 for m in tf if m.isfile() and m.name.endswith(".jpg"))
    patches = sum(n or 0 for n in per_slide.values())
    call = (
        "hs2p.tile_slides(SlideSpec(spacing_at_level_0=MPP) per slide, tiling=TilingConfig(backend='openslide', "
        "mask_backend='openslide', requested_spacing_um=0.5, requested_tile_size_px=256, tolerance=0.05), "
        f"segmentation=SegmentationConfig(method='otsu'), preview=None, num_workers={args.workers}, save_tiles=True)"
    )
    result = {"patches": patches, "wall_s": wall, "cpu_s": cpu, "cpu0_s": c0[0] + c0[1], "import_s": import_s,
              "per_slide": per_slide, "hs2p": hs2p.__version__, "call": call}  # fmt: skip
    print("JSON: " + json.dumps(result))
    return 0 if patches and all(n is not None for n in per_slide.values()) else 1  # a failed slide, or nothing


if __name__ == "__main__":
    raise SystemExit(main())
