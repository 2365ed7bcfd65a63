"""Pure per-slide stain estimation (Macenko): RGB tissue pixels -> an H&E stain matrix and maximum concentrations.

Macenko et al. (2009): pixels are turned into optical density (``OD = -ln((I + 1) / Io)``), the nearly clear ones
(any channel below ``beta``) dropped, and the rest projected onto the plane of their two main directions; the
extreme angles in that plane (the ``alpha`` and ``100 - alpha`` percentiles) are the haematoxylin and eosin
vectors. The concentrations of every pixel on those two vectors (least squares) give the maximum concentrations
(their 99th percentile). This is torchstain's ``MacenkoNormalizer`` with its defaults (``Io=240``, ``alpha=1``,
``beta=0.15``), with the eigenvectors' signs fixed and the vectors unit and positive, so the same pixels always give
the same matrix.

The build fits once per slide, on the scan's detection view (about 8 um/px), with marker ink and dark-grey
artefacts left out pixel by pixel: the whole slide's tissue counts and nothing is read twice. A few patches at the
patches' own resolution would see the colours training sees, but not the slide: on the CMU-1 region, two copies
(one with haematoxylin 50% darker, eosin 40% paler) normalised on fits of 8 to 32 random patches each still differed
by 13-24% in mean H OD, and by 1-6% on fits of the whole region at 1/1 to 1/16 of its resolution. The price: at 8
um/px stains average together, so the vectors come out about 7-10 degrees closer together and the maximum
concentrations about 35% lower than at 0.5 mpp (CMU-1), the same for every slide; normalise to a target of the same
build (``StainTarget.of_build``) to stay in one scale. A slide with too little stained tissue, or whose fit is
degenerate, gets the reference matrix and the reason in its record (:func:`fit_or_reference`). No I/O, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wsishard.builder.scan.artefacts import GREY_MAX_SATURATION, GREY_MAX_VALUE, hsv_planes, in_hue_band

# torchstain's (and the original Macenko code's) reference H&E: the columns are H and E, in OD per RGB channel
REFERENCE_MATRIX = ((0.5626, 0.2159), (0.7201, 0.8012), (0.4062, 0.5581))  # (3, 2): rows R, G, B
REFERENCE_MAX_CONC = (1.9705, 1.0308)  # H, E
IO = 240.0  # the transmitted light intensity OD is measured against (torchstain's Io)
ALPHA = 1.0  # percentile of the angles taken as the extreme stain directions
BETA = 0.15  # OD below which a channel counts as clear (pixels with one such channel are left out of the fit)
MIN_PIXELS = 2000  # stained pixels a fit needs; fewer: the reference is recorded, with the reason
MIN_ANGLE_DEG = 3.0  # H and E closer than this (degrees apart) are one stain seen twice: degenerate fit
# marker ink, for the fit: a colour outside the H&E hues (the scan's band) at least this saturated. The scan's own
# ink and dark masks (saturation 0.15, value 0.25, grown by a margin) take darker-stained tissue for artefacts: fitted
# without what they flag, a copy of CMU-1 with haematoxylin 50% darker and eosin 40% paler was normalised 26-35% off
# its original in mean E OD, 9% with this rule, 6% with no ink rule at all
INK_MIN_SATURATION = 0.3
HE_HUES_DEG = (235.0, 20.0)
_MAX_FIT_PIXELS = 400_000  # pixels the fit uses at most (a seeded subsample beyond): bounded cost per slide
_STAINED_BELOW = math.floor(IO * math.exp(-BETA) - 1) + 1  # a channel value below this has OD >= BETA


@dataclass(frozen=True)
class StainFit:
    """A slide's stain estimate: ``matrix`` (3, 2) (columns H, E; rows R, G, B; unit OD vectors) and ``max_conc``
    (H, E), fitted on ``pixels`` stained pixels (``source="fitted"``), or the reference with the ``reason``."""

    matrix: np.ndarray  # (3, 2) float64
    max_conc: np.ndarray  # (2,) float64
    source: str  # "fitted" | "reference"
    reason: str = ""
    pixels: int = 0

    def to_record(self) -> dict[str, object]:
        """The slide record's ``stain`` field (plain JSON data, 4 decimals)."""
        return {
            "method": "macenko",
            "matrix": [[round(float(v), 4) for v in row] for row in self.matrix.tolist()],
            "max_conc": [round(float(v), 4) for v in self.max_conc.tolist()],
            "source": self.source,
            "reason": self.reason,
            "pixels": int(self.pixels),
        }


def reference_fit(reason: str, pixels: int = 0) -> StainFit:
    """The reference H&E, recorded with why it stands in for a fit."""
    return StainFit(np.array(REFERENCE_MATRIX), np.array(REFERENCE_MAX_CONC), "reference", reason, pixels)


def _every_channel_below(rgb: np.ndarray, bound: int) -> np.ndarray:
    """(n,) bool: each channel of (n, 3) uint8 ``rgb`` below ``bound``; ``(rgb < bound).all(axis=1)`` column by
    column (numpy reduces a 3-wide last axis slowly: 25 ms on a 1.2 Mpx detection view, against 3)."""
    out = rgb[:, 0] < bound
    out &= rgb[:, 1] < bound
    out &= rgb[:, 2] < bound
    return out


