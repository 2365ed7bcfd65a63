"""The in-memory slide backend (:class:`wsishard.slide.MemorySlide`): its pyramid, reads, mpp and life cycle."""

from __future__ import annotations

import re

import numpy as np
import pytest

from wsishard.errors import MissingMppError
from wsishard.slide import MemorySlide, read_lowres, resolve_mpp

RGB = np.random.default_rng(3).integers(0, 256, (200, 300, 3), dtype=np.uint8)  # (h, w, 3): width != height


def test_levels_shrink_by_the_downsample_until_min_level_px() -> None:
    slide = MemorySlide(RGB, downsample=2, min_level_px=64)
    assert slide.level_dimensions == ((300, 200), (150, 100), (75, 50))  # (width, height); 37 px would be < 64
    assert slide.level_downsamples == (1.0, 2.0, 4.0)
    assert MemorySlide(RGB).level_dimensions == ((300, 200), (75, 50))  # downsample 4: 18 px would be < 64
    assert MemorySlide(RGB, min_level_px=1000).level_dimensions == ((300, 200),)


def test_lower_levels_are_box_means_of_level_0() -> None:
    slide = MemorySlide(RGB, downsample=2, min_level_px=64)
    level1 = slide.read_level(1, 0, 0, 150, 100)  # (100, 150, 3)
    means = RGB.reshape(100, 2, 150, 2, 3).astype(np.float64).mean(axis=(1, 3))
    assert level1.shape == (100, 150, 3) and level1.dtype == np.uint8
    assert np.abs(level1 - means).max() <= 0.5 + 1e-9  # each pixel the rounded mean of its own 2x2 box


@pytest.mark.parametrize(("x", "y", "w", "h"), [(0, 0, 300, 200), (17, 33, 64, 40), (299, 199, 1, 1)])
def test_read_level_0_inside_the_image_is_the_array_slice(x: int, y: int, w: int, h: int) -> None:
    region = MemorySlide(RGB).read_level(0, x, y, w, h)
    assert region.shape == (h, w, 3) and region.dtype == np.uint8
    assert np.array_equal(region, RGB[y : y + h, x : x + w])


def test_read_level_reads_the_levels_own_pixels() -> None:
    slide = MemorySlide(RGB, downsample=2, min_level_px=64)
    whole = slide.read_level(1, 0, 0, 150, 100)
    assert np.array_equal(slide.read_level(1, 40, 10, 30, 20), whole[10:30, 40:70])


def test_outside_the_image_is_white() -> None:
    slide = MemorySlide(RGB)
    region = slide.read_level(0, -10, 190, 40, 30)  # 10 px left of the image, 20 px below it
    assert region.shape == (30, 40, 3)
    assert np.array_equal(region[:10, 10:], RGB[190:200, 0:30])
    assert (region[:, :10] == 255).all() and (region[10:] == 255).all()
    assert (slide.read_level(0, 300, 0, 8, 8) == 255).all()  # entirely right of the image
    assert (slide.read_level(0, -50, -50, 20, 20) == 255).all()  # entirely above and left


def test_properties_give_the_mpp_as_openslide_does() -> None:
    assert resolve_mpp("m", MemorySlide(RGB, mpp=0.2468).properties, None, None) == (pytest.approx(0.2468), "openslide")
    bare = MemorySlide(RGB, mpp=None)
    assert dict(bare.properties) == {}
    with pytest.raises(MissingMppError):
        resolve_mpp("m", bare.properties, None, None)
    assert resolve_mpp("m", bare.properties, None, 0.5) == (0.5, "default")


def test_read_lowres_takes_the_matching_level() -> None:
    slide = MemorySlide(RGB, downsample=2, min_level_px=64)
    thumb, l0_per_px = read_lowres(slide, 4.0)
    assert l0_per_px == 4.0
    assert np.array_equal(thumb, slide.read_level(2, 0, 0, 75, 50))


def test_context_manager_gives_the_slide_and_closes_it() -> None:
    with MemorySlide(RGB, path="mem://a") as slide:
        assert slide.path == "mem://a" and slide.backend == "memory"
        assert np.array_equal(slide.read_level(0, 0, 0, 4, 4), RGB[:4, :4])
    with pytest.raises(IndexError):  # closed: its pixels are gone
        slide.read_level(0, 0, 0, 4, 4)


@pytest.mark.parametrize(
    ("rgb", "kw", "message"),
    [
        (RGB.astype(np.float32), {}, "float32"),
        (RGB[..., 0], {}, "(200, 300)"),
        (RGB[..., :2], {}, "(200, 300, 2)"),
        (RGB, {"downsample": 1}, "downsample must be >= 2, got 1"),
    ],
)
def test_bad_arrays_and_downsamples_are_value_errors(rgb: np.ndarray, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MemorySlide(rgb, **kw)


@pytest.mark.parametrize(
    ("mpp", "size", "message"),
    [
        (25400 / 72, (4000, 3000), "this slide's resolution metadata looks wrong (72 dpi: 352.8 um/px"),
        (25400 / 300, (4000, 3000), "(300 dpi: 84.7 um/px"),
        (26.0, (100_000, 80_000), "(26 um/px makes its 100000 px 2,600 mm long"),
        (1e-6, (100_000, 80_000), "(1e-06 um/px is finer than a microscope resolves)"),
    ],
)
def test_a_resolution_no_microscope_gives_counts_as_none(mpp: float, size: tuple[int, int], message: str) -> None:
    properties = MemorySlide(RGB, mpp=mpp).properties
    with pytest.raises(MissingMppError, match=re.escape(message) + ".*give its mpp with --mpp-csv or --default-mpp"):
        resolve_mpp("m", properties, None, None, size)
    assert resolve_mpp("m", properties, None, 0.5, size) == (0.5, "default")  # as for a slide without one
    assert resolve_mpp("m", properties, 0.25, None, size) == (0.25, "csv")


def test_real_scanners_resolutions_are_kept() -> None:
    for mpp in (0.2520, 0.2631, 0.2265, 0.2425, 0.25, 0.5, 1.0, 2.0):  # up to a 75 mm slide at 40x
        properties = MemorySlide(RGB, mpp=mpp).properties
        assert resolve_mpp("m", properties, None, None, (int(75_000 / mpp), int(50_000 / mpp))) == (
            pytest.approx(mpp),
            "openslide",
        )
