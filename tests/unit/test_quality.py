"""Per-patch quality scores (background, dark, sharpness) and the build-time filters on them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageFilter

from wsishard.builder.extract.quality import QualityOptions, quality_scores
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


def _scores_as_before(patch: Image.Image) -> dict[str, float]:
    """The scores as 0.2 computed them (Pillow's nearest resize, then numpy): the definition the C pass keeps."""
    from wsishard.builder.extract.quality import DARK_MAX_VALUE, GLASS_MAX_SATURATION, GLASS_MIN_VALUE, SCORE_PX

    w, h = patch.size
    small = (
        patch.resize((min(w, SCORE_PX), min(h, SCORE_PX)), Image.Resampling.NEAREST) if max(w, h) > SCORE_PX else patch
    )
    rgb = np.asarray(small)
    hi = np.maximum(np.maximum(rgb[..., 0], rgb[..., 1]), rgb[..., 2]).astype(np.int16)
    lo = np.minimum(np.minimum(rgb[..., 0], rgb[..., 1]), rgb[..., 2]).astype(np.int16)
    glass = ((hi - lo) * 100 < GLASS_MAX_SATURATION * 100 * hi) & (hi > GLASS_MIN_VALUE * 255)
    lap = (hi[1:-1, :-2] + hi[1:-1, 2:] + hi[:-2, 1:-1] + hi[2:, 1:-1] - 4 * hi[1:-1, 1:-1]).ravel().astype(np.int64)
    mean = lap.sum() / max(lap.size, 1)
    return {
        "background": round(np.count_nonzero(glass) / glass.size, 4),
        "dark": round(np.count_nonzero(hi < DARK_MAX_VALUE * 255) / hi.size, 4),
        "sharpness": round(float(np.dot(lap, lap) / lap.size - mean * mean) if lap.size else 0.0, 4),
    }


def _patches() -> list[np.ndarray]:
    from cmu import cmu_rgb

    rng = np.random.default_rng(0)
    tissue = cmu_rgb()
    out = [tissue[y : y + 256, x : x + 256] for y, x in rng.integers(0, (2700, 1960), (40, 2)).tolist()]  # views
    for h, w in [(224, 224), (300, 300), (512, 512), (255, 257), (65, 64), (64, 64), (10, 20), (2, 5), (1, 1)]:
        out.append(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        out.append((rng.integers(0, 3, (h, w, 3)) * 100 + (rng.random((h, w, 1)) < 0.5) * 55).astype(np.uint8))
    out += [np.full((256, 256, 3), v, np.uint8) for v in ([204, 204, 204], [205, 190, 205], [63, 10, 10], [64, 0, 0])]
    return out


def test_scores_are_the_definitions_pixel_for_pixel() -> None:
    """Real tissue (CMU-1, as views of a larger image), noise, few-valued images at thresholds' edges, and sizes
    above, at and below the sampled 64 px: the scores an array gets, and an image gets, are 0.2's."""
    for patch in _patches():
        want = _scores_as_before(Image.fromarray(np.ascontiguousarray(patch)))
        assert quality_scores(patch) == want, patch.shape
        assert quality_scores(Image.fromarray(np.ascontiguousarray(patch))) == want
