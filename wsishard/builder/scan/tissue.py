"""Pure tissue detection: a low-resolution RGB view of a slide -> a boolean tissue mask. No I/O.

The method is the one CLAM, Trident and hs2p use, with every size given in microns:

0. marker ink and dark artefacts (scanner edges, black dots, pen strokes, bubble rims) are found by colour and
   texture (:mod:`wsishard.builder.scan.artefacts`) and left out of everything that follows: they count as glass for the
   blur, are not in Otsu's histogram, and are cut out of the final mask. Dark pigment (melanin, haemosiderin,
   carbon, dense tissue) is told apart from them and stays tissue;
1. a per-pixel "stain" feature: HSV saturation, optionally maxed with darkness, where darkness is measured
   against the glass (``1 - value / glass_value``, the glass value being the most common bright value, pure
   white excluded) rather than against white, so a dim scan's background is not read as tissue while dark
   specks and ink still stand out (opaque black fill would read as tissue: use ``use_darkness=False``);
2. a median blur;
3. Otsu's threshold on the blurred feature, floored at ``min_threshold`` so a blank slide yields no tissue
   (or a fixed threshold instead of Otsu);
4. a morphological closing, then dropping small objects (dust) and filling small holes.

Inputs finer than ``thumb_mpp`` by 2x or more, or longer than ``max_thumb_px``, are first reduced by an
integer block mean; the mask comes back at the input's size either way.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from wsishard.builder.options.tissueopts import MAX_THUMB_MPP as MAX_THUMB_MPP
from wsishard.builder.options.tissueopts import TissueOptions as TissueOptions
from wsishard.slide.reader import composite_on_white

logger = logging.getLogger(__name__)

GLASS_MIN_VALUE = 128  # the glass is the most common HSV value in [GLASS_MIN_VALUE, 254]


@dataclass(frozen=True)
class TissueResult:
    """A view's tissue mask, the artefacts removed from it and the dark pigment kept in it; (H, W) bool each, the
    input's size."""

    mask: np.ndarray  # tissue
    ink: np.ndarray  # marker ink removed (empty when the ink filter is off)
    dark: np.ndarray  # dark artefacts removed (empty when the dark filter is off)
    pigment: np.ndarray  # dark pigment kept as tissue (inside ``mask``; empty when not told apart)


def detect_tissue(rgb: np.ndarray, mpp: float, options: TissueOptions | None = None) -> np.ndarray:
    """Detect tissue on a low-resolution view of a slide: :func:`find_tissue`'s mask.

    Args:
        rgb: (H, W, 3) uint8 RGB (or (H, W, 4) RGBA, composited on white: transparent areas are glass).
        mpp: microns per px of ``rgb``.
        options: detection options (defaults if None).

    Returns:
        (H, W) bool mask, True on tissue. A uniform or blank image gives an all-False mask.

    Raises:
        ValueError: ``rgb`` is not (H, W, 3|4) uint8, or ``mpp`` is not a positive number.
    """
    return find_tissue(rgb, mpp, options).mask


def find_tissue(rgb: np.ndarray, mpp: float, options: TissueOptions | None = None) -> TissueResult:
    """Detect tissue and the artefacts left out of it (see :func:`detect_tissue` for the arguments).

    Raises:
        ValueError: ``rgb`` is not (H, W, 3|4) uint8, or ``mpp`` is not a positive number.
    """
    opts = options if options is not None else TissueOptions()
    if rgb.ndim != 3 or rgb.shape[2] not in (3, 4) or rgb.dtype != np.uint8:
        raise ValueError(f"rgb must be (H, W, 3 or 4) uint8, got {rgb.shape} {rgb.dtype}")
    if not (math.isfinite(mpp) and mpp > 0):
        raise ValueError(f"mpp must be a positive number, got {mpp!r}")
    h, w = rgb.shape[:2]
    if h == 0 or w == 0:
        empty = np.zeros((h, w), dtype=bool)
        return TissueResult(empty, empty, empty, empty)
    from wsishard.builder.scan.artefacts import find_artefacts  # OpenCV: not at import (CLI start-up)

    rgb = composite_on_white(rgb)
    # never below one px: a view claimed far finer than it is (a wrong mpp) must not pad to terabytes
    factor = min(max(1, int(opts.thumb_mpp / mpp + 1e-6), math.ceil(max(h, w) / opts.max_thumb_px)), max(h, w))
    small = _block_mean(rgb, factor) if factor > 1 else rgb
    found = find_artefacts(
        small,
        mpp * factor,
        ink=opts.ink_filter,
        dark=opts.dark_filter,
        pigment=opts.keep_pigment,
        ink_min_saturation=opts.ink_min_saturation,
        he_hues_deg=(opts.he_hue_from_deg, opts.he_hue_to_deg),
        dark_max_value=opts.dark_max_value,
        margin_um=opts.artefact_margin_um,
    )
    mask = _detect(small, mpp * factor, opts, found.any)
    planes = [mask, found.ink, found.dark, found.pigment & mask]
    if factor > 1:
        planes = [np.repeat(np.repeat(p, factor, axis=0), factor, axis=1)[:h, :w] for p in planes]
    return TissueResult(*planes)


