"""The synthetic slide generator: files OpenSlide reads as real slides, true masks that match the pixels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import openslide
import pytest
import tifffile
from PIL import Image

from wsishard.testing.synthetic import SyntheticSlide, make_slide, make_slides

ROOT = Path(__file__).resolve().parents[2]


def _pixels(slide: openslide.OpenSlide, level: int) -> np.ndarray:
    """The whole of ``level`` as (h, w, 3) uint8."""
    return np.asarray(slide.read_region((0, 0), level, slide.level_dimensions[level]).convert("RGB"))


def test_svs_opens_as_aperio(synthetic_slides: list[SyntheticSlide]) -> None:
    s = synthetic_slides[0]
    assert s.path.endswith("slide-000.svs")
    with openslide.OpenSlide(s.path) as slide:
        assert slide.properties["openslide.vendor"] == "aperio"
        assert slide.level_dimensions == ((4096, 3072), (1024, 768), (256, 192))
        assert slide.level_downsamples == pytest.approx((1.0, 4.0, 16.0))
        assert float(slide.properties["openslide.mpp-x"]) == pytest.approx(0.25)
        assert float(slide.properties["openslide.mpp-y"]) == pytest.approx(0.25)
        assert slide.properties["openslide.objective-power"] == "40"
        assert slide.properties["tiff.ImageDescription"].startswith(
            "Aperio Image Library v12.0.0 \r\n4096x3072 [0,0 4096x3072] (256x256) JPEG/RGB Q=90|AppMag = 40"
        )
        assert "thumbnail" in slide.associated_images
        assert max(slide.associated_images["thumbnail"].size) == 1024


def test_svs_tiles_are_rgb_jpeg_like_aperio(synthetic_slides: list[SyntheticSlide]) -> None:
    with tifffile.TiffFile(synthetic_slides[0].path) as tif:
        page = tif.pages.first
        assert page.is_tiled and (page.tilewidth, page.tilelength) == (256, 256)
        assert page.compression == tifffile.COMPRESSION.JPEG
        assert page.photometric == tifffile.PHOTOMETRIC.RGB
        thumb = tif.pages[1]
        assert isinstance(thumb, tifffile.TiffPage) and not thumb.is_tiled  # the thumbnail page
        assert len(tif.pages) == 4


def test_tiff_opens_as_generic_tiff(synthetic_slides: list[SyntheticSlide]) -> None:
    s = synthetic_slides[1]
    assert s.path.endswith("slide-001.tif")
    with openslide.OpenSlide(s.path) as slide:
        assert slide.properties["openslide.vendor"] == "generic-tiff"
        assert slide.level_dimensions == ((4096, 3072), (1024, 768), (256, 192))
        assert slide.level_downsamples == pytest.approx((1.0, 4.0, 16.0))
        assert float(slide.properties["openslide.mpp-x"]) == pytest.approx(0.25)
        assert float(slide.properties["openslide.mpp-y"]) == pytest.approx(0.25)


@pytest.mark.parametrize("kind", ["svs", "tiff"])
def test_mpp_and_magnification_follow_mpp(tmp_path: Path, kind: str) -> None:
    s = make_slide(tmp_path / f"half.{'svs' if kind == 'svs' else 'tif'}", width=2048, height=1024, mpp=0.5)
    with openslide.OpenSlide(s.path) as slide:
        assert float(slide.properties["openslide.mpp-x"]) == pytest.approx(0.5)
        assert slide.level_dimensions == ((2048, 1024), (512, 256))
        if kind == "svs":
            assert slide.properties["aperio.AppMag"] == "20"
    assert s.mpp == 0.5


@pytest.mark.parametrize("suffix", [".svs", ".tif"])
def test_include_mpp_false_leaves_mpp_out(tmp_path: Path, suffix: str) -> None:
    s = make_slide(tmp_path / f"nompp{suffix}", width=1024, height=1024, include_mpp=False)
    with openslide.OpenSlide(s.path) as slide:
        assert "openslide.mpp-x" not in slide.properties
        assert "openslide.mpp-y" not in slide.properties
        assert slide.properties["openslide.vendor"] == ("aperio" if suffix == ".svs" else "generic-tiff")
    assert s.mpp == 0.25  # the true value is still reported


@pytest.mark.parametrize("suffix", [".svs", ".tif"])
def test_same_seed_same_bytes(tmp_path: Path, suffix: str) -> None:
    a = make_slide(tmp_path / f"a{suffix}", width=1536, height=1024, seed=7)
    b = make_slide(tmp_path / f"b{suffix}", width=1536, height=1024, seed=7)
    c = make_slide(tmp_path / f"c{suffix}", width=1536, height=1024, seed=8)
    assert Path(a.path).read_bytes() == Path(b.path).read_bytes()
    assert np.array_equal(a.mask, b.mask)
    assert Path(a.path).read_bytes() != Path(c.path).read_bytes()
    assert not np.array_equal(a.mask, c.mask)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5])
def test_mask_fraction_near_target(tmp_path: Path, fraction: float) -> None:
    s = make_slide(tmp_path / "f.tif", width=1536, height=2048, tissue_fraction=fraction, seed=3)
    assert s.mask.dtype == bool
    assert s.mask.shape == (2048 // 16, 1536 // 16)
    assert s.mask_downsample == 16
    assert s.mask.mean() == pytest.approx(fraction, abs=0.03)


def test_mask_shape_rounds_up_for_odd_sizes(tmp_path: Path) -> None:
    s = make_slide(tmp_path / "odd.svs", width=1000, height=1030)
    assert s.mask.shape == (65, 63)
    with openslide.OpenSlide(s.path) as slide:
        assert slide.level_dimensions[0] == (1000, 1030)


@pytest.mark.parametrize("kw", [{"tissue": False}, {"tissue_fraction": 0.0}])
def test_blank_slide_has_empty_mask(tmp_path: Path, kw: dict[str, object]) -> None:
    s = make_slide(tmp_path / "blank.svs", width=1024, height=1024, **kw)  # type: ignore[arg-type]
    assert not s.mask.any()
    with openslide.OpenSlide(s.path) as slide:
        rgb = _pixels(slide, 1)
    assert np.median(rgb) > 230  # glass


@pytest.mark.parametrize("index", [0, 1])
def test_pixels_match_the_mask(synthetic_slides: list[SyntheticSlide], index: int) -> None:
    s = synthetic_slides[index]
    with openslide.OpenSlide(s.path) as slide:
        rgb = _pixels(slide, 2).astype(np.int32)  # (192, 256, 3): one px per mask px
    assert rgb.shape[:2] == s.mask.shape
    sat = (rgb.max(axis=2) - rgb.min(axis=2)) / np.maximum(rgb.max(axis=2), 1)
    assert np.median(sat[s.mask]) > 0.2  # pink/purple stain
    assert np.median(sat[~s.mask]) < 0.05  # glass
    assert np.median(rgb[~s.mask].min(axis=1)) > 225


def test_dust_is_on_the_glass_and_not_in_the_mask(tmp_path: Path) -> None:
    with_dust = make_slide(tmp_path / "d.tif", width=2048, height=2048, seed=5)
    without = make_slide(tmp_path / "n.tif", width=2048, height=2048, seed=5, dust=False)
    assert np.array_equal(with_dust.mask, without.mask)
    with openslide.OpenSlide(with_dust.path) as a, openslide.OpenSlide(without.path) as b:
        dark_a = _pixels(a, 1).max(axis=2) < 120
        dark_b = _pixels(b, 1).max(axis=2) < 120
    specks = dark_a & ~dark_b
    assert specks.sum() > 20
    ys, xs = np.nonzero(specks)
    assert not with_dust.mask[ys // 4, xs // 4].any()  # level 1 is 4x, the mask 16x


def test_level0_is_consistent_with_lower_levels(synthetic_slides: list[SyntheticSlide]) -> None:
    with openslide.OpenSlide(synthetic_slides[0].path) as slide:
        l0 = np.asarray(slide.read_region((0, 0), 0, (4096, 3072)).convert("RGB"), dtype=np.float32)
        l1 = _pixels(slide, 1).astype(np.float32)
    means = l0.reshape(768, 4, 1024, 4, 3).mean(axis=(1, 3))
    assert np.abs(means - l1).mean() < 4.0  # block means, up to JPEG error


def test_make_slides_names_kinds_and_seeds(synthetic_slides: list[SyntheticSlide], slide_dir: Path) -> None:
    names = sorted(p.name for p in slide_dir.iterdir())
    assert names == ["slide-000.svs", "slide-001.tif", "slide-002.svs", "slide-003.tif"]
    masks = [s.mask for s in synthetic_slides]
    assert all(not np.array_equal(masks[0], m) for m in masks[1:])


def test_a_slide_made_after_another_of_its_seed_is_the_one_made_alone(tmp_path: Path) -> None:
    """Slides of one seed and size share their tissue texture, kept for the next (scene.py): the bytes never tell."""
    make_slide(tmp_path / "first.svs", width=1024, height=768, seed=11, artefacts=("ink",))
    second = make_slide(tmp_path / "second.svs", width=1024, height=768, seed=11, artefacts=("dots",))
    alone = tmp_path / "alone.svs"
    code = (
        "from wsishard.testing.synthetic import make_slide\n"
        f"make_slide({str(alone)!r}, width=1024, height=768, seed=11, artefacts=('dots',))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    assert Path(second.path).read_bytes() == alone.read_bytes()


def test_make_slides_is_seeded(tmp_path: Path) -> None:
    a = make_slides(tmp_path / "a", 2, seed=1, width=512, height=512, kinds=("tiff",))
    b = make_slides(tmp_path / "b", 2, seed=1, width=512, height=512, kinds=("tiff",))
    assert [Path(s.path).name for s in a] == ["slide-000.tif", "slide-001.tif"]
    assert all(Path(x.path).read_bytes() == Path(y.path).read_bytes() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("name", "kw", "match"),
    [
        ("x.png", {}, "suffix"),
        ("x.svs", {"kind": "ndpi"}, "kind"),
        ("x.svs", {"tile_px": 100}, "tile_px"),
        ("x.svs", {"tissue_fraction": 1.0}, "tissue_fraction"),
        ("x.svs", {"mpp": 0.0}, "mpp"),
        ("x.svs", {"width": 0}, "width"),
        ("x.svs", {"quality": 0}, "quality"),
        ("x.svs", {"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_raise(tmp_path: Path, name: str, kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_slide(tmp_path / name, **{"width": 512, "height": 512, **kw})  # type: ignore[arg-type]
    assert not (tmp_path / name).exists()


def test_cli_writes_slides_and_masks(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "make_slides.py"), str(tmp_path), "--n", "2", "--size", "768x512"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "slide-000.mask.png",
        "slide-000.svs",
        "slide-001.mask.png",
        "slide-001.tif",
    ]
    assert len(out.strip().splitlines()) == 3  # one line per slide and a summary
    mask = np.asarray(Image.open(tmp_path / "slide-000.mask.png"))
    assert mask.shape == (32, 48) and set(np.unique(mask)) <= {0, 255}
