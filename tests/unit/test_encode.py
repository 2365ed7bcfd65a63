"""Block reading: skipped tiles never change a patch, and block-cut patches match per-patch reads."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsishard.builder.extract.patches import patch_images, read_block_image
from wsishard.builder.scan.grid import PatchOptions, blocks, candidates
from wsishard.builder.scan.tissue import detect_tissue
from wsishard.slide import OpenSlideReader, TiffTileReader, open_slide, read_lowres
from wsishard.testing.synthetic import make_slide


class _EveryTile:
    """A reader that ignores ``needed`` and decodes every tile of the region."""

    def __init__(self, reader: TiffTileReader) -> None:
        self._reader = reader
        self.level_downsamples = reader.level_downsamples

    def read_level(self, level: int, x: int, y: int, w: int, h: int, needed: object = None) -> np.ndarray:
        return self._reader.read_level(level, x, y, w, h)

    def read_level_reduced(
        self, level: int, x: int, y: int, w: int, h: int, factor: int, needed: object = None
    ) -> np.ndarray | None:
        return self._reader.read_level_reduced(level, x, y, w, h, factor)


class _FullDecode:
    """A reader without scaled decoding: full-size tiles, then the box reduction."""

    def __init__(self, reader: TiffTileReader) -> None:
        self._reader = reader
        self.level_downsamples = reader.level_downsamples

    def read_level(self, level: int, x: int, y: int, w: int, h: int, needed: object = None) -> np.ndarray:
        return self._reader.read_level(level, x, y, w, h, needed=needed)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("enc") / "s.svs"
    make_slide(path, width=4096, height=4096, seed=3, tissue_fraction=0.25)
    return str(path)


def _cands(path: str, mpp0: float, patch: PatchOptions):  # type: ignore[no-untyped-def]
    reader = open_slide(path)
    thumb, l0_per_t = read_lowres(reader, 32.0)
    mask = detect_tissue(thumb, l0_per_t * mpp0)
    reader.close()
    return candidates(reader.level_dimensions[0], mpp0, mask, l0_per_t, patch)


@pytest.mark.parametrize("mpp0", [0.25, 0.2522])  # integer 2x reduce, and bilinear at a non-integer scale
def test_skipped_tiles_never_reach_a_patch(slide: str, mpp0: float) -> None:
    opts = PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5)
    cands = _cands(slide, mpp0, opts)
    fast = open_slide(slide)
    assert isinstance(fast, TiffTileReader)
    checked = 0
    for blk in blocks(cands, 4):
        if len(blk.patches) == 16:
            continue  # full blocks need every tile; the partial ones are where tiles get skipped
        every = patch_images(_EveryTile(fast), blk, cands, 0)  # type: ignore[arg-type]
        for (a, a_x, a_y), (b, b_x, b_y) in zip(patch_images(fast, blk, cands, 0), every, strict=True):
            assert (a_x, a_y) == (b_x, b_y)
            assert np.array_equal(np.asarray(a), np.asarray(b))
            checked += 1
    assert checked >= 10
    fast.close()


def test_block_patches_match_per_patch_openslide_reads(slide: str) -> None:
    opts = PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5)
    cands = _cands(slide, 0.25, opts)
    fast, ref = open_slide(slide), OpenSlideReader(slide)
    blk = max(blocks(cands, 4), key=lambda b: len(b.patches))
    image = read_block_image(fast, blk, cands, 0)
    for i in blk.patches.tolist()[:6]:
        x, y, ext = int(cands.l0_x[i]), int(cands.l0_y[i]), cands.l0_extent
        naive = Image.fromarray(ref.read_level(0, x, y, ext, ext)).reduce(2)  # the per-patch loop, same filter
        ox, oy = int(cands.col[i]) * cands.stride - blk.o_x, int(cands.row[i]) * cands.stride - blk.o_y
        ours = image.crop((ox, oy, ox + 128, oy + 128))
        diff = np.abs(np.asarray(ours, dtype=np.int16) - np.asarray(naive, dtype=np.int16))
        assert diff.mean() < 1.0 and diff.max() <= 16
    fast.close()
    ref.close()


def test_patch_at_the_slide_edge_is_white_outside(tmp_path: Path) -> None:
    path = tmp_path / "e.svs"
    make_slide(path, width=1000, height=1000, seed=1)
    reader = open_slide(str(path))
    region = reader.read_level(0, 900, 900, 200, 200)
    assert region[150:, 150:].min() == 255
    reader.close()


def test_scaled_jpeg_decode_matches_full_decode_and_box_reduction(slide: str) -> None:
    opts = PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5)
    cands = _cands(slide, 0.25, opts)
    fast = open_slide(slide)
    diffs = []
    for blk in blocks(cands, 4)[:8]:
        scaled = np.asarray(read_block_image(fast, blk, cands, 0), dtype=np.int16)
        full = np.asarray(read_block_image(_FullDecode(fast), blk, cands, 0), dtype=np.int16)  # type: ignore[arg-type]
        assert scaled.shape == full.shape
        diffs.append(np.abs(scaled - full))
    diff = np.concatenate([d.ravel() for d in diffs])
    assert diff.max() <= 2 and diff.mean() < 0.5
    level0 = fast.read_level_reduced(0, 0, 0, 1000, 1000, 3)  # type: ignore[union-attr]
    assert level0 is None  # only 2, 4, 8: libjpeg's scales
    fast.close()


def _split_tables(jpeg: bytes) -> tuple[bytes, bytes]:
    """Split a full JPEG into (tables-only stream, abbreviated image stream), as Aperio SVS stores tiles."""
    pos, tables, image = 2, [b"\xff\xd8"], [b"\xff\xd8"]
    while pos < len(jpeg):
        marker = jpeg[pos + 1]
        if marker == 0xDA:  # start of scan: the rest is entropy-coded data up to EOI
            image.append(jpeg[pos:])
            break
        length = int.from_bytes(jpeg[pos + 2 : pos + 4], "big")
        segment = jpeg[pos : pos + 2 + length]
        (tables if marker in (0xDB, 0xC4) else image).append(segment)
        pos += 2 + length
    return b"".join(tables) + b"\xff\xd9", b"".join(image)


def test_scaled_decode_of_abbreviated_tiles_with_shared_tables() -> None:
    import dataclasses

    from wsishard.slide.tiff import _decode_scaled, _TiledLevel

    rng = np.random.default_rng(0)
    tile = rng.integers(0, 255, size=(256, 256, 3), dtype=np.uint8)
    buf = __import__("io").BytesIO()
    Image.fromarray(tile).save(buf, "JPEG", quality=90)
    full = buf.getvalue()
    tables, abbreviated = _split_tables(full)
    level = _TiledLevel(
        page_index=0,
        width=256,
        height=256,
        tile_w=256,
        tile_h=256,
        tiles_across=1,
        offsets=(0,),
        bytecounts=(len(full),),
        jpegtables=None,
        jpegheader=None,
        compression=7,
    )
    expected = _decode_scaled(full, level, 2)
    spliced = _decode_scaled(abbreviated, dataclasses.replace(level, jpegtables=tables), 2)
    assert spliced.shape == (128, 128, 3) and np.array_equal(spliced, expected)


@pytest.mark.parametrize("factor", [2, 4, 8])
def test_direct_scaled_decode_gives_the_pixels_of_pillows_open_and_draft(slide: str, factor: int) -> None:
    """The tile decoder drives Pillow's libjpeg decoder without Image.open: the same pixels as open + draft + load."""
    import io
    import os

    from wsishard.slide.tiff import _decode_scaled

    fast = open_slide(slide)
    assert isinstance(fast, TiffTileReader)
    level = fast._levels[0]
    compared = 0
    for index in range(0, len(level.offsets), 3):
        data = os.pread(fast._fd, level.bytecounts[index], level.offsets[index])
        with Image.open(io.BytesIO(data), formats=["JPEG"]) as image:
            image.draft("RGB", (level.tile_w // factor, level.tile_h // factor))
            expected = np.asarray(image.convert("RGB"))
        assert np.array_equal(_decode_scaled(data, level, factor), expected)
        compared += 1
    assert compared >= 10
    fast.close()


@pytest.mark.parametrize("cut", [0.05, 0.5, 0.95])
def test_a_truncated_tile_at_reduced_scale_is_a_slide_error_naming_the_tile(slide: str, cut: float) -> None:
    """A tile's data cut short (a file truncated under the reader, a wrong byte count) fails the read, naming the
    tile, instead of leaving the rest of the tile grey."""
    import dataclasses

    from wsishard.errors import SlideError

    fast = open_slide(slide)
    assert isinstance(fast, TiffTileReader)
    level = fast._levels[0]
    index = max(range(len(level.offsets)), key=lambda i: level.bytecounts[i])
    assert fast._tile(level, index, 2) is not None  # intact, it decodes
    counts = list(level.bytecounts)
    counts[index] = int(counts[index] * cut)
    short = dataclasses.replace(level, bytecounts=tuple(counts))
    with pytest.raises(SlideError, match=f"tile {index} of page {level.page_index} is corrupt"):
        fast._tile(short, index, 2)
    fast.close()


def test_neighbouring_blocks_decode_their_shared_edge_tiles_once(slide: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tile cache, the blocks' patches are the same and the tiles along shared block edges are decoded once."""
    from wsishard.slide import tiff

    cands = _cands(slide, 0.2265, PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5))
    decoded: list[int] = []
    decode = tiff.TiffTileReader._decode_tile
    monkeypatch.setattr(tiff.TiffTileReader, "_decode_tile", lambda self, *a: decoded.append(a[1]) or decode(self, *a))
    runs = []
    for max_bytes in (0, 16 << 20):
        monkeypatch.setattr(tiff, "TILES", tiff.TileCache(max_bytes))
        decoded.clear()
        with open_slide(slide) as fast:
            patches = [np.asarray(p) for b in blocks(cands, 4) for p, _, _ in patch_images(fast, b, cands, 0)]
        runs.append((patches, len(decoded), len(set(decoded)), tiff.TILES.hits))
    (plain, n_plain, distinct, _), (cached, n_cached, _, hits) = runs
    assert len(plain) == len(cached) == len(cands) and all(map(np.array_equal, plain, cached))
    assert n_cached == n_plain - hits and hits > 0.1 * n_plain  # 0.2265: ~17% of decodes repeat a neighbour's tile
    assert n_cached >= distinct


def test_planned_reads_decode_every_tile_once_and_leave_nothing_cached(
    slide: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks announced before they are read (as a build worker does for its slide): the same patches and tiles as
    unplanned reads, each tile decoded once, and every tile leaves the cache at its last planned use."""
    from wsishard.builder.extract.patches import SlideWork, plan_block
    from wsishard.slide import tiff

    cands = _cands(slide, 0.2425, PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5))
    block_list = blocks(cands, 4)
    decoded: list[int] = []
    decode = tiff.TiffTileReader._decode_tile
    monkeypatch.setattr(tiff.TiffTileReader, "_decode_tile", lambda self, *a: decoded.append(a[1]) or decode(self, *a))
    runs = []
    for plan in (False, True):
        monkeypatch.setattr(tiff, "TILES", tiff.TileCache(16 << 20))
        decoded.clear()
        with open_slide(slide) as fast:
            assert isinstance(fast, TiffTileReader)
            work = SlideWork(
                path=slide, slide_id="s", level=0, patch_mpp=0.5, cands=cands, blocks=block_list, label=None
            )
            for b in block_list if plan else ():
                plan_block(fast, work, b)
            if plan:  # a read nobody planned (as a context patch's) in between: it must not use up the counts
                fast.read_level_reduced(0, 0, 0, 4096, 4096, 2)  # every tile of the slide
                decoded.clear()
            patches = [np.asarray(p) for b in block_list for p, _, _ in patch_images(fast, b, cands, 0)]
            left = (
                [int(v.sum()) for v in fast._uses.values()],
                {k[2] for k in tiff.TILES._tiles if k[0] == fast._number},
            )
        runs.append((patches, list(decoded), left))
    (plain, d_plain, _), (planned, d_planned, (uses, cached)) = runs
    assert len(plain) == len(cands) and all(map(np.array_equal, plain, planned))
    assert len(d_planned) == len(set(d_planned)) and set(d_planned) <= set(d_plain)  # the same tiles, once each
    assert uses and not any(uses)  # every planned read came
    across = 4096 // 256  # no planned tile left behind: only the unplanned read's, on its region's edge
    assert all(i % across in (0, across - 1) or i // across in (0, across - 1) for i in cached)


@pytest.mark.parametrize("seed", range(4))
def test_the_tiles_a_read_needs_are_those_its_rectangles_touch(seed: int) -> None:
    """``_tiles_needed`` (ranges per rectangle) against an overlap test asked of every tile of the region."""
    from wsishard.slide.tiff import _TiledLevel, _tiles_needed

    def touches(rects: list[tuple[int, int, int, int]], x0: int, y0: int, x1: int, y1: int) -> bool:
        return any(rx0 < x1 and x0 < rx1 and ry0 < y1 and y0 < ry1 for rx0, ry0, rx1, ry1 in rects)

    rng = np.random.default_rng(seed)
    lv = _TiledLevel(0, 1000, 700, 64, 48, 16, (), (), None, None, 7)
    for _ in range(200):
        x, y = (int(v) for v in rng.integers(-100, 1000, 2))
        w, h = (int(v) for v in rng.integers(1, 600, 2))
        rects = [
            (int(a), int(b), int(a + c), int(b + d))
            for a, b, c, d in zip(
                *(rng.integers(lo, hi, 4) for lo, hi in ((-50, 1000), (-50, 700), (0, 300), (0, 300))), strict=True
            )
        ][: int(rng.integers(0, 5))]
        x_lo, y_lo, x_hi, y_hi = max(x, 0), max(y, 0), min(x + w, lv.width), min(y + h, lv.height)
        every = [
            (ty, tx)
            for ty in range(y_lo // 48, (y_hi - 1) // 48 + 1)
            for tx in range(x_lo // 64, (x_hi - 1) // 64 + 1)
            if x_lo < x_hi and y_lo < y_hi
        ]
        assert _tiles_needed(lv, x, y, w, h, None) == every
        assert _tiles_needed(lv, x, y, w, h, rects) == [
            (ty, tx) for ty, tx in every if touches(rects, tx * 64, ty * 48, tx * 64 + 64, ty * 48 + 48)
        ]


def test_the_tile_cache_keeps_to_its_bytes_and_forgets_a_closed_reader() -> None:
    from wsishard.slide.tiff import TileCache

    cache = TileCache(3 * 1000)
    a, b = cache.new_reader(), cache.new_reader()
    for i in range(5):
        cache.put((a, 0, i, 1), np.zeros(1000, dtype=np.uint8))
    assert cache.get((a, 0, 0, 1)) is None and cache.get((a, 0, 4, 1)) is not None  # least recently used went first
    cache.get((a, 0, 2, 1))
    cache.put((b, 0, 0, 1), np.zeros(1000, dtype=np.uint8))  # drops tile 3, not tile 2 (used since)
    assert cache.get((a, 0, 3, 1)) is None and cache.get((a, 0, 2, 1)) is not None
    cache.put((b, 0, 1, 1), np.zeros(4000, dtype=np.uint8))  # larger than the whole cache: not kept
    assert cache.get((b, 0, 1, 1)) is None
    cache.drop_reader(a)
    assert cache.get((a, 0, 2, 1)) is None and cache.get((b, 0, 0, 1)) is not None


@pytest.mark.parametrize("quality", [60, 90, 100])
def test_jpeg_patches_are_pillows_bytes(quality: int) -> None:
    """``encode_image`` encodes JPEG through OpenCV; the bytes are those Pillow's ``save`` wrote before, on real
    tissue (CMU-1), noise and flat patches, so shards do not change."""
    import io

    from cmu import cmu_rgb
    from PIL import Image

    from wsishard.builder.extract.resample import encode_image

    rng = np.random.default_rng(quality)
    tissue = cmu_rgb()
    patches = [tissue[y : y + 256, x : x + 256] for y, x in rng.integers(0, (2700, 1960), (12, 2)).tolist()]
    patches += [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), np.full((224, 224, 3), 240, np.uint8)]
    patches += [rng.integers(0, 256, (37, 50, 3), dtype=np.uint8)]  # not a multiple of the 16 px MCU
    for patch in patches:
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(patch)).save(buf, "JPEG", quality=quality)
        assert encode_image(patch, "jpg", quality) == buf.getvalue()
        assert encode_image(Image.fromarray(np.ascontiguousarray(patch)), "jpg", quality) == buf.getvalue()


def test_a_tile_decoded_into_its_place_fills_it_or_refuses(slide: str) -> None:
    """A tile's part is packed straight into the region (no tile-sized copy): the pixels are those of the tile
    decoded alone, and a place of another shape is refused (OpenCV would otherwise write a new array and leave the
    place white)."""
    from wsishard.slide.tiff import _jpeg_scaled

    with open_slide(slide) as reader:
        assert isinstance(reader, TiffTileReader)
        level = reader._levels[0]
        index = len(level.offsets) // 2
        data = os.pread(reader._fd, level.bytecounts[index], level.offsets[index])
    w, h = level.tile_w // 2, level.tile_h // 2
    whole = _jpeg_scaled(data, w, h, 2, level.rgb_jpeg)
    region = np.full((h + 10, w + 10, 3), 255, np.uint8)
    place = region[3 : 3 + h - 5, 7 : 7 + w - 9]
    assert _jpeg_scaled(data, w, h, 2, level.rgb_jpeg, (place, (5, h, 9, w))) is place
    assert np.array_equal(region[3 : 3 + h - 5, 7 : 7 + w - 9], whole[5:, 9:])
    assert (region[:3] == 255).all() and (region[:, :7] == 255).all()
    with pytest.raises(ValueError, match="does not fit"):
        _jpeg_scaled(data, w, h, 2, level.rgb_jpeg, (region[:4, :4], (0, h, 0, w)))
