#!/usr/bin/env python
"""Write seeded synthetic whole-slide images (svs / generic tiff) and their true tissue masks.

Example::

    python scripts/make_slides.py /data/synth --n 8 --size 20480x20480 --mpp 0.25 --seed 0

Each slide ``slide-NNN.svs`` / ``slide-NNN.tif`` gets its true mask as ``slide-NNN.mask.png`` next to it
(one mask px = ``mask_downsample`` level-0 px). One line per slide is printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from wsishard.testing.synthetic import SlideKind, make_slides


def _size(text: str) -> tuple[int, int]:
    """Parse ``WxH`` (or a single number for a square) into (width, height)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WxH, got {text!r}") from None
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 64:
        raise argparse.ArgumentTypeError(f"expected WxH with sides >= 64, got {text!r}")
    return parts[0], parts[1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="output folder (created if missing)")
    p.add_argument("--n", type=int, default=4, help="number of slides (default 4)")
    p.add_argument("--size", type=_size, default=None, help="level-0 size WxH in px (default 4096x4096)")
    p.add_argument("--width", type=int, default=4096, help="level-0 width in px (if --size is not given)")
    p.add_argument("--height", type=int, default=4096, help="level-0 height in px (if --size is not given)")
    p.add_argument("--mpp", type=float, default=0.25, help="level-0 microns per px (default 0.25, 40x)")
    p.add_argument("--seed", type=int, default=0, help="base seed; slide i is seeded from (seed, i)")
    p.add_argument("--kind", choices=["svs", "tiff", "both"], default="both", help="file layout (default both)")
    p.add_argument("--tissue-fraction", type=float, default=0.3, help="tissue share of the slide area")
    p.add_argument("--no-dust", action="store_true", help="leave out the dust specks")
    p.add_argument("--no-mpp", action="store_true", help="do not record the mpp in the files")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality 1..100")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    args = _parser().parse_args(argv)
    width, height = args.size if args.size is not None else (args.width, args.height)
    kinds: tuple[SlideKind, ...] = ("svs", "tiff") if args.kind == "both" else (args.kind,)
    start = time.perf_counter()
    try:
        slides = make_slides(
            args.folder,
            args.n,
            seed=args.seed,
            width=width,
            height=height,
            mpp=args.mpp,
            kinds=kinds,
            tissue_fraction=args.tissue_fraction,
            dust=not args.no_dust,
            include_mpp=not args.no_mpp,
            quality=args.quality,
        )
    except ValueError as exc:
        print(f"make_slides: error: {exc}", file=sys.stderr)
        return 2
    for s in slides:
        path = Path(s.path)
        mask_path = path.with_name(path.name.rsplit(".", 1)[0] + ".mask.png")
        Image.fromarray(s.mask.astype(np.uint8) * 255).save(mask_path)
        size_mb = path.stat().st_size / 1e6
        print(
            f"{path}  {s.width}x{s.height} @ {s.mpp:g} mpp  tissue {s.mask.mean():.3f}  {size_mb:.1f} MB  "
            f"mask {mask_path.name} (1 px = {s.mask_downsample:g} px)"
        )
    print(f"{len(slides)} slides in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
