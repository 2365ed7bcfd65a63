"""Pure artefact detection on a low-resolution RGB view: marker ink by hue, dark artefacts by value, colour and
texture, with dark pigment told apart and kept as tissue. No I/O.

H&E stains tissue pink (eosin, hue about 320-345 degrees) and purple (haematoxylin, about 260-290); blood is red
(about 350-10). Marker ink is blue (about 210-230), green (120-160), black, or red-brown; scanner edges, black
dots, pen strokes in black and air-bubble rims are very dark or dark and grey. Pigment is dark too, but it is
tissue: melanin and haemosiderin are brown, anthracotic carbon is black specks inside tissue, dense lymphoid or
heavily stained tissue is a deep saturated purple. So:

- **ink**: saturated pixels (HSV saturation >= ``ink_min_saturation``) whose hue lies outside the H&E band
  ``[he_hue_from_deg, he_hue_to_deg]`` (it wraps through 0: 235 to 20 by default), dark pixels aside, and brown
  pixels joined to a pigment region aside (its lighter rim);
- **dark** (candidates): pixels darker than ``dark_max_value`` (HSV value, 0..1) whatever their colour, or
  dark-grey ones (value below :data:`GREY_MAX_VALUE` with saturation below :data:`GREY_MAX_SATURATION`);
- **pigment**: a connected region of dark candidates (8-connected, at the view's resolution) most of whose pixels
  look like pigmented tissue: *brown* (hue in :data:`BROWN_HUES_DEG`, saturation >= :data:`BROWN_MIN_SATURATION`),
  *deeply stained* (hue in :data:`STAIN_HUES_DEG`, saturation >= :data:`STAIN_MIN_SATURATION`) or *textured*
  (the value's local coefficient of variation over 3x3 pixels >= :data:`TEXTURE_MIN_CV`: specks), and which lies
  in tissue (less than :data:`PIGMENT_MAX_GLASS` of the pixels around it are glass). Ink, dots, edge bands and
  bubble rims are flat and neutral (black ink over tissue keeps the tissue's hue at a low saturation) or lie on
  the glass, so their regions stay dark artefacts. Pigment stays tissue.

Ink and dark artefacts are grown by a small margin (an ink stroke's soft edge) before tissue detection removes
them. Tissue under a light stroke keeps an H&E hue and stays tissue; it is lost only where the ink dominates the
pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wsishard._native import hsv_planes as native_hsv
from wsishard.builder.scan.morphology import dilate, disk, label

GREY_MAX_VALUE = 0.55  # dark-grey artefacts (bubble rims, out-of-focus dirt): value below this...
GREY_MAX_SATURATION = 0.12  # ...and saturation below this
BROWN_HUES_DEG = (340.0, 45.0)  # melanin, haemosiderin: red-brown to golden brown (the band wraps through 0)...
BROWN_MIN_SATURATION = 0.35  # ...and saturated (black ink over eosin is about 0.3)
STAIN_HUES_DEG = (250.0, 340.0)  # deeply stained tissue: purple to pink (navy and blue ink are below 250)...
STAIN_MIN_SATURATION = 0.5  # ...and strongly saturated
TEXTURE_MIN_CV = 0.3  # specks: the value's 3x3 standard deviation over its mean (flat ink and edges: below 0.1)
PIGMENT_MIN_SHARE = 0.5  # a dark region is pigment when at least this share of its pixels looks like pigment...
PIGMENT_MAX_GLASS = 0.5  # ...and less than this share of the pixels around it are glass:
GLASS_MIN_VALUE, GLASS_MAX_SATURATION = 0.8, 0.1  # bright and grey


@dataclass(frozen=True)
class ArtefactMasks:
    """Where a low-resolution view shows ink, a dark artefact or dark pigment; (h, w) bool each, the view's size.

    ``pigment`` is dark but tissue: it is not removed (it is not part of :attr:`any`)."""

    ink: np.ndarray
    dark: np.ndarray
    pigment: np.ndarray

    @property
    def any(self) -> np.ndarray:
        return self.ink | self.dark


def hsv_planes(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HSV hue (degrees, 0..360), saturation (0..1) and value (0..1) of (..., 3) uint8, as float32 planes of the
    leading shape each, in one C pass (:mod:`wsishard._native`).

    In float32, as numpy computes it: hue ``(g - b) / delta``, ``2 + (b - r) / delta`` or ``4 + (r - g) / delta``
    (the first channel holding the maximum decides), times 60, modulo 360 (0 for grey pixels); saturation
    ``delta / max(hi, 1)`` (0 at black); value ``hi / 255``.
    """
    flat = np.ascontiguousarray(rgb, dtype=np.uint8).reshape(-1, 3)
    planes = tuple(np.empty(flat.shape[0], dtype=np.float32) for _ in range(3))
    native_hsv(flat, *planes, flat.shape[0])
    hue, sat, val = (plane.reshape(rgb.shape[:-1]) for plane in planes)
    return hue, sat, val


def in_hue_band(hue: np.ndarray, start_deg: float, end_deg: float) -> np.ndarray:
    """Whether ``hue`` (degrees) lies in the band from ``start_deg`` to ``end_deg`` going up (it may wrap past 360)."""
    start, end = start_deg % 360.0, end_deg % 360.0
    if start <= end:
        return (hue >= start) & (hue <= end)
    return (hue >= start) | (hue <= end)


