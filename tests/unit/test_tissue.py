"""Otsu tissue detection: agreement with generated slides' true masks, dust, blanks, edge cases, options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openslide
import pytest
from PIL import Image
from scipy import ndimage as ndi

from wsishard.builder.scan.tissue import TissueOptions, detect_tissue, stain_feature, tissue_fraction
from wsishard.errors import OptionError
from wsishard.testing.synthetic import SyntheticSlide, make_slide

GLASS = (240, 240, 242)
PINK = (225, 150, 190)


def _level(path: str, level: int) -> tuple[np.ndarray, float]:
    """(rgb, mpp) of a whole slide level."""
    with openslide.OpenSlide(path) as slide:
        rgb = slide.read_region((0, 0), level, slide.level_dimensions[level]).convert("RGB")
        mpp = float(slide.properties.get("openslide.mpp-x", 0.25)) * slide.level_downsamples[level]
    return np.asarray(rgb), mpp


def _at(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Nearest-neighbour resize of a bool mask to ``shape`` (h, w)."""
    return np.asarray(Image.fromarray(mask).resize((shape[1], shape[0]), Image.Resampling.NEAREST))


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max((a | b).sum(), 1))


def _canvas(h: int, w: int, seed: int = 0) -> np.ndarray:
    """(h, w, 3) uint8 noisy glass."""
    rng = np.random.default_rng(seed)
    return np.clip(np.array(GLASS) + rng.normal(0, 1.5, (h, w, 3)), 0, 255).astype(np.uint8)


def _disk(img: np.ndarray, cy: float, cx: float, r: float, color: tuple[int, int, int]) -> np.ndarray:
    yy, xx = np.mgrid[: img.shape[0], : img.shape[1]]
    inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    img[inside] = color
    return inside


# ------------------------------------------------------------------------------------------- generated slides


@pytest.mark.parametrize("index", [0, 1, 2, 3])
@pytest.mark.parametrize("level", [1, 2])
def test_iou_with_true_mask(synthetic_slides: list[SyntheticSlide], index: int, level: int) -> None:
    s = synthetic_slides[index]
    rgb, mpp = _level(s.path, level)  # level 1: 1 um/px, reduced to 8 um/px inside; level 2: 4 um/px
    mask = detect_tissue(rgb, mpp)
    assert mask.shape == rgb.shape[:2] and mask.dtype == bool
    iou = _iou(_at(mask, s.mask.shape), s.mask)
    assert iou >= 0.9, f"{Path(s.path).name} level {level}: IoU {iou:.3f}"


@pytest.mark.parametrize(("suffix", "seed", "mpp"), [(".svs", 11, 0.5), (".tif", 12, 0.25), (".svs", 13, 0.25)])
def test_iou_more_seeds(tmp_path: Path, suffix: str, seed: int, mpp: float) -> None:
    s = make_slide(tmp_path / f"s{suffix}", width=4096, height=4096, mpp=mpp, seed=seed)
    rgb, level_mpp = _level(s.path, 2)
    assert level_mpp == pytest.approx(16 * mpp)
    iou = _iou(_at(detect_tissue(rgb, level_mpp), s.mask.shape), s.mask)
    assert iou >= 0.9, f"seed {seed}: IoU {iou:.3f}"


def test_dust_on_tissue_slides_is_dropped(synthetic_slides: list[SyntheticSlide]) -> None:
    for s in synthetic_slides:
        rgb, mpp = _level(s.path, 2)
        specks = (rgb.max(axis=2) < 150) & ~ndi.binary_dilation(s.mask, iterations=6)  # dark, on the glass
        assert specks.any(), "the slide should have dust"
        mask = detect_tissue(rgb, mpp)
        assert not mask[specks].any()
        labels, n = ndi.label(mask)
        on_tissue = np.unique(labels[mask & s.mask])
        assert set(range(1, n + 1)) == set(on_tissue.tolist())  # every detected object is real tissue


