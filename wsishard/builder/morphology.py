"""Binary morphology of the tissue and artefact masks through OpenCV: pixel for pixel what scipy.ndimage's
``binary_dilation`` and ``binary_closing`` give (outside the mask counts as background), a tenth of the cost.

Footprints are symmetric (disks, squares) of odd side, so OpenCV's kernel anchored at its centre is scipy's
structure (scipy dilates by the reflected structure; a symmetric one is its own reflection).
"""

from __future__ import annotations

import cv2
import numpy as np


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