def find_artefacts(
    rgb: np.ndarray,
    mpp: float,
    *,
    ink: bool = True,
    dark: bool = True,
    pigment: bool = True,
    ink_min_saturation: float = 0.15,
    he_hues_deg: tuple[float, float] = (235.0, 20.0),
    dark_max_value: float = 0.25,
    margin_um: float = 8.0,
) -> ArtefactMasks:
    """Ink, dark-artefact and dark-pigment masks of a low-resolution view.

    Args:
        rgb: (h, w, 3) uint8 RGB (transparent areas already painted white).
        mpp: microns per px of ``rgb``.
        ink, dark: look for that kind (its mask is all False when not).
        pigment: tell dark pigment from dark artefacts and keep it (False: every dark pixel is an artefact).
        ink_min_saturation: HSV saturation (0..1) from which a colour outside the H&E band is ink.
        he_hues_deg: (from, to) hue band of H&E, degrees; it wraps past 360.
        dark_max_value: HSV value (0..1) below which a pixel is dark (an artefact unless its region is pigment).
        margin_um: the ink and dark-artefact masks are grown by this much (microns).
    """
    hue, sat, val = hsv_planes(rgb)
    empty = np.zeros(rgb.shape[:2], dtype=bool)
    candidate = (val < dark_max_value) | ((val < GREY_MAX_VALUE) & (sat < GREY_MAX_SATURATION))
    pig = pigment_regions(candidate, hue, sat, val) if dark and pigment and candidate.any() else empty
    dark_mask = candidate & ~pig if dark else empty
    ink_mask = (sat >= ink_min_saturation) & ~in_hue_band(hue, *he_hues_deg) & ~candidate if ink else empty
    if pig.any():  # the lighter rim of a pigment region: brown, outside the H&E band, joined to the region
        pig = _joined(pig, ink_mask & brown_like(hue, sat))
        ink_mask &= ~pig
    radius = round(margin_um / mpp)
    return ArtefactMasks(_grow(ink_mask, radius), _grow(dark_mask, radius), pig)


def brown_like(hue: np.ndarray, sat: np.ndarray) -> np.ndarray:
    """(h, w) bool: brown as melanin and haemosiderin are (hue in :data:`BROWN_HUES_DEG`, saturated)."""
    return in_hue_band(hue, *BROWN_HUES_DEG) & (sat >= BROWN_MIN_SATURATION)


def pigment_like(hue: np.ndarray, sat: np.ndarray, val: np.ndarray, where: np.ndarray) -> np.ndarray:
    """(k,) bool: whether the ``where`` (h, w) pixels are coloured or textured as pigmented tissue is (brown, deeply
    stained, or speckled), in ``np.nonzero(where)`` order; the planes are :func:`hsv_planes`'."""
    rows, cols = np.nonzero(where)
    h, s = hue[rows, cols], sat[rows, cols]
    brown = brown_like(h, s)
    stained = in_hue_band(h, *STAIN_HUES_DEG) & (s >= STAIN_MIN_SATURATION)
    padded = np.pad(val, 1, mode="edge")  # the 3x3 neighbourhood of the pixels only: they are few
    total, squares = np.zeros(rows.size, dtype=np.float32), np.zeros(rows.size, dtype=np.float32)
    for dy in range(3):
        for dx in range(3):
            v = padded[rows + dy, cols + dx]
            total += v
            squares += v * v
    mean = total / 9
    textured = squares / 9 - mean * mean >= (TEXTURE_MIN_CV * mean) ** 2  # local variance against the mean
    return brown | stained | textured


def pigment_regions(candidate: np.ndarray, hue: np.ndarray, sat: np.ndarray, val: np.ndarray) -> np.ndarray:
    """(h, w) bool: the 8-connected regions of ``candidate`` (dark pixels) in which at least
    :data:`PIGMENT_MIN_SHARE` of the pixels are :func:`pigment_like`, and less than :data:`PIGMENT_MAX_GLASS` of the
    pixels around which are glass (pigment lies inside tissue; a dot or a stroke on the glass does not)."""
    labels, n = label(candidate, eight=True)
    if n == 0:
        return np.zeros(candidate.shape, dtype=bool)
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    votes = np.bincount(labels[candidate][pigment_like(hue, sat, val, candidate)], minlength=n + 1)
    keep = votes >= PIGMENT_MIN_SHARE * sizes
    keep[0] = False
    if keep.any():  # the place: what lies around each region (a 1 px ring)
        ring = dilate(candidate, np.ones((3, 3), dtype=bool)) & ~candidate
        rows, cols = np.nonzero(ring)
        padded = np.pad(labels, 1, mode="edge")
        around = np.zeros(rows.size, dtype=labels.dtype)  # the region each ring pixel borders (the largest label)
        for dy in range(3):
            for dx in range(3):
                np.maximum(around, padded[rows + dy, cols + dx], out=around)
        glass = (val[rows, cols] >= GLASS_MIN_VALUE) & (sat[rows, cols] < GLASS_MAX_SATURATION)
        ring_px = np.bincount(around, minlength=n + 1)
        glass_px = np.bincount(around[glass], minlength=n + 1)
        keep &= glass_px < PIGMENT_MAX_GLASS * np.maximum(ring_px, 1)
    return keep[labels]


def _joined(core: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """(h, w) bool: ``core`` and the 8-connected regions of ``core | extra`` that hold some of ``core``."""
    labels, n = label(core | extra, eight=True)
    keep = np.zeros(n + 1, dtype=bool)
    keep[np.unique(labels[core])] = True
    keep[0] = False
    return keep[labels]


def _grow(mask: np.ndarray, radius: int) -> np.ndarray:
    if radius < 1 or not mask.any():
        return mask
    return dilate(mask, disk(radius))
