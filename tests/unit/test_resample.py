"""Exact resolution from any scanner: two-stage resampling against a full-resolution Lanczos reference."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from PIL import Image

from wsishard.builder.grid import PatchOptions, blocks, candidates
from wsishard.builder.patches import read_block_image
from wsishard.builder.tissue import detect_tissue
from wsishard.slide import OpenSlideReader, TiffTileReader, open_slide, read_lowres
from wsishard.testing.synthetic import make_slide

SCANNER_MPP = (0.2520, 0.2527, 0.2631, 0.2265, 0.2280, 0.2425, 0.2495)  # AT2, GT450, NanoZoomer, 3DHistech, ...


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("resample") / "s.svs"
    make_slide(path, width=3072, height=3072, seed=7, tissue_fraction=0.35)
    return str(path)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _reference(ref: OpenSlideReader, o_x: int, o_y: int, size: int, scale: float) -> np.ndarray:
    """The patch at output px (o_x, o_y): a level-0 read resized once by Lanczos at full resolution."""
    pad = 16
    x0, y0 = math.floor(o_x * scale) - pad, math.floor(o_y * scale) - pad
    w = h = math.ceil(size * scale) + 2 * pad + 2
    region = Image.fromarray(ref.read_level(0, x0, y0, w, h))
    box = (o_x * scale - x0, o_y * scale - y0, o_x * scale - x0 + size * scale, o_y * scale - y0 + size * scale)
    return np.asarray(region.resize((size, size), Image.Resampling.LANCZOS, box=box))


@pytest.mark.parametrize("mpp0", SCANNER_MPP)
def test_patches_at_scanner_mpp_are_within_40_db_of_full_resolution_lanczos(slide: str, mpp0: float) -> None:
    opts = PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5)
    with open_slide(slide) as reader:
        thumb, l0_per_t = read_lowres(reader, 32.0)
        cands = candidates(reader.level_dimensions[0], mpp0, detect_tissue(thumb, l0_per_t * mpp0), l0_per_t, opts)
    scale = cands.l0_per_o
    assert abs(scale - round(scale)) > 1e-3  # a non-integer reduction: the case the fast path used to skip
    with open_slide(slide) as fast, OpenSlideReader(slide) as ref:
        assert isinstance(fast, TiffTileReader)
        worst, checked = math.inf, 0
        for blk in blocks(cands, 4)[::3][:8]:
            image = read_block_image(fast, blk, cands, 0)
            for i in blk.patches.tolist()[::2]:
                o_x, o_y = int(cands.col[i]) * cands.stride, int(cands.row[i]) * cands.stride
                ours = np.asarray(image.crop((o_x - blk.o_x, o_y - blk.o_y, o_x - blk.o_x + 128, o_y - blk.o_y + 128)))
                worst = min(worst, _psnr(ours, _reference(ref, o_x, o_y, 128, scale)))
                checked += 1
    assert checked >= 8
    assert worst >= 40.0, f"{mpp0}: worst patch {worst:.1f} dB"


def test_patches_on_a_block_border_equal_the_same_patch_read_alone(slide: str) -> None:
    """The read covers the filter's reach past the block: a patch's pixels do not depend on its neighbours."""
    opts = PatchOptions(target_mpp=0.5, patch_size_px=128, min_tissue=0.5)
    mpp0 = 0.2631
    with open_slide(slide) as reader:
        thumb, l0_per_t = read_lowres(reader, 32.0)
        cands = candidates(reader.level_dimensions[0], mpp0, detect_tissue(thumb, l0_per_t * mpp0), l0_per_t, opts)
        blk = max(blocks(cands, 4), key=lambda b: len(b.patches))
        image = read_block_image(reader, blk, cands, 0)
        for i in blk.patches.tolist()[:4]:
            one = dataclasses.replace(cands, col=cands.col[i : i + 1], row=cands.row[i : i + 1],
                                      tissue=cands.tissue[i : i + 1], total=1)  # fmt: skip
            single = np.asarray(read_block_image(reader, blocks(one, 4)[0], one, 0), dtype=np.int16)
            o_x, o_y = int(cands.col[i]) * cands.stride - blk.o_x, int(cands.row[i]) * cands.stride - blk.o_y
            in_block = np.asarray(image.crop((o_x, o_y, o_x + 128, o_y + 128)), dtype=np.int16)
            assert np.abs(in_block - single).max() <= 2  # JPEG DCT-scaled decode may differ by rounding only