def test_dust_only_slide_gives_empty_mask(tmp_path: Path) -> None:
    s = make_slide(tmp_path / "dust.svs", width=4096, height=3072, tissue=False, dust=True, seed=4)
    for level in (1, 2):
        rgb, mpp = _level(s.path, level)
        assert (rgb.max(axis=2) < 150).sum() > 10, "the slide should have dust"
        assert tissue_fraction(detect_tissue(rgb, mpp)) == 0.0


def test_blank_slide_gives_empty_mask(tmp_path: Path) -> None:
    s = make_slide(tmp_path / "blank.tif", width=2048, height=2048, tissue=False, dust=False)
    rgb, mpp = _level(s.path, 1)
    assert not detect_tissue(rgb, mpp).any()


# ------------------------------------------------------------------------------------------- drawn images


def test_thin_strand_survives_and_dust_goes() -> None:
    img = _canvas(200, 300)
    blob = _disk(img, 100, 60, 40, PINK)  # 8 um/px: a 640 um island
    img[98:102, 100:260] = PINK  # a 32 um wide, 1.3 mm long strand
    speck = _disk(img, 30, 250, 3, (60, 50, 45))  # 48 um dust
    mask = detect_tissue(img, 8.0)
    assert mask[blob].mean() > 0.98
    assert mask[99:101, 100:255].mean() > 0.95
    assert not mask[speck].any()
    assert not mask[:80, 120:].any()


def test_small_holes_filled_large_holes_kept() -> None:
    img = _canvas(200, 200)
    _disk(img, 100, 100, 80, PINK)
    small = _disk(img, 60, 100, 4, GLASS)  # ~3200 um^2 at 8 um/px
    large = _disk(img, 120, 110, 15, GLASS)  # ~45000 um^2
    mask = detect_tissue(img, 8.0)
    assert mask[small].all()
    assert mask[large].mean() < 0.2


def test_tissue_touching_the_border_is_kept() -> None:
    img = _canvas(100, 100)
    img[:, :40] = PINK
    mask = detect_tissue(img, 8.0)
    assert mask[:, :38].all()
    assert not mask[:, 45:].any()


@pytest.mark.parametrize("color", [(255, 255, 255), (240, 240, 242), PINK, (0, 0, 0), (100, 60, 150)])
def test_uniform_image_gives_empty_mask(color: tuple[int, int, int]) -> None:
    img = np.empty((64, 80, 3), dtype=np.uint8)
    img[...] = color
    assert not detect_tissue(img, 8.0).any()


@pytest.mark.parametrize("shape", [(0, 0, 3), (1, 1, 3), (2, 3, 3), (1, 50, 3), (5, 5, 4)])
def test_tiny_images(shape: tuple[int, int, int]) -> None:
    img = np.full(shape, 200, dtype=np.uint8)
    if shape[0] * shape[1]:
        img.reshape(-1, shape[2])[0, :3] = PINK
    mask = detect_tissue(img, 8.0)
    assert mask.shape == shape[:2] and mask.dtype == bool


def test_transparent_pixels_count_as_glass() -> None:
    rgba = np.zeros((120, 120, 4), dtype=np.uint8)  # OpenSlide: (0, 0, 0, 0) outside the scan
    rgba[:, :80, :3] = _canvas(120, 80)
    rgba[:, :80, 3] = 255
    _disk(rgba[..., :3], 60, 40, 25, PINK)
    mask = detect_tissue(rgba, 8.0)
    assert not mask[:, 85:].any()
    assert mask[55:65, 35:45].all()


def test_pale_glass_is_not_tissue_but_darkness_catches_grey_tissue() -> None:
    img = _canvas(150, 150)
    img[...] = np.clip(img.astype(int) - 25, 0, 255)  # a dim scan: glass ~215
    grey = _disk(img, 75, 75, 40, (150, 150, 150))  # unstained but dense: no saturation
    assert _iou(detect_tissue(img, 8.0), grey) > 0.9
    assert not detect_tissue(img, 8.0, TissueOptions(use_darkness=False)).any()


