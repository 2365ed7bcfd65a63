"""The tissue scan's image operations (:mod:`wsishard.builder.scan.morphology`, Otsu's threshold) are SciPy's and
scikit-image's, pixel for pixel: the tissue and artefact masks (and so the patches) do not move."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi
from skimage.morphology import disk

from wsishard.builder.scan.morphology import close, dilate, label, median, otsu_threshold
from wsishard.builder.scan.morphology import disk as own_disk


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


def _hsv_as_numpy(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The HSV planes as 0.2 computed them in numpy (float32): the definition the C pass keeps bit for bit."""
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


def test_hsv_planes_are_numpys_bit_for_bit_for_every_colour() -> None:
    """All 2^24 colours, in chunks: hue, saturation and value have numpy's float32 bits (the artefact masks, the
    pigment regions and the stain fit compare them with thresholds)."""
    from wsishard.builder.scan.artefacts import hsv_planes

    colours = np.arange(1 << 24, dtype=np.uint32)
    for start in range(0, 1 << 24, 1 << 21):
        c = colours[start : start + (1 << 21)]
        rgb = np.stack([(c >> 16) & 255, (c >> 8) & 255, c & 255], axis=1).astype(np.uint8).reshape(512, -1, 3)
        for got, want in zip(hsv_planes(rgb), _hsv_as_numpy(rgb), strict=True):
            assert got.shape == want.shape and got.dtype == np.float32
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), start
    view = np.random.default_rng(5).integers(0, 256, (40, 60, 3), dtype=np.uint8)[::2, 1::3]  # not contiguous
    for got, want in zip(hsv_planes(view), _hsv_as_numpy(view), strict=True):
        assert np.array_equal(got, want)


def test_tissue_fractions_are_the_exact_integral_images() -> None:
    """Through OpenCV's int32 integral image, the fractions numpy's int64 cumsums gave, on masks and views."""
    from wsishard.builder.scan.grid import tissue_fractions

    rng = np.random.default_rng(6)
    for trial in range(200):
        h, w = (int(v) for v in rng.integers(1, 300, 2))
        mask = rng.random((h, w)) < rng.random()
        if trial % 3 == 0:
            mask = mask[::2, ::3]
        x, y = rng.uniform(-5, mask.shape[1] + 5, 50), rng.uniform(-5, mask.shape[0] + 5, 50)
        size = float(rng.uniform(0.5, 40))
        mh, mw = mask.shape
        integral = np.zeros((mh + 1, mw + 1), dtype=np.int64)
        integral[1:, 1:] = np.cumsum(np.cumsum(mask, axis=0, dtype=np.int64), axis=1)
        x0, y0 = np.clip(np.rint(x), 0, mw).astype(np.int64), np.clip(np.rint(y), 0, mh).astype(np.int64)
        x1 = np.clip(np.maximum(np.rint(x + size), x0 + 1), 0, mw).astype(np.int64)
        y1 = np.clip(np.maximum(np.rint(y + size), y0 + 1), 0, mh).astype(np.int64)
        inside = integral[y1, x1] - integral[y0, x1] - integral[y1, x0] + integral[y0, x0]
        want = (inside / np.maximum((x1 - x0) * (y1 - y0), 1)).astype(np.float32)
        assert np.array_equal(tissue_fractions(mask, x, y, size), want)
