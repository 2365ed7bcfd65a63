"""Block reading: skipped tiles never change a patch, and block-cut patches match per-patch reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsishard.encode import read_block_image
from wsishard.grid import PatchOptions, blocks, candidates
from wsishard.slide import OpenSlideReader, TiffTileReader, open_slide, read_lowres
from wsishard.synthetic import make_slide
from wsishard.tissue import detect_tissue


class _EveryTile:
    """A reader that ignores ``needed`` and decodes every tile of the region."""

    def __init__(self, reader: TiffTileReader) -> None:
        self._reader = reader
        self.level_downsamples = reader.level_downsamples

    def read_level(self, level: int, x: int, y: int, w: int, h: int, needed: object = None) -> np.ndarray:
        return self._reader.read_level(level, x, y, w, h)


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


@pytest.mark.parametrize("mpp0", [0.25, 0.2522])  # integer 2x reduce, and Lanczos at a non-integer scale
def test_skipped_tiles_never_reach_a_patch(slide: str, mpp0: float) -> None:
    opts = PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5)
    cands = _cands(slide, mpp0, opts)
    fast = open_slide(slide)
    assert isinstance(fast, TiffTileReader)
    checked = 0
    for blk in blocks(cands, 4):
        if len(blk.patches) == 16:
            continue  # full blocks need every tile; the partial ones are where tiles get skipped
        a = read_block_image(fast, blk, cands, 0)
        b = read_block_image(_EveryTile(fast), blk, cands, 0)  # type: ignore[arg-type]
        for i in blk.patches.tolist():
            ox = int(cands.col[i]) * cands.stride - blk.o_x
            oy = int(cands.row[i]) * cands.stride - blk.o_y
            box = (ox, oy, ox + 128, oy + 128)
            assert np.array_equal(np.asarray(a.crop(box)), np.asarray(b.crop(box)))
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
