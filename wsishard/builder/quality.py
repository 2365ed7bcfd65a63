"""Per-patch quality scores, computed while a patch's pixels are in memory, written into its ``.json``, and
optionally used to leave patches out at build time (``--max-background``, ``--max-dark-pixels``, ``--min-sharpness``).

The scores are taken on :data:`SCORE_PX` x :data:`SCORE_PX` pixels sampled evenly from the patch (nearest: a box
filter would read every pixel and cost three times as much), which keeps their cost a small fraction of reading,
resampling and encoding the patch (``scripts/bench_quality.py`` measures it):

- ``background``: fraction of pixels that look like glass (HSV saturation below :data:`GLASS_MAX_SATURATION` and
  value above :data:`GLASS_MIN_VALUE`);
- ``dark``: fraction of pixels darker than :data:`DARK_MAX_VALUE` (HSV value; scanner edges, ink, folds);
- ``sharpness``: variance of the 4-neighbour Laplacian of the sampled pixels' brightness (HSV value, 0..255; at 64
  of 256 px it compares pixels 4 apart): low means blurred or empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from wsishard.errors import OptionError

SCORE_PX = 64  # scores are computed on this many pixels a side, sampled evenly from the patch
GLASS_MAX_SATURATION = 0.08
GLASS_MIN_VALUE = 0.8
DARK_MAX_VALUE = 0.25
Scores = dict[str, float]  # background, dark, sharpness


@dataclass(frozen=True, kw_only=True)
class QualityOptions:
    """Build-time patch filters on the quality scores; the defaults keep every patch (scores are still recorded).

    Attributes:
        max_background: leave out patches more than this fraction glass (1: keep all).
        max_dark: leave out patches more than this fraction very dark (1: keep all).
        min_sharpness: leave out patches whose Laplacian variance is below this (0: keep all).

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    max_background: float = field(
        default=1.0,
        metadata={
            "metavar": "FRAC",
            "parse": "fraction",
            "help": "leave out patches more than this fraction background (glass)",
        },
    )
    max_dark: float = field(
        default=1.0,
        metadata={
            "flag": "--max-dark-pixels",
            "old_flags": ("--max-dark",),
            "metavar": "FRAC",
            "parse": "fraction",
            "help": "leave out patches more than this fraction very dark pixels (HSV value below 0.25), pigment "
            "included, counted on the patch itself (by default none is left out: the .json's dark and "
            "pigment scores let training leave them out instead)",
        },
    )
    min_sharpness: float = field(
        default=0.0,
        metadata={
            "metavar": "VAR",
            "parse": "non_negative",
            "help": "leave out patches whose Laplacian variance (blur measure) is below this",
        },
    )

    def __post_init__(self) -> None:
        for name in ("max_background", "max_dark"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise OptionError(f"invalid {name}: {getattr(self, name)!r} (need 0 <= FRAC <= 1)")
        if not (math.isfinite(self.min_sharpness) and self.min_sharpness >= 0):
            raise OptionError(f"invalid min_sharpness: {self.min_sharpness!r} (need a finite number >= 0)")

    def rejects(self, scores: Scores) -> str | None:
        """The reason a patch with ``scores`` is left out (``background``, ``dark``, ``sharpness``), or None."""
        if scores["background"] > self.max_background:
            return "background"
        if scores["dark"] > self.max_dark:
            return "dark"
        if scores["sharpness"] < self.min_sharpness:
            return "sharpness"
        return None


def quality_scores(patch: Image.Image) -> Scores:
    """The quality scores of an RGB patch (rounded to 4 decimals, as they are written)."""
    w, h = patch.size
    small = (
        patch.resize((min(w, SCORE_PX), min(h, SCORE_PX)), Image.Resampling.NEAREST) if max(w, h) > SCORE_PX else patch
    )
    rgb = np.asarray(small)  # (h, w, 3) uint8
    hi = np.maximum(np.maximum(rgb[..., 0], rgb[..., 1]), rgb[..., 2]).astype(np.int16)  # HSV value, 0..255
    lo = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2]).astype(np.int16)
    glass = ((hi - lo) * 100 < GLASS_MAX_SATURATION * 100 * hi) & (hi > GLASS_MIN_VALUE * 255)  # S = (hi - lo) / hi
    lap = (hi[1:-1, :-2] + hi[1:-1, 2:] + hi[:-2, 1:-1] + hi[2:, 1:-1] - 4 * hi[1:-1, 1:-1]).ravel().astype(np.int64)
    mean = lap.sum() / max(lap.size, 1)
    return {
        "background": round(np.count_nonzero(glass) / glass.size, 4),
        "dark": round(np.count_nonzero(hi < DARK_MAX_VALUE * 255) / hi.size, 4),
        "sharpness": round(float(np.dot(lap, lap) / lap.size - mean * mean) if lap.size else 0.0, 4),
    }