def test_fine_input_is_reduced_and_mask_comes_back_full_size() -> None:
    img = _canvas(400, 640)
    blob = _disk(img, 200, 300, 150, PINK)  # at 1 um/px
    mask = detect_tissue(img, 1.0, TissueOptions(thumb_mpp=8.0))
    assert mask.shape == (400, 640)
    assert _iou(mask, blob) > 0.95


def test_max_thumb_px_caps_the_working_size() -> None:
    img = _canvas(300, 300)
    blob = _disk(img, 150, 150, 100, PINK)
    mask = detect_tissue(img, 8.0, TissueOptions(max_thumb_px=50))
    assert mask.shape == (300, 300)
    assert _iou(mask, blob) > 0.9


def test_fixed_threshold_replaces_otsu() -> None:
    img = _canvas(100, 100)
    faint = _disk(img, 50, 50, 30, (235, 215, 225))  # saturation ~0.085
    assert _iou(detect_tissue(img, 8.0, TissueOptions(fixed_threshold=0.05)), faint) > 0.9
    assert not detect_tissue(img, 8.0, TissueOptions(fixed_threshold=0.2)).any()


def test_stain_feature_matches_hsv_saturation() -> None:
    from skimage.color import rgb2hsv

    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (50, 50, 3), dtype=np.uint8)
    sat = stain_feature(img, use_darkness=False).astype(np.float64) / 255
    assert np.abs(sat - rgb2hsv(img)[..., 1]).max() <= 0.5 / 255 + 1e-9


def test_tissue_fraction() -> None:
    assert tissue_fraction(np.array([[True, False], [False, False]])) == 0.25
    assert tissue_fraction(np.zeros((0, 3), dtype=bool)) == 0.0


# ------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("thumb_mpp", 0.0),
        ("thumb_mpp", float("nan")),
        ("max_thumb_px", 8),
        ("max_thumb_px", 100.0),
        ("use_darkness", 1),
        ("median_um", -1.0),
        ("close_um", float("inf")),
        ("min_object_um2", -5.0),
        ("min_hole_um2", float("nan")),
        ("min_threshold", 1.0),
        ("min_threshold", -0.1),
        ("fixed_threshold", 1.5),
    ],
)
def test_options_validation_names_field_and_value(field: str, value: object) -> None:
    with pytest.raises(OptionError, match=rf"{field}.*{value}") as info:
        TissueOptions(**{field: value})  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_options_are_keyword_only_and_frozen() -> None:
    with pytest.raises(TypeError):
        TissueOptions(8.0)  # type: ignore[call-arg]
    opts = TissueOptions()
    with pytest.raises(AttributeError):
        opts.thumb_mpp = 4.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("rgb", "mpp"),
    [
        (np.zeros((10, 10), dtype=np.uint8), 8.0),
        (np.zeros((10, 10, 2), dtype=np.uint8), 8.0),
        (np.zeros((10, 10, 3), dtype=np.float32), 8.0),
        (np.zeros((10, 10, 3), dtype=np.uint8), 0.0),
        (np.zeros((10, 10, 3), dtype=np.uint8), float("nan")),
    ],
)
def test_bad_input_raises(rgb: np.ndarray, mpp: float) -> None:
    with pytest.raises(ValueError):
        detect_tissue(rgb, mpp)


def test_a_view_claimed_far_finer_than_it_is_is_reduced_to_no_less_than_one_px() -> None:
    rgb = np.full((64, 48, 3), 235, np.uint8)  # (h, w, 3) glass
    rgb[16:48, 12:36] = (150, 60, 150)  # tissue
    mask = detect_tissue(rgb, 1e-9)  # a slide whose mpp metadata is wrong: a 8e9x reduction asked for
    assert mask.shape == (64, 48)


@pytest.mark.parametrize("thumb_mpp", [1e9, 1000.5, float("inf"), float("nan")])
def test_a_detection_view_coarser_than_a_mm_per_px_is_refused(thumb_mpp: float) -> None:
    with pytest.raises(OptionError, match=r"thumb_mpp: .* \(need 0 < UM <= 1000\)"):
        TissueOptions(thumb_mpp=thumb_mpp)
    assert TissueOptions(thumb_mpp=1000).thumb_mpp == 1000
