"""Binary morphology through OpenCV (:mod:`wsishard.builder.morphology`) is scipy.ndimage's, pixel for pixel: the
tissue and artefact masks (and so the patches) do not move."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi
from skimage.morphology import disk

from wsishard.builder.morphology import close, dilate


def _masks() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    masks = []
    for trial in range(60):
        h, w = (int(v) for v in rng.integers(1, 160, 2))
        if trial % 2:
            masks.append(rng.random((h, w)) < rng.choice([0.02, 0.3, 0.7, 0.97]))  # specks and holes
        else:  # blobs, some touching the border
            masks.append(ndi.binary_dilation(rng.random((h, w)) < 0.01, iterations=int(rng.integers(1, 8))))
    return masks


@pytest.mark.parametrize("radius", [1, 2, 5, 11])
def test_dilation_and_closing_by_a_disk_are_scipys(radius: int) -> None:
    footprint = disk(radius)
    for mask in _masks():
        assert np.array_equal(dilate(mask, footprint), ndi.binary_dilation(mask, structure=footprint.astype(bool)))
        assert np.array_equal(close(mask, footprint), ndi.binary_closing(mask, structure=footprint.astype(bool)))


def test_dilation_by_a_square_is_scipys_and_keeps_the_input() -> None:
    square = np.ones((3, 3), dtype=bool)
    for mask in _masks():
        before = mask.copy()
        assert np.array_equal(dilate(mask, square), ndi.binary_dilation(mask, structure=square))
        assert np.array_equal(mask, before)
    view = np.zeros((40, 60), dtype=bool)[::2, ::3]  # not contiguous
    view[5, 5] = True
    assert dilate(view, square).sum() == 9
