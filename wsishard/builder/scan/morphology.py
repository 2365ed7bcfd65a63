"""The tissue scan's image operations through OpenCV and :mod:`wsishard._native`, pixel for pixel what SciPy and
scikit-image give, without importing either (about 0.5 s of a build's start-up):

- :func:`dilate` and :func:`close`: scipy.ndimage's ``binary_dilation`` and ``binary_closing`` (outside the mask
  counts as background), a tenth of the cost;
- :func:`label`: scipy.ndimage's ``label``, with its numbering (the order of each region's first pixel, row by
  row);
- :func:`median`: scikit-image's ``filters.rank.median``;
- :func:`disk`: scikit-image's ``morphology.disk``;
- :func:`otsu_threshold`: scikit-image's ``filters.threshold_otsu`` of a histogram.

Footprints are symmetric (disks, squares) of odd side, so OpenCV's kernel anchored at its centre is scipy's
structure (scipy dilates by the reflected structure; a symmetric one is its own reflection).
"""

from __future__ import annotations

import cv2
import numpy as np

from wsishard._native import rank_median


def disk(radius: int) -> np.ndarray:
    """(2r + 1, 2r + 1) uint8: 1 where ``x**2 + y**2 <= radius**2`` (scikit-image's ``disk``)."""
    span = np.arange(-radius, radius + 1)
    return (span[None, :] ** 2 + span[:, None] ** 2 <= radius**2).astype(np.uint8)


def label(mask: np.ndarray, eight: bool = False) -> tuple[np.ndarray, int]:
    """``(labels, n)``: the connected regions of ``mask`` (h, w) bool, 4-connected (8 with ``eight``), numbered
    1..n in the order of each region's first pixel, row by row, 0 outside (scipy.ndimage's ``label``).

    OpenCV's pixel-based scan (SAUF) numbers regions in that order: each region's first label is made at its first
    pixel, and the relabelling keeps the order of those labels."""
    n, labels = cv2.connectedComponentsWithAlgorithm(
        np.ascontiguousarray(mask).view(np.uint8), 8 if eight else 4, cv2.CV_32S, cv2.CCL_SAUF
    )
    return labels, n - 1


def median(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """(h, w) uint8: the median of ``image`` (h, w) uint8 over ``footprint`` (odd-sided, centred, each row one run
    symmetric about the centre: a disk, a square) around each pixel, pixels outside the image not counted
    (scikit-image's ``filters.rank.median``: of an even count, the upper of the two middle values)."""
    rows = footprint.astype(bool)
    half = rows.shape[1] // 2
    widths = rows.sum(axis=1)
    halfwidths = np.where(widths > 0, (widths - 1) // 2, -1).astype(np.int32)
    expected = np.abs(np.arange(rows.shape[1]) - half)[None, :] <= halfwidths[:, None]
    if rows.shape[0] % 2 != 1 or rows.shape[1] % 2 != 1 or not np.array_equal(rows, expected):
        raise ValueError("median: the footprint must be odd-sided with each row one run centred on the middle")
    src = np.ascontiguousarray(image, dtype=np.uint8)
    out = np.empty_like(src)
    if src.size:
        rank_median(src, out, src.shape[0], src.shape[1], halfwidths.tobytes())
    return out


def dilate(mask: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """(h, w) bool: ``mask`` (h, w) bool dilated by ``footprint`` (odd-sided, symmetric; bool or 0/1)."""
    grown = cv2.dilate(
        np.ascontiguousarray(mask).view(np.uint8),
        footprint.astype(np.uint8),
        borderType=cv2.BORDER_CONSTANT,
        borderValue=0,
    )
    return np.asarray(grown, dtype=bool)


def close(mask: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """(h, w) bool: ``mask`` (h, w) bool closed (dilated, then eroded) by ``footprint``, outside the mask counting
    as background in both steps (scipy's ``binary_closing``: pixels near the border may erode away)."""
    kernel = footprint.astype(np.uint8)
    grown = cv2.dilate(np.ascontiguousarray(mask).view(np.uint8), kernel, borderType=cv2.BORDER_CONSTANT, borderValue=0)
    closed = cv2.erode(grown, kernel, borderType=cv2.BORDER_CONSTANT, borderValue=0)
    return np.asarray(closed, dtype=bool)


def otsu_threshold(hist: np.ndarray) -> float:
    """Otsu's threshold of a histogram of the values 0..len-1 with at least two values present: the bin that
    maximises the between-class variance, computed as scikit-image's ``threshold_otsu(hist=...)`` computes it
    (the empty ends trimmed, float32 counts), so that it picks the same bin."""
    present = np.flatnonzero(hist)
    counts = hist[present[0] : present[-1] + 1].astype(np.float32)
    centers = np.arange(present[0], present[-1] + 1)
    weight1 = np.cumsum(counts)
    weight2 = np.cumsum(counts[::-1])[::-1]
    mean1 = np.cumsum(counts * centers) / weight1
    mean2 = (np.cumsum((counts * centers)[::-1]) / weight2[::-1])[::-1]
    variance12 = weight1[:-1] * weight2[1:] * (mean1[:-1] - mean2[1:]) ** 2
    return float(centers[int(np.argmax(variance12))])
