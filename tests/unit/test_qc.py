"""QC pictures (:func:`wsishard.builder.qc.qc.qc_picture`): size cap, tissue contour, translucent patch fill, removed
artefacts and annotation outlines in their own colours, the legend band."""

from __future__ import annotations

import numpy as np
import pytest

from wsishard.builder.qc.qc import (
    CONTOUR_RGB,
    DARK_RGB,
    FILL_ALPHA,
    INK_RGB,
    PATCH_RGB,
    ROI_RGB,
    QcLayers,
    legend_lines,
    qc_picture,
)

GREY = 200


def _view(height: int = 300, width: int = 400) -> np.ndarray:
    return np.full((height, width, 3), GREY, dtype=np.uint8)  # (h, w, 3)


def _none() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def _is(picture: np.ndarray, rgb: tuple[int, int, int], tol: int = 0) -> np.ndarray:
    return (np.abs(picture.astype(int) - np.array(rgb)) <= tol).all(axis=-1)  # (h, w) bool


def _blended(color: tuple[int, int, int], alpha: float) -> tuple[int, int, int]:
    r, g, b = (round(GREY * (1 - alpha) + c * alpha) for c in color)
    return r, g, b


@pytest.mark.parametrize(
    ("height", "width", "max_side", "size"),
    [
        (300, 400, 2000, (400, 300)),
        (300, 400, 400, (400, 300)),
        (300, 400, 200, (200, 150)),
        (1000, 250, 100, (25, 100)),
        (3, 2000, 100, (100, 1)),
    ],
)
def test_picture_is_capped_at_max_side_px_keeping_its_aspect(
    height: int, width: int, max_side: int, size: tuple[int, int]
) -> None:
    layers = QcLayers(np.zeros((height, width), dtype=bool), 4.0)
    picture = qc_picture(_view(height, width), 4.0, layers, *_none(), 64, max_side_px=max_side)
    assert picture.mode == "RGB" and picture.size == size  # (width, height)


def test_contour_pixels_are_drawn_in_the_contour_colour() -> None:
    mask = np.zeros((300, 400), dtype=bool)
    mask[50:150, 60:200] = True  # tissue: rows 50..149, columns 60..199
    picture = np.asarray(qc_picture(_view(), 4.0, QcLayers(mask, 4.0), *_none(), 64))
    border = mask.copy()
    border[51:149, 61:199] = False  # the tissue's outermost ring of pixels
    assert np.array_equal(_is(picture, CONTOUR_RGB), border)
    assert (picture[~border] == GREY).all()  # the rest of the view is unchanged


def test_mask_on_a_coarser_grid_is_scaled_to_the_picture() -> None:
    mask = np.zeros((30, 40), dtype=bool)  # 10x coarser than the view
    mask[5:15, 6:20] = True
    picture = np.asarray(qc_picture(_view(), 4.0, QcLayers(mask, 40.0), *_none(), 64))
    contour = _is(picture, CONTOUR_RGB)
    assert contour[50, 60:200].all() and contour[149, 60:200].all() and not contour[100, 100]


def test_kept_patches_are_a_translucent_fill() -> None:
    mask = np.zeros((300, 400), dtype=bool)
    l0_x, l0_y = np.array([160, 800]), np.array([80, 1600])  # level-0 corners; 8 level-0 px per view px
    picture = np.asarray(qc_picture(_view(), 8.0, QcLayers(mask, 8.0), l0_x, l0_y, 80))
    filled = _is(picture, _blended(PATCH_RGB, FILL_ALPHA), tol=1)
    expected = np.zeros_like(filled)
    for t_x, t_y in ((20, 10), (100, 200)):  # 80 level-0 px: a 10 px square from the corner
        expected[t_y : t_y + 10, t_x : t_x + 10] = True
    assert np.array_equal(filled, expected)
    assert (picture[~filled] == GREY).all()


