"""Slide readers: the tile fast path against OpenSlide, mpp resolution, the bounded low-res view."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from wsishard.errors import MissingMppError, SlideError
from wsishard.slide import OpenSlideReader, TiffTileReader, open_slide, read_lowres, resolve_mpp
from wsishard.slide.tiff import _jpeg_scaled
from wsishard.testing.synthetic import SyntheticSlide, make_slide


@pytest.mark.parametrize("index", [0, 1])  # svs, generic tiff
def test_fast_path_matches_openslide_pixels(synthetic_slides: list[SyntheticSlide], index: int) -> None:
    path = synthetic_slides[index].path
    fast, ref = open_slide(path), OpenSlideReader(path)
    assert isinstance(fast, TiffTileReader)
    assert fast.level_dimensions == ref.level_dimensions and fast.level_downsamples == ref.level_downsamples
    regions = [(0, 1000, 900, 700, 500), (0, 3900, 2900, 400, 300), (1, 130, 70, 300, 200), (2, 0, 0, 256, 192)]
    for level, x, y, w, h in regions:  # the second one runs past the slide's edge: white there
        a = fast.read_level(level, x, y, w, h).astype(np.int16)
        b = ref.read_level(level, x, y, w, h).astype(np.int16)
        assert a.shape == b.shape == (h, w, 3)
        diff = np.abs(a - b)
        assert diff.mean() < 1.0 and diff.max() <= 16, (level, diff.mean(), diff.max())
    fast.close()
    ref.close()


def test_openslide_backend_reads_white_outside_the_slide(synthetic_slides: list[SyntheticSlide]) -> None:
    reader = open_slide(synthetic_slides[0].path, fast=False)
    assert reader.backend == "openslide"
    w, h = reader.level_dimensions[0]
    corner = reader.read_level(0, w - 50, h - 50, 100, 100)
    assert corner[-1, -1].tolist() == [255, 255, 255] and corner.shape == (100, 100, 3)
    reader.close()


def test_unreadable_files_raise_slide_error(tmp_path: Path) -> None:
    (tmp_path / "junk.svs").write_bytes(b"\x00" * 1000)
    with pytest.raises(SlideError, match="cannot open"):
        open_slide(str(tmp_path / "junk.svs"))
    with pytest.raises(SlideError, match="no such file"):
        open_slide(str(tmp_path / "missing.svs"))


def test_resolve_mpp_sources() -> None:
    props = {"openslide.mpp-x": "0.2520", "openslide.mpp-y": "0.2524"}
    assert resolve_mpp("s", props, None, None) == (pytest.approx(0.2522), "openslide")
    assert resolve_mpp("s", props, 0.5, None) == (0.5, "csv")
    assert resolve_mpp("s", {}, None, 0.25) == (0.25, "default")
    assert resolve_mpp("s", {"openslide.mpp-x": "0"}, None, 0.3) == (0.3, "default")
    with pytest.raises(MissingMppError, match="--default-mpp"):
        resolve_mpp("s", {"openslide.mpp-x": "nan"}, None, None)


def test_lowres_view_of_a_single_level_slide_is_read_in_chunks(tmp_path: Path) -> None:
    """A one-level slide is reduced chunk by chunk: never more than a chunk of level 0 in memory."""
    import tifffile

    rng = np.random.default_rng(0)
    img = np.full((3000, 5000, 3), 240, np.uint8)
    img[1000:2000, 1000:3000] = rng.integers(100, 200, size=(1000, 2000, 3), dtype=np.uint8)
    tifffile.imwrite(tmp_path / "flat.tif", img, tile=(256, 256), compression="jpeg", photometric="rgb")
    reader = open_slide(str(tmp_path / "flat.tif"))
    assert len(reader.level_dimensions) == 1
    calls: list[tuple[int, int]] = []
    original = reader.read_level

    def spy(level: int, x: int, y: int, w: int, h: int) -> np.ndarray:
        calls.append((w, h))
        return original(level, x, y, w, h)

    reader.read_level = spy  # type: ignore[method-assign]
    thumb, l0_per_px = read_lowres(reader, 32.0, chunk_px=1024)
    assert thumb.shape == (94, 156, 3) and l0_per_px == pytest.approx(5000 / 156)
    assert max(w * h for w, h in calls) <= 1024 * 1024 and len(calls) == 15
    assert thumb[45, 60].mean() < 200 and thumb[5, 5].mean() > 230
    reader.close()


def test_truncated_tile_data_is_a_slide_error(tmp_path: Path) -> None:
    make_slide(tmp_path / "t.svs", width=2048, height=2048, seed=1)
    size = (tmp_path / "t.svs").stat().st_size
    reader = open_slide(str(tmp_path / "t.svs"))
    assert isinstance(reader, TiffTileReader)
    with open(tmp_path / "t.svs", "r+b") as fh:  # cut the file under the open reader
        fh.truncate(size // 3)
    with pytest.raises(SlideError):
        reader.read_level(0, 0, 0, 2048, 2048)
    reader.close()


def _damage_tiles(path: Path, page: int, tiles: list[int], tail: str) -> None:
    """Overwrite the second half of each of ``tiles`` of ``page`` in place (the file keeps its size and tags): with
    zeros, or random bytes, as a disk or a copy that stopped early leaves a tile."""
    with tifffile.TiffFile(path) as tif:
        offsets, counts = tif.pages[page].dataoffsets, tif.pages[page].databytecounts
    rng = np.random.default_rng(0)
    with open(path, "r+b") as fh:
        for t in tiles:
            half = counts[t] // 2
            fh.seek(offsets[t] + half)
            noise = rng.integers(0, 256, counts[t] - half, dtype=np.uint8).tobytes()
            fh.write(bytes(counts[t] - half) if tail == "zeros" else noise)


@pytest.mark.parametrize("kind", ["svs", "tiff"])
@pytest.mark.parametrize("tail", ["zeros", "random"])
def test_a_tile_whose_data_ends_early_is_a_slide_error_not_grey_pixels(tmp_path: Path, kind: str, tail: str) -> None:
    path = tmp_path / f"t.{kind}"
    make_slide(path, width=1024, height=1024, seed=1)
    _damage_tiles(path, 0, [5], tail)  # tile 5 of level 0: x 256..512, y 256..512 (4 tiles across)
    with open_slide(str(path)) as reader:
        assert isinstance(reader, TiffTileReader)
        assert reader.read_level(0, 0, 0, 256, 256).shape == (256, 256, 3)  # tile 0: intact
        with pytest.raises(SlideError, match="tile 5 of page 0"):
            reader.read_level(0, 256, 256, 256, 256)  # full-size decode (imagecodecs)
        with pytest.raises(SlideError, match="tile 5 of page 0"):
            reader.read_level_reduced(0, 256, 256, 256, 256, 2)  # scaled decode (libjpeg's DCT scaling)


@pytest.mark.parametrize("index", [0, 1])  # svs, generic tiff
def test_lowres_view_decoded_at_a_dct_scale_matches_the_full_decode(
    synthetic_slides: list[SyntheticSlide], index: int
) -> None:
    """``dct_scaled``: level 0 (4096x3072) viewed at 2.5 level-0 px per px decodes its tiles at 1/2 (never at full
    size), and the view is the full decode's within a couple of levels on average (the QC picture's view)."""
    reader = open_slide(synthetic_slides[index].path)
    full, l0_full = read_lowres(reader, 2.5)
    scales: list[int] = []
    reduced = reader.read_level_reduced  # type: ignore[attr-defined]

    def spy(level: int, x: int, y: int, w: int, h: int, factor: int, **kw: object) -> np.ndarray | None:
        scales.append(factor)
        return reduced(level, x, y, w, h, factor, **kw)

    def full_read(*args: object, **kw: object) -> np.ndarray:
        raise AssertionError("a chunk was decoded at full size")

    reader.read_level_reduced, reader.read_level = spy, full_read  # type: ignore[attr-defined,method-assign]
    view, l0_view = read_lowres(reader, 2.5, dct_scaled=True)
    reader.close()
    assert set(scales) == {2} and len(scales) == 48  # 8 x 6 chunks of 512 level px
    assert view.shape == full.shape == (1229, 1638, 3) and l0_view == l0_full
    diff = np.abs(view.astype(np.int16) - full)
    assert diff.mean() < 3.0, diff.mean()


# ---- issue 42: libjpeg's corrupt-data warnings are errors on the direct-tile path ------------------------------


@pytest.mark.parametrize("rgb", [False, True])
@pytest.mark.parametrize("factor", [1, 2, 4])
def test_a_jpeg_damaged_in_its_middle_is_refused_not_decoded_into_garbage(rgb: bool, factor: int) -> None:
    """``rgb``: a YCbCr stream read as RGB (Pillow decodes it, a strict decode checks it); else libjpeg-turbo strict."""
    noise = np.random.default_rng(7)
    pixels = noise.integers(0, 256, (256, 256, 3), dtype=np.uint8)  # (h, w, 3): busy, so the scan is long
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    data = bytearray(out.getvalue())
    good = _jpeg_scaled(bytes(data), 256 // factor, 256 // factor, factor, rgb)
    assert good.shape == (256 // factor, 256 // factor, 3)
    middle = len(data) // 2
    data[middle - 48 : middle + 48] = noise.integers(0, 255, 96, dtype=np.uint8).tobytes()  # no FF: no marker
    assert data.endswith(b"\xff\xd9")
    with pytest.raises(ValueError, match="Corrupt JPEG data"):
        _jpeg_scaled(bytes(data), 256 // factor, 256 // factor, factor, rgb)
