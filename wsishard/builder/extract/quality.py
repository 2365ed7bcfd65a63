"""Per-patch quality scores, computed while a patch's pixels are in memory, written into its ``.json``, and
optionally used to leave patches out at build time (``--max-background``, ``--max-dark-pixels``, ``--min-sharpness``).

The scores are taken on :data:`SCORE_PX` x :data:`SCORE_PX` pixels sampled evenly from the patch (the pixels
Pillow's nearest-neighbour resize picks: a box filter would read every pixel and cost three times as much), counted
in one C pass (:mod:`wsishard._native`), which keeps their cost a small fraction of reading, resampling and encoding
the patch (``benchmarks/bench_tissue.py --quality`` measures it):

- ``background``: fraction of pixels that look like glass (HSV saturation below :data:`GLASS_MAX_SATURATION` and
  value above :data:`GLASS_MIN_VALUE`);
- ``dark``: fraction of pixels darker than :data:`DARK_MAX_VALUE` (HSV value; scanner edges, ink, folds);
- ``sharpness``: variance of the 4-neighbour Laplacian of the sampled pixels' brightness (HSV value, 0..255; at 64
  of 256 px it compares pixels 4 apart): low means blurred or empty.
"""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from wsishard._native import quality_counts
from wsishard.builder.options.patchopts import QualityOptions as QualityOptions
from wsishard.builder.options.patchopts import Scores as Scores

SCORE_PX = 64  # scores are computed on this many pixels a side, sampled evenly from the patch
GLASS_MAX_SATURATION = 0.08
GLASS_MIN_VALUE = 0.8
DARK_MAX_VALUE = 0.25


def quality_scores(patch: Image.Image | np.ndarray) -> Scores:
    """The quality scores of an RGB patch, a Pillow image or (h, w, 3) uint8 (rounded to 4 decimals, as they are
    written), on the pixels Pillow's nearest-neighbour resize to :data:`SCORE_PX` picks."""
    rgb = np.asarray(patch)  # (h, w, 3) uint8
    h, w = rgb.shape[:2]
    if h == 0 or w == 0:
        raise ValueError(f"an empty patch: {rgb.shape}")
    ys, xs = _nearest(h, min(h, SCORE_PX)), _nearest(w, min(w, SCORE_PX))
    glass, dark, lap_sum, lap_squares = quality_counts(
        rgb, ys, xs, GLASS_MAX_SATURATION * 100, GLASS_MIN_VALUE * 255, DARK_MAX_VALUE * 255
    )
    oh, ow = len(ys) // 4, len(xs) // 4  # int32 each
    pixels, laps = oh * ow, max(oh - 2, 0) * max(ow - 2, 0)
    mean = lap_sum / max(laps, 1)
    return {
        "background": round(glass / pixels, 4),
        "dark": round(dark / pixels, 4),
        "sharpness": round(float(lap_squares / laps - mean * mean) if laps else 0.0, 4),
    }


@functools.cache
def _nearest(size: int, out: int) -> bytes:
    """The source indices (int32) Pillow's ``NEAREST`` resize from ``size`` to ``out`` px takes along one axis (all
    of them when ``out == size``), asked of Pillow itself, on an image of the indices."""
    ramp = Image.fromarray(np.arange(size, dtype=np.int32)[None, :])  # mode "I"
    picked = np.asarray(ramp.resize((out, 1), Image.Resampling.NEAREST))[0] if out < size else np.arange(size)
    return picked.astype(np.int32).tobytes()