def test_patches_follow_the_size_cap() -> None:
    mask = np.zeros((300, 400), dtype=bool)
    picture = qc_picture(_view(), 8.0, QcLayers(mask, 8.0), np.array([160]), np.array([80]), 80, max_side_px=200)
    filled = _is(np.asarray(picture), _blended(PATCH_RGB, FILL_ALPHA), tol=1)
    assert picture.size == (200, 150)
    assert filled[5:10, 10:15].all() and filled.sum() == 25  # a 5 px square at (10, 5), nothing else


def test_artefacts_and_annotations_in_their_own_colours() -> None:
    tissue = np.zeros((300, 400), dtype=bool)
    ink, dark, roi = tissue.copy(), tissue.copy(), tissue.copy()
    ink[10:20, 10:20] = True
    dark[10:20, 100:120] = True
    roi[100:200, 100:300] = True
    picture = np.asarray(qc_picture(_view(), 4.0, QcLayers(tissue, 4.0, ink, dark, roi), *_none(), 64))
    assert _is(picture[10:20, 10:20], _blended(INK_RGB, 0.5), tol=1).all()
    assert _is(picture[10:20, 100:120], _blended(DARK_RGB, 0.5), tol=1).all()
    assert _is(picture, ROI_RGB)[100, 100:300].all() and not _is(picture, ROI_RGB)[150, 150]
    assert _is(picture, ROI_RGB).sum() == 2 * 200 + 2 * 98  # the region's outline only


def test_legend_band_holds_the_counts() -> None:
    lines = legend_lines(
        tissue_mm2=12.345,
        ink_mm2=1.5,
        artefact_mm2=0.25,
        kept=1234,
        filtered={"roi": 7, "artefact": 3},
        roi="annotated: a.geojson",
    )
    assert "12.35 mm2" in lines[0] and "1,234" in lines[0] and "annotated: a.geojson" in lines[0]
    assert lines[1] == "left out: artefact 3, roi 7"
    plain = qc_picture(_view(), 4.0, QcLayers(np.zeros((300, 400), dtype=bool), 4.0), *_none(), 64)
    with_legend = qc_picture(_view(), 4.0, QcLayers(np.zeros((300, 400), dtype=bool), 4.0), *_none(), 64, legend=lines)
    assert with_legend.width == plain.width and with_legend.height > plain.height
    band = np.asarray(with_legend)[plain.height :]
    assert (band < 100).any() and (band == 255).mean() > 0.8  # dark text on white


@pytest.mark.parametrize("width", [1, 2, 3])
def test_outline_is_scikit_image_inner_boundary_grown_inwards(width: int) -> None:
    """The contour drawn with OpenCV is, pixel for pixel, ``find_boundaries(mode="inner")`` dilated ``width - 1``
    times within the mask (what the pictures showed before), on random blobs touching the image's border."""
    from scipy import ndimage as ndi
    from skimage.segmentation import find_boundaries

    from wsishard.builder.qc.qc import _outline

    rng = np.random.default_rng(width)
    for _ in range(5):
        mask = ndi.gaussian_filter(rng.random((120, 170)), 3) > 0.5  # blobs, holes, some on the border
        expected = find_boundaries(mask, mode="inner")
        if width > 1:
            expected = ndi.binary_dilation(expected, iterations=width - 1) & mask
        assert np.array_equal(_outline(mask, width), expected)


@pytest.mark.parametrize("alpha", [FILL_ALPHA, 0.5])
def test_blend_is_pillow_composite_to_the_pixel(alpha: float) -> None:
    """The in-place blend gives exactly the pixels of ``Image.composite`` with an 8-bit mask (the pictures' fills
    before they were drawn in place), and leaves every pixel outside ``where`` as it was."""
    from PIL import Image

    from wsishard.builder.qc.qc import _blend

    rng = np.random.default_rng(1)
    view = rng.integers(0, 256, size=(64, 96, 3), dtype=np.uint8)
    where = rng.random((64, 96)) < 0.4
    mask = Image.fromarray(where.astype(np.uint8) * round(alpha * 255))
    expected = Image.composite(Image.new("RGB", (96, 64), INK_RGB), Image.fromarray(view), mask)
    out = view.copy()
    _blend(out, where, INK_RGB, alpha)
    assert np.array_equal(out, np.asarray(expected))
    assert np.array_equal(out[~where], view[~where])
