"""Seeded pigment for synthetic slides: dark tissue that is tissue (melanin, anthracotic carbon, dense tissue).

Pigment lies inside the tissue and keeps the tissue's texture, as it does on real slides. Each kind is painted as one
or two irregular blobs 150-350 um in radius well inside the tissue (at true-mask resolution, like
:mod:`wsishard.testing.artefacts`):

- ``melanin``: brown, a per-channel transmittance of :data:`MELANIN_T` (0.35 / 0.25 / 0.18) over the tissue;
- ``carbon``: anthracotic pigment, black specks 3-16 um across in clumps, covering about a third of the blob, drawn
  at level 0 from a periodic speck swatch (:func:`carbon_swatch`): black but speckled, never a flat fill;
- ``dense``: dark purple tissue (packed nuclei, heavy haematoxylin), a transmittance of :data:`DENSE_T`.

The true pigment mask is ``alpha >= 0.5`` inside the tissue; the slide's true tissue mask keeps it (pigment is
tissue).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi
from skimage.draw import disk as draw_disk

from wsishard.testing.tissue_field import blur_wrap, normalized, pick, smooth_noise

PIGMENT_KINDS: tuple[str, ...] = ("melanin", "carbon", "dense")
MELANIN_T = (0.35, 0.25, 0.18)  # brown: the pixels' per-channel transmittance where melanin covers them
DENSE_T = (0.26, 0.2, 0.33)  # dark purple over the synthetic stain: packed nuclei, heavy haematoxylin
CARBON_T = (0.09, 0.09, 0.10)  # a carbon speck over the tissue
CARBON_COVER = 0.35  # fraction of a carbon blob's area under specks


@dataclass(frozen=True)
class Pigments:
    """Pigment layers at true-mask resolution (the tissue field's shape).

    Attributes:
        alpha: (rows, cols) float32 0..1: how much pigment covers each pixel (0 outside the tissue).
        factor: (rows, cols, 3) float32: what the pixels are multiplied by for melanin and dense tissue (1 elsewhere).
        carbon: (rows, cols) float32 0..1: the weight of the level-0 carbon specks (0 where there are none).
    """

    alpha: np.ndarray
    factor: np.ndarray
    carbon: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        """(rows, cols) bool: pigmented tissue."""
        return self.alpha >= 0.5


def make_pigments(rng: np.random.Generator, field: np.ndarray, px_um: float, kinds: Sequence[str]) -> Pigments:
    """Pigment layers inside the tissue ``field`` (mask px, > 0 inside tissue) at ``px_um`` microns per mask px.

    Raises:
        ValueError: an unknown kind.
    """
    bad = [k for k in kinds if k not in PIGMENT_KINDS]
    if bad:
        raise ValueError(f"invalid pigments: {bad!r} (kinds: {', '.join(PIGMENT_KINDS)})")
    shape = field.shape
    inside = np.clip(field, 0.0, 1.0).astype(np.float32)  # 0 on the glass, 1 a mask px inside the tissue
    alpha = np.zeros(shape, dtype=np.float32)
    factor = np.ones((*shape, 3), dtype=np.float32)
    carbon = np.zeros(shape, dtype=np.float32)
    depth = ndi.distance_transform_edt(field > 0) * px_um if (field > 0).any() else None
    for kind in kinds:
        for _ in range(int(rng.integers(1, 3))):
            blob = _blob(rng, field, depth, px_um) * inside
            alpha = np.maximum(alpha, blob)
            if kind == "carbon":
                carbon = np.maximum(carbon, blob)
            else:
                trans = np.array(MELANIN_T if kind == "melanin" else DENSE_T, dtype=np.float32)
                factor *= 1 - blob[..., None] + blob[..., None] * trans
    return Pigments(alpha, factor, carbon)


def _blob(rng: np.random.Generator, field: np.ndarray, depth: np.ndarray | None, px_um: float) -> np.ndarray:
    """(rows, cols) float32 0..1: an irregular blob 150-350 um in radius, centred well inside the tissue."""
    rows, cols = field.shape
    r = rng.uniform(150.0, 350.0) / px_um
    if depth is None:
        return np.zeros(field.shape, dtype=np.float32)
    deep = depth >= min(0.6 * r * px_um, float(depth.max()))
    cy, cx = pick(rng, deep)
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float32)
    theta = np.arctan2(yy - cy, xx - cx)
    wobble = 1 + 0.2 * np.sin(3 * theta + rng.uniform(0, 6.3)) + 0.1 * np.sin(5 * theta + rng.uniform(0, 6.3))
    return np.clip(r * wobble - np.hypot(yy - cy, xx - cx) + 0.5, 0.0, 1.0).astype(np.float32)


def carbon_swatch(rng: np.random.Generator, size: int, mpp: float) -> np.ndarray:
    """(size, size) float32 0..1 periodic opacity of carbon specks at ``mpp`` microns per px: discs 3-16 um across
    in clumps (a ~40 um noise thresholded), covering about :data:`CARBON_COVER` of the area."""
    um = 1.0 / mpp
    clumps = normalized(smooth_noise(rng, (size, size), 40.0 * um)) > 0.0
    alpha = np.zeros((size, size), dtype=np.float32)
    mean_r = 4.5 * um
    target = CARBON_COVER * size * size
    for _ in range(int(4 * target / (np.pi * mean_r**2))):
        cy, cx = rng.uniform(0, size, 2)
        if not clumps[int(cy) % size, int(cx) % size]:
            continue
        rr, cc = draw_disk((cy, cx), max(rng.uniform(1.5, 8.0) * um, 0.7))
        alpha[rr % size, cc % size] = 1.0
        if np.count_nonzero(alpha) >= target:
            break
    return np.clip(blur_wrap(alpha, (0.4 * um, 0.4 * um)), 0.0, 1.0).astype(np.float32)
