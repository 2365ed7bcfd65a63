"""Pure grid and level arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from wsishard.builder.scan.grid import (
    PatchOptions,
    blocks,
    candidates,
    choose_level,
    grid_shape,
    output_scale,
    tissue_fractions,
)
from wsishard.errors import OptionError, SlideError

DOWNSAMPLES = (1.0, 4.0, 16.0, 64.0)


@pytest.mark.parametrize(
    ("mpp0", "target", "level"),
    [
        (0.25, 0.5, 0),  # 40x to 20x: read level 0, reduce 2x
        (0.25, 1.0, 1),  # exactly level 1
        (0.25, 2.0, 1),  # between levels: the finer one
        (0.25, 4.0, 2),
        (0.26, 1.0, 0),  # almost 4x but not quite: level 1 would be 1.04 mpp, coarser than the target
        (0.2522, 1.0, 1),  # a real 40x scanner: level 1 is 1.0088 mpp, within the 1% tolerance of the target
        (0.5, 0.5, 0),
        (0.503, 0.5, 0),  # a hair coarser than the target at level 0: no upsample error within tolerance
    ],
)
def test_choose_level(mpp0: float, target: float, level: int) -> None:
    assert choose_level("s", mpp0, DOWNSAMPLES, PatchOptions(target_mpp=target)) == level


def test_target_finer_than_level0_needs_allow_upsample() -> None:
    with pytest.raises(SlideError, match="allow-upsample"):
        choose_level("s", 0.5, DOWNSAMPLES, PatchOptions(target_mpp=0.25))
    assert choose_level("s", 0.5, DOWNSAMPLES, PatchOptions(target_mpp=0.25, allow_upsample=True)) == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"target_mpp": 0}, {"patch_size_px": 4}, {"min_tissue": 1.5}, {"stride_px": 0}, {"max_patches_per_slide": 0}],
)
def test_bad_patch_options(kwargs: dict) -> None:
    with pytest.raises(OptionError, match=next(iter(kwargs))):
        PatchOptions(**kwargs)


def test_grid_shape_counts_whole_patches_only() -> None:
    # 10000 l0 px at 0.25 mpp -> 5000 px at 0.5 mpp -> 19 whole 256 px patches (19*256 = 4864)
    assert grid_shape((10000, 2000), 2.0, 256, 256) == (19, 3)
    assert grid_shape((300, 300), 2.0, 256, 256) == (0, 0)  # smaller than one patch
    assert grid_shape((1024, 1024), 2.0, 256, 128) == (3, 3)  # overlapping stride


def test_tissue_fractions_integral_image() -> None:
    mask = np.zeros((10, 10), dtype=bool)
    mask[:5, :] = True  # top half tissue
    frac = tissue_fractions(mask, np.array([0.0, 0.0, 0.0]), np.array([0.0, 3.0, 5.0]), 4.0)
    np.testing.assert_allclose(frac, [1.0, 0.5, 0.0])


def test_candidates_keep_min_tissue_and_coordinates() -> None:
    mask = np.zeros((64, 64), dtype=bool)  # 16 l0 px per mask px over a 1024x1024 slide
    mask[:, :32] = True  # left half is tissue
    opts = PatchOptions(target_mpp=0.5, patch_size_px=64, min_tissue=0.5)
    cands = candidates((1024, 1024), 0.25, mask, 16.0, opts)
    # output grid: 512 px / 64 = 8 x 8 cells; the left 4 columns are tissue
    assert len(cands) == 32
    assert set(cands.col.tolist()) == {0, 1, 2, 3}
    assert cands.l0_extent == 128
    assert cands.l0_x.max() == 3 * 128 and cands.l0_y.max() == 7 * 128
    assert np.all(cands.tissue == 1.0)


def test_max_patches_per_slide_is_a_seeded_subset() -> None:
    mask = np.ones((64, 64), dtype=bool)
    opts = PatchOptions(target_mpp=0.5, patch_size_px=64, max_patches_per_slide=10)
    a = candidates((1024, 1024), 0.25, mask, 16.0, opts, seed=1)
    b = candidates((1024, 1024), 0.25, mask, 16.0, opts, seed=1)
    c = candidates((1024, 1024), 0.25, mask, 16.0, opts, seed=2)
    assert len(a) == 10
    assert np.array_equal(a.col, b.col) and np.array_equal(a.row, b.row)
    assert not (np.array_equal(a.col, c.col) and np.array_equal(a.row, c.row))


def test_cells_left_out_for_too_little_tissue_or_the_cap_are_counted() -> None:
    mask = np.zeros((64, 64), dtype=bool)  # 8 x 8 output cells of 8 x 8 mask px
    mask[:, :32] = True  # 4 columns of full tissue
    mask[:, 32:34] = True  # a fifth column with a quarter tissue: below min_tissue
    opts = PatchOptions(target_mpp=0.5, patch_size_px=64, min_tissue=0.5, max_patches_per_slide=20)
    cands = candidates((1024, 1024), 0.25, mask, 16.0, opts)
    assert (cands.total, len(cands), cands.dropped_low, cands.dropped_cap) == (40, 20, 8, 12)
    assert cands.total == len(cands) + cands.dropped_low + cands.dropped_cap  # every cell with tissue counted


def test_blocks_partition_patches_and_bound_their_cells() -> None:
    rng = np.random.default_rng(0)
    mask = rng.random((64, 64)) > 0.3
    opts = PatchOptions(target_mpp=0.5, patch_size_px=32, min_tissue=0.6, block_patches=4)
    cands = candidates((2048, 2048), 0.25, mask, 32.0, opts)
    blks = blocks(cands, 4)
    members = np.concatenate([b.patches for b in blks])
    assert sorted(members.tolist()) == list(range(len(cands)))  # every patch in exactly one block
    for b in blks:
        assert len(b.patches) <= 16
        cols, rows = cands.col[b.patches], cands.row[b.patches]
        assert cols.max() // 4 == cols.min() // 4 and rows.max() // 4 == rows.min() // 4
        assert b.o_x == cols.min() * 32 and b.o_w == (cols.max() - cols.min() + 1) * 32


def test_blocks_come_in_strips_of_two_block_rows_column_by_column() -> None:
    """Neighbouring blocks follow each other closely, so the tiles along their shared edges are reused."""
    opts = PatchOptions(target_mpp=0.5, patch_size_px=32, min_tissue=0.5, block_patches=4)
    cands = candidates((2048, 1536), 0.25, np.ones((48, 64), dtype=bool), 32.0, opts)  # 8 x 6 blocks, all full
    corners = [(b.o_y // 128, b.o_x // 128) for b in blocks(cands, 4)]  # (block row, block col)
    assert corners[:6] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert corners[16:18] == [(2, 0), (3, 0)] and corners[-2:] == [(4, 7), (5, 7)]
    assert sorted(corners) == [(r, c) for r in range(6) for c in range(8)]


@pytest.mark.parametrize("mpp0", [0.2520, 0.2527, 0.2631, 0.2265, 0.2280, 0.2425, 0.25])
def test_output_scale_is_exact_by_default(mpp0: float) -> None:
    opts = PatchOptions(target_mpp=0.5)
    assert output_scale(mpp0, 1.0, opts) == 0.5 / mpp0
    assert output_scale(mpp0, 4.0, opts) == 0.5 / mpp0  # whatever level is read


@pytest.mark.parametrize(
    ("mpp0", "downsample", "tolerance", "expected"),
    [
        (0.2520, 1.0, 0.05, 2.0),  # 0.504 mpp: 0.8% off, snapped to the 2x reduction of level 0
        (0.2631, 1.0, 0.06, 2.0),  # 0.5262 mpp: 5.2% off, inside 6%
        (0.2631, 1.0, 0.05, 0.5 / 0.2631),  # ... and outside hs2p's 5%: exact
        (0.2265, 1.0, 0.05, 0.5 / 0.2265),  # 2x would be 9.4% off: exact resampling
        (0.2520, 1.0, 0.005, 0.5 / 0.2520),  # 0.8% off, tolerance 0.5%: exact
        (0.2631, 4.0, 0.06, 4.0),  # target 1.0 from a 4x level at 1.0524 mpp: that level as it is
    ],
)
def test_output_scale_snaps_within_the_tolerance(
    mpp0: float, downsample: float, tolerance: float, expected: float
) -> None:
    target = 1.0 if downsample == 4.0 else 0.5
    opts = PatchOptions(target_mpp=target, mpp_tolerance=tolerance)
    assert output_scale(mpp0, downsample, opts) == pytest.approx(expected, rel=1e-12)


def test_a_level_within_the_tolerance_is_chosen_and_candidates_use_the_snapped_scale() -> None:
    opts = PatchOptions(target_mpp=1.0, patch_size_px=256, mpp_tolerance=0.06)
    downsamples = (1.0, 4.0, 16.0)
    assert choose_level("s", 0.2631, downsamples, opts) == 1  # 1.0524 mpp: 5.2% coarser, inside 6%
    assert choose_level("s", 0.2631, downsamples, PatchOptions(target_mpp=1.0)) == 0  # exact: level 0
    mask = np.ones((32, 32), dtype=bool)
    cands = candidates((20_000, 20_000), 0.2631, mask, 20_000 / 32, opts, level_downsample=4.0)
    assert cands.l0_per_o == 4.0 and cands.l0_extent == 1024


@pytest.mark.parametrize("target", [0.05, 1e-30])
def test_an_upsample_over_max_upsample_is_refused_even_when_allowed(target: float) -> None:
    allowed = PatchOptions(target_mpp=target, allow_upsample=True)
    with pytest.raises(SlideError, match=r"upsample level 0 \(0\.25 mpp\) .*x, more than --max-upsample 4 allows"):
        choose_level("s", 0.25, DOWNSAMPLES, allowed)
    with pytest.raises(SlideError, match="more than --max-upsample 4"):  # not "use --allow-upsample"
        choose_level("s", 0.25, DOWNSAMPLES, PatchOptions(target_mpp=target))
    if target == 0.05:
        assert (
            choose_level("s", 0.25, DOWNSAMPLES, PatchOptions(target_mpp=target, allow_upsample=True, max_upsample=5))
            == 0
        )