def tissue_fraction(mask: np.ndarray) -> float:
    """Fraction of True pixels in a tissue mask (0.0 for an empty one)."""
    return float(np.count_nonzero(mask)) / mask.size if mask.size else 0.0


def _detect(rgb: np.ndarray, mpp: float, opts: TissueOptions, removed: np.ndarray) -> np.ndarray:
    """The detection steps on (h, w, 3) uint8 at ``mpp`` um/px; ``removed`` (h, w) bool artefacts count as glass."""
    feature = stain_feature(rgb, use_darkness=opts.use_darkness)  # (h, w) uint8, 0..255
    cut = bool(removed.any())
    if cut:
        feature[removed] = 0
    radius = round(opts.median_um / mpp)
    if radius >= 1 and min(feature.shape) > 1:
        from wsishard.builder.scan.morphology import disk, median

        feature = median(feature, disk(radius))
    threshold = _threshold(feature[~removed] if cut else feature, opts)
    if threshold is None:
        return np.zeros(feature.shape, dtype=bool)
    mask = feature > threshold
    mask = _close(mask, round(opts.close_um / mpp))
    mask = _drop_small_objects(mask, opts.min_object_um2 / mpp**2)
    mask = _fill_small_holes(mask, opts.min_hole_um2 / mpp**2)
    return _drop_small_objects(mask & ~removed, opts.min_object_um2 / mpp**2) if cut else mask


def stain_feature(rgb: np.ndarray, *, use_darkness: bool = True) -> np.ndarray:
    """Per-pixel stain strength, 0..255 (a fresh array): HSV saturation, maxed with darkness against the glass.

    Args:
        rgb: (h, w, 3) uint8.
        use_darkness: include ``1 - value / glass_value``, the glass value being the most common HSV value
            in 128..254 (pure white, often padding or transparency, is left out), 255 if there is none.

    Returns:
        (h, w) uint8.
    """
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]  # per channel: reducing a last axis of 3 is slow
    hi = np.maximum(np.maximum(r, g), b)  # HSV value, (h, w) uint8
    lo = np.minimum(np.minimum(r, g), b)
    delta = (hi - lo).astype(np.uint16)
    sat = (delta * 255 + hi // 2) // np.maximum(hi, 1)  # == round(255 * S), S = delta / value (0 at black)
    if not use_darkness:
        return sat.astype(np.uint8)
    bright = np.bincount(hi.ravel(), minlength=256)[GLASS_MIN_VALUE:255]
    glass = GLASS_MIN_VALUE + int(np.argmax(bright)) if bright.any() else 255
    dark = (np.maximum(glass - hi.astype(np.int32), 0) * 255 + glass // 2) // glass
    return np.maximum(sat, dark).astype(np.uint8)


def _threshold(feature: np.ndarray, opts: TissueOptions) -> float | None:
    """The feature threshold (0..255 scale), or None when nothing can be tissue (a uniform image)."""
    if opts.fixed_threshold is not None:
        return opts.fixed_threshold * 255
    hist = np.bincount(feature.ravel(), minlength=256)
    if np.count_nonzero(hist) < 2:
        return None
    from wsishard.builder.scan.morphology import otsu_threshold

    otsu = otsu_threshold(hist)
    logger.debug("otsu threshold %.3f (floor %.3f)", otsu / 255, opts.min_threshold)
    return max(otsu, opts.min_threshold * 255)


def _close(mask: np.ndarray, radius: int) -> np.ndarray:
    """Binary closing with a disk; the border is padded by replication so edge tissue is not eroded."""
    if radius < 1 or not mask.any():
        return mask
    from wsishard.builder.scan.morphology import close, disk

    padded = np.pad(mask, radius, mode="edge")
    closed = close(padded, disk(radius))
    return closed[radius:-radius, radius:-radius]


def _drop_small_objects(mask: np.ndarray, max_px: float) -> np.ndarray:
    """Drop 8-connected objects of at most ``max_px`` pixels."""
    if max_px < 1 or not mask.any():
        return mask
    from wsishard.builder.scan.morphology import label

    labels, _ = label(mask, eight=True)
    sizes = np.bincount(labels.ravel())
    keep = sizes > max_px
    keep[0] = False
    return keep[labels]


def _fill_small_holes(mask: np.ndarray, max_px: float) -> np.ndarray:
    """Fill 4-connected background regions of at most ``max_px`` pixels that do not touch the border."""
    if max_px < 1 or mask.all() or not mask.any():
        return mask
    from wsishard.builder.scan.morphology import label

    labels, _ = label(~mask)
    sizes = np.bincount(labels.ravel())
    fill = sizes <= max_px
    fill[0] = False
    border = np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    fill[border] = False
    return mask | fill[labels]


def _block_mean(rgb: np.ndarray, factor: int) -> np.ndarray:
    """Reduce (h, w, 3) uint8 by an integer ``factor`` (block mean; edge blocks padded by replication)."""
    h, w = rgb.shape[:2]
    oh, ow = -(-h // factor), -(-w // factor)
    padded = np.pad(rgb, ((0, oh * factor - h), (0, ow * factor - w), (0, 0)), mode="edge")
    blocks = padded.reshape(oh, factor, ow, factor, 3).mean(axis=(1, 3))
    return np.rint(blocks).astype(np.uint8)
