"""QC pictures (:func:`wsishard.builder.qc.qc_picture`): size cap, tissue contour and patch outlines."""

from __future__ import annotations

import numpy as np
import pytest

from wsishard.builder.qc import qc_picture

CONTOUR = (0, 170, 0)
PATCH = (30, 60, 230)
GREY = 200


def _thumb(height: int = 300, width: int = 400) -> np.ndarray:
    return np.full((height, width, 3), GREY, dtype=np.uint8)  # (h, w, 3)


def _no_patches() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def _is(picture: np.ndarray, rgb: tuple[int, int, int]) -> np.ndarray:
    return (picture == np.array(rgb, dtype=np.uint8)).all(axis=-1)  # (h, w) bool


@pytest.mark.parametrize(
    ("height", "width", "max_side", "size"),
    [(300, 400, 1200, (400, 300)), (300, 400, 400, (400, 300)), (300, 400, 200, (200, 150)),
     (1000, 250, 100, (25, 100)), (3, 2000, 100, (100, 1))],
)  # fmt: skip
def test_picture_is_capped_at_max_side_px_keeping_its_aspect(height: int, width: int, max_side: int,
                                                               size: tuple[int, int]) -> None:  # fmt: skip
    mask = np.zeros((height, width), dtype=bool)
    picture = qc_picture(_thumb(height, width), mask, 4.0, *_no_patches(), 64, max_side_px=max_side)
    assert picture.mode == "RGB" and picture.size == size  # (width, height)


def test_contour_pixels_are_drawn_in_the_contour_colour() -> None:
    mask = np.zeros((300, 400), dtype=bool)
    mask[50:150, 60:200] = True  # tissue: rows 50..149, columns 60..199
    picture = np.asarray(qc_picture(_thumb(), mask, 4.0, *_no_patches(), 64))
    border = mask.copy()
    border[51:149, 61:199] = False  # the tissue's outermost ring of pixels
    assert np.array_equal(_is(picture, CONTOUR), border)
    assert (picture[~border] == GREY).all()  # the rest of the thumbnail is unchanged
    assert not _is(picture, PATCH).any()


def test_patch_rectangles_are_drawn_where_the_patches_are() -> None:
    mask = np.zeros((300, 400), dtype=bool)
    l0_x, l0_y = np.array([160, 800]), np.array([80, 1600])  # level-0 corners; 8 level-0 px per thumbnail px
    picture = np.asarray(qc_picture(_thumb(), mask, 8.0, l0_x, l0_y, 80))
    drawn = _is(picture, PATCH)
    expected = np.zeros_like(drawn)
    for t_x, t_y in ((20, 10), (100, 200)):  # 80 level-0 px: a 10 px square outline from the corner
        expected[t_y : t_y + 10, t_x : t_x + 10] = True
        expected[t_y + 1 : t_y + 9, t_x + 1 : t_x + 9] = False
    assert np.array_equal(drawn, expected)
    assert (picture[~drawn] == GREY).all()


def test_patch_rectangles_follow_the_size_cap() -> None:
    mask = np.zeros((300, 400), dtype=bool)
    picture = qc_picture(_thumb(), mask, 8.0, np.array([160]), np.array([80]), 80, max_side_px=200)  # half size
    drawn = _is(np.asarray(picture), PATCH)
    assert picture.size == (200, 150)
    assert drawn[5, 10:15].all() and drawn[9, 10:15].all() and drawn[5:10, 10].all() and drawn[5:10, 14].all()
    assert drawn.sum() == 16  # the outline of a 5 px square at (10, 5), nothing else
    assert not drawn[6:9, 11:14].any()
