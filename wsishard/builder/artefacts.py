"""Pure artefact detection on a low-resolution RGB view: marker ink by hue, dark artefacts by value. No I/O.

H&E stains tissue pink (eosin, hue about 320-345 degrees) and purple (haematoxylin, about 260-290); blood is red
(about 350-10). Marker ink is blue (about 210-230), green (120-160), black, or red-brown; scanner edges, black
dots, pen strokes in black and air-bubble rims are very dark or dark and grey. So:

- **ink**: saturated pixels (HSV saturation >= ``ink_min_saturation``) whose hue lies outside the H&E band
  ``[he_hue_from_deg, he_hue_to_deg]`` (it wraps through 0: 235 to 20 by default);
- **dark**: pixels darker than ``dark_max_value`` (HSV value, 0..1) whatever their colour, or dark-grey ones
  (value below :data:`GREY_MAX_VALUE` with saturation below :data:`GREY_MAX_SATURATION`: no stained tissue is
  both that dark and that grey).

Both masks are grown by a small margin (an ink stroke's soft edge) before tissue detection removes them. Tissue
under a light stroke keeps an H&E hue and stays tissue; it is lost only where the ink dominates the pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi
from skimage.morphology import disk

GREY_MAX_VALUE = 0.55  # dark-grey artefacts (bubble rims, out-of-focus dirt): value below this...
GREY_MAX_SATURATION = 0.12  # ...and saturation below this


@dataclass(frozen=True)
class ArtefactMasks:
    """Where a low-resolution view shows ink or a dark artefact; (h, w) bool each, the view's size."""

    ink: np.ndarray
    dark: np.ndarray

    @property
    def any(self) -> np.ndarray:
        return self.ink | self.dark


def hsv_planes(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HSV hue (degrees, 0..360), saturation (0..1) and value (0..1) of (h, w, 3) uint8, as (h, w) float32 each.

    Grey pixels (no saturation) get hue 0.
    """
    rgbf = rgb.astype(np.float32)
    r, g, b = rgbf[..., 0], rgbf[..., 1], rgbf[..., 2]
    hi = np.maximum(np.maximum(r, g), b)
    lo = np.minimum(np.minimum(r, g), b)
    delta = hi - lo
    safe = np.where(delta > 0, delta, 1.0)
    hue = np.where(hi == r, (g - b) / safe, np.where(hi == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = np.where(delta > 0, (hue * 60.0) % 360.0, 0.0).astype(np.float32)
    sat = np.where(hi > 0, delta / np.maximum(hi, 1.0), 0.0).astype(np.float32)
    return hue, sat, (hi / 255.0).astype(np.float32)


def in_hue_band(hue: np.ndarray, start_deg: float, end_deg: float) -> np.ndarray:
    """Whether ``hue`` (degrees) lies in the band from ``start_deg`` to ``end_deg`` going up (it may wrap past 360)."""
    start, end = start_deg % 360.0, end_deg % 360.0
    if start <= end:
        return (hue >= start) & (hue <= end)
    return (hue >= start) | (hue <= end)


def find_artefacts(rgb: np.ndarray, mpp: float, *, ink: bool = True, dark: bool = True,
                   ink_min_saturation: float = 0.15, he_hues_deg: tuple[float, float] = (235.0, 20.0),
                   dark_max_value: float = 0.25, margin_um: float = 8.0) -> ArtefactMasks:  # fmt: skip
    """Ink and dark-artefact masks of a low-resolution view.

    Args:
        rgb: (h, w, 3) uint8 RGB (transparent areas already painted white).
        mpp: microns per px of ``rgb``.
        ink, dark: look for that kind (its mask is all False when not).
        ink_min_saturation: HSV saturation (0..1) from which a colour outside the H&E band is ink.
        he_hues_deg: (from, to) hue band of H&E, degrees; it wraps past 360.
        dark_max_value: HSV value (0..1) below which any pixel is a dark artefact.
        margin_um: both masks are grown by this much (microns).
    """
    hue, sat, val = hsv_planes(rgb)
    empty = np.zeros(rgb.shape[:2], dtype=bool)
    dark_mask = (val < dark_max_value) | ((val < GREY_MAX_VALUE) & (sat < GREY_MAX_SATURATION)) if dark else empty
    ink_mask = (sat >= ink_min_saturation) & ~in_hue_band(hue, *he_hues_deg) & ~dark_mask if ink else empty
    radius = round(margin_um / mpp)
    return ArtefactMasks(_grow(ink_mask, radius), _grow(dark_mask, radius))


def _grow(mask: np.ndarray, radius: int) -> np.ndarray:
    if radius < 1 or not mask.any():
        return mask
    return ndi.binary_dilation(mask, structure=disk(radius).astype(bool))
