"""The tissue scan's image operations (:mod:`wsishard.builder.morphology`, Otsu's threshold) are SciPy's and
scikit-image's, pixel for pixel: the tissue and artefact masks (and so the patches) do not move."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi
from skimage.morphology import disk

from wsishard.builder.morphology import close, dilate, label, median, otsu_threshold
from wsishard.builder.morphology import disk as own_disk


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


def test_disk_is_scikit_images() -> None:
    for radius in range(0, 16):
        assert np.array_equal(own_disk(radius), disk(radius)), radius


def _labels_equal(mask: np.ndarray, eight: bool) -> None:
    structure = np.ones((3, 3), dtype=bool) if eight else None
    want, n_want = ndi.label(mask, structure=structure)
    got, n_got = label(mask, eight=eight)
    assert n_got == n_want
    assert np.array_equal(got, want)  # the same numbering: the pigment step picks the largest label around a pixel


@pytest.mark.parametrize("eight", [False, True])
def test_labels_are_scipys_numbering_and_all(eight: bool) -> None:
    for mask in _masks():
        _labels_equal(mask, eight)
        _labels_equal(~mask, eight)


@pytest.mark.parametrize("threads", [1, 4])
def test_labels_of_a_large_mask_are_scipys_whatever_opencvs_threads(threads: int) -> None:
    """A view of a real slide is thousands of px a side; OpenCV may label it in parallel stripes."""
    import cv2

    rng = np.random.default_rng(1)
    mask = ndi.binary_dilation(rng.random((2400, 1900)) < 0.002, iterations=3) ^ (rng.random((2400, 1900)) < 0.05)
    before = cv2.getNumThreads()
    cv2.setNumThreads(threads)
    try:
        _labels_equal(mask, eight=True)
        _labels_equal(mask, eight=False)
    finally:
        cv2.setNumThreads(before)


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    images = [np.zeros((1, 1), np.uint8), rng.integers(0, 256, (1, 37), dtype=np.uint8)]
    images += [rng.integers(0, 256, (29, 1), dtype=np.uint8), rng.integers(0, 256, (2, 2), dtype=np.uint8)]
    for trial in range(40):
        h, w = (int(v) for v in rng.integers(1, 120, 2))
        if trial % 3 == 0:  # few values: ties everywhere
            images.append(rng.integers(0, 4, (h, w), dtype=np.uint8) * 60)
        elif trial % 3 == 1:
            images.append(rng.integers(0, 256, (h, w), dtype=np.uint8))
        else:  # smooth, like a blurred stain feature
            field = ndi.gaussian_filter(rng.random((h, w)), 4)
            images.append(np.clip((field - field.min()) / (np.ptp(field) + 1e-9) * 255, 0, 255).astype(np.uint8))
    return images


@pytest.mark.parametrize("radius", [1, 2, 3, 6])
def test_median_is_scikit_images_rank_median(radius: int) -> None:
    from skimage.filters.rank import median as rank_median

    footprint = disk(radius)
    for image in _images():
        assert np.array_equal(median(image, footprint), rank_median(image, footprint)), image.shape


def test_median_over_a_square_and_a_view() -> None:
    from skimage.filters.rank import median as rank_median

    square = np.ones((5, 5), dtype=np.uint8)
    image = np.random.default_rng(3).integers(0, 256, (60, 90), dtype=np.uint8)[::2, 1::3]  # not contiguous
    assert np.array_equal(median(image, square), rank_median(np.ascontiguousarray(image), square))


def test_median_refuses_a_footprint_it_cannot_slide() -> None:
    ring = np.ones((3, 3), dtype=np.uint8)
    ring[1, 1] = 0
    with pytest.raises(ValueError, match="footprint"):
        median(np.zeros((5, 5), np.uint8), ring)
    with pytest.raises(ValueError, match="footprint"):
        median(np.zeros((5, 5), np.uint8), np.ones((2, 3), np.uint8))


def test_otsu_is_scikit_images() -> None:
    from skimage.filters import threshold_otsu

    rng = np.random.default_rng(4)
    for trial in range(300):
        hist = np.zeros(256, dtype=np.int64)
        lo, hi = sorted(int(v) for v in rng.integers(0, 256, 2))
        if hi == lo:
            hi = lo + 1 if lo < 255 else lo
            lo = hi - 1
        scale = [10, 10_000, 30_000_000][trial % 3]  # past float32's exact integers too
        hist[lo : hi + 1] = rng.integers(0, scale, hi - lo + 1)
        hist[lo] = hist[hi] = max(1, scale // 7)
        assert otsu_threshold(hist) == float(threshold_otsu(hist=hist)), (lo, hi, scale)
