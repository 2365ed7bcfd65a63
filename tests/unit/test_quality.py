"""Per-patch quality scores (background, dark, sharpness) and the build-time filters on them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageFilter

from wsishard.builder.quality import QualityOptions, quality_scores
from wsishard.errors import OptionError


def _tissue(size: int = 256, seed: int = 0) -> Image.Image:
    """Pink with purple dots: an in-focus H&E-like texture."""
    rng = np.random.default_rng(seed)
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[...] = (225, 150, 190)
    dots = rng.random((size, size)) < 0.08
    img[dots] = (100, 60, 150)
    return Image.fromarray(img)


def test_glass_is_background_and_black_is_dark() -> None:
    glass = Image.new("RGB", (256, 256), (240, 240, 242))
    black = Image.new("RGB", (256, 256), (15, 15, 15))
    assert quality_scores(glass) == {"background": 1.0, "dark": 0.0, "sharpness": 0.0}
    assert quality_scores(black)["dark"] == 1.0 and quality_scores(black)["background"] == 0.0
    tissue = quality_scores(_tissue())
    assert tissue["background"] == 0.0 and tissue["dark"] == 0.0


def test_background_fraction_follows_the_glass_area() -> None:
    img = np.asarray(_tissue()).copy()
    img[:, :64] = (240, 240, 242)  # a quarter glass
    assert quality_scores(Image.fromarray(img))["background"] == pytest.approx(0.25, abs=0.02)


def test_blur_lowers_sharpness() -> None:
    sharp = _tissue(seed=1)
    scores = [quality_scores(sharp.filter(ImageFilter.GaussianBlur(r)))["sharpness"] for r in (0, 2, 6)]
    assert scores[0] > 2 * scores[1] > 0 and scores[1] > 2 * scores[2]


@pytest.mark.parametrize("size", [8, 64, 100, 512])
def test_any_patch_size(size: int) -> None:
    scores = quality_scores(_tissue(size))
    assert set(scores) == {"background", "dark", "sharpness"} and scores["sharpness"] > 0


def test_filters_name_the_reason() -> None:
    scores = {"background": 0.6, "dark": 0.1, "sharpness": 50.0}
    assert QualityOptions().rejects(scores) is None  # the defaults keep everything
    assert QualityOptions(max_background=0.5).rejects(scores) == "background"
    assert QualityOptions(max_dark=0.05).rejects(scores) == "dark"
    assert QualityOptions(min_sharpness=100).rejects(scores) == "sharpness"


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"max_background": 1.5}, "max_background"),
        ({"max_dark": -0.1}, "max_dark"),
        ({"min_sharpness": float("nan")}, "min_sharpness"),
    ],
)
def test_options_validation(kw: dict[str, float], name: str) -> None:
    with pytest.raises(OptionError, match=name):
        QualityOptions(**kw)