def optical_density(rgb: np.ndarray, io: float = IO) -> np.ndarray:
    """(n, 3) uint8 RGB -> (n, 3) float64 optical density ``-ln((I + 1) / io)``."""
    return -np.log((rgb.astype(np.float64) + 1.0) / io)


def macenko(
    od: np.ndarray, *, alpha: float = ALPHA, beta: float = BETA, percentile: float = 99.0
) -> tuple[np.ndarray, np.ndarray, int]:
    """The Macenko fit of (n, 3) optical densities: (3, 2) matrix (H, E), (2,) max concentrations (the
    ``percentile`` of each stain's concentrations: torchstain's 99) and the number of stained pixels it used.

    Raises:
        ValueError: fewer than 3 stained pixels, or a fit that is not finite.
    """
    stained = od[~np.any(od < beta, axis=1)]  # (m, 3)
    if len(stained) < 3:
        raise ValueError(f"{len(stained)} stained pixels")
    _, vecs = np.linalg.eigh(np.cov(stained.T))  # ascending eigenvalues: the plane is the last two
    plane = vecs[:, 1:3] * np.where(vecs[:, 1:3].sum(axis=0) < 0, -1.0, 1.0)  # (3, 2), each pointing into OD > 0
    t = stained @ plane  # (m, 2)
    phi = np.arctan2(t[:, 1], t[:, 0])
    lo, hi = np.percentile(phi, alpha), np.percentile(phi, 100 - alpha)
    v_lo = plane @ np.array([math.cos(lo), math.sin(lo)])
    v_hi = plane @ np.array([math.cos(hi), math.sin(hi)])
    h, e = (v_lo, v_hi) if v_lo[0] > v_hi[0] else (v_hi, v_lo)  # haematoxylin absorbs more red
    matrix = np.stack([h, e], axis=1)  # (3, 2)
    matrix = matrix / np.linalg.norm(matrix, axis=0, keepdims=True)
    conc = np.linalg.pinv(matrix) @ od.T  # (2, n): the least-squares concentrations, as lstsq's to ~1e-15, 40x as fast
    max_conc = np.percentile(conc, percentile, axis=1)
    if not (np.all(np.isfinite(matrix)) and np.all(np.isfinite(max_conc))):
        raise ValueError("the fit is not finite")
    return matrix, max_conc, len(stained)


def fit_or_reference(rgb: np.ndarray, keep: np.ndarray | None = None, *, seed: int = 0) -> StainFit:
    """A slide's stain from (n, h, w, 3) uint8 views of its tissue; never raises.

    Args:
        rgb: (n, h, w, 3) uint8 views of the slide (the scan's detection view, or patches).
        keep: (n, h, w) bool, the pixels to fit on (None: all). Within those, marker ink (a saturated colour
            outside the H&E hues: :data:`INK_MIN_SATURATION`) and dark-grey pixels (black ink, dirt, bubble rims:
            :data:`~wsishard.builder.scan.artefacts.GREY_MAX_VALUE`) are left out, pixel by pixel.
        seed: seeds the subsample of pixels beyond :data:`_MAX_FIT_PIXELS`.

    The fit uses the stained pixels alone (OD >= ``BETA`` in every channel), the maximum concentrations too (where
    torchstain takes them over a tile's every pixel), so a slide's share of glass does not move them.

    Falls back to the reference (recording why) when fewer than :data:`MIN_PIXELS` stained pixels remain, or the
    fit is degenerate (H and E within :data:`MIN_ANGLE_DEG`, a vector with a negative channel, or a non-positive
    maximum concentration).
    """
    if rgb.size == 0:
        return reference_fit("no tissue patch to fit on")
    flat = rgb.reshape(-1, 3) if keep is None else rgb[keep]  # (k, 3)
    flat = flat[_every_channel_below(flat, _STAINED_BELOW)]  # the stained pixels: OD >= beta in every channel
    if len(flat) > _MAX_FIT_PIXELS:  # a seeded subsample: the cost is bounded, however large the view
        flat = flat[np.random.default_rng((seed, 0x57A1)).choice(len(flat), _MAX_FIT_PIXELS, replace=False)]
    hue, sat, val = (p[0] for p in hsv_planes(flat[None]))
    ink = (sat >= INK_MIN_SATURATION) & ~in_hue_band(hue, *HE_HUES_DEG)
    od = optical_density(flat[~(ink | ((val < GREY_MAX_VALUE) & (sat < GREY_MAX_SATURATION)))])
    stained = len(od)
    if stained < MIN_PIXELS:
        return reference_fit(f"too little stained tissue ({stained} px, {MIN_PIXELS} needed)", stained)
    try:
        matrix, max_conc, used = macenko(od)
    except (ValueError, np.linalg.LinAlgError) as exc:
        return reference_fit(f"the fit failed ({exc})", stained)
    angle = math.degrees(math.acos(min(1.0, float(matrix[:, 0] @ matrix[:, 1]))))
    if angle < MIN_ANGLE_DEG:
        return reference_fit(f"degenerate fit: H and E {angle:.1f} degrees apart (one stain?)", used)
    if np.any(matrix < -1e-3) or np.any(max_conc <= 0):
        return reference_fit("degenerate fit: a stain vector with negative OD or no concentration", used)
    return StainFit(np.clip(matrix, 0.0, None), max_conc, "fitted", "", used)
