"""Batched stain operations (augment/stain.py) against per-sample references on real tissue: torchstain's
Macenko (the fit replaced by each sample's given matrix), scikit-image's CIELAB and HED conversions, torchvision's
ColorJitter formulas written out in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cmu import cmu_rgb
from skimage import color
from stainref import jitter_reference, torchstain_normalize

from wsishard.augment.stain import (
    REINHARD_REFERENCE,
    StainTarget,
    colour_jitter,
    hed_jitter,
    macenko,
    reinhard,
)
from wsishard.builder.scan.stain import macenko as fit_macenko
from wsishard.builder.scan.stain import optical_density


@pytest.fixture(scope="module")
def tiles() -> np.ndarray:
    """(6, 128, 128, 3) uint8 tiles of real H&E tissue (CMU-1), some mostly tissue, some with glass."""
    img = cmu_rgb()
    spots = [(1792, 1152), (1024, 1280), (768, 1152), (2176, 1152), (256, 1280), (384, 896)]  # (y, x)
    return np.stack([img[y : y + 128, x : x + 128] for y, x in spots])


def _float(tiles: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(tiles).permute(0, 3, 1, 2).float() / 255  # (b, 3, h, w) in [0, 1]


def _hwc(x: torch.Tensor) -> np.ndarray:
    return x.permute(0, 2, 3, 1).double().numpy()  # (b, h, w, 3)


def test_macenko_is_torchstains_normalization_per_sample(tiles: np.ndarray) -> None:
    # each tile with its own fitted stain (as each sample has its slide's), some swapped to another tile's
    fits = [fit_macenko(optical_density(t.reshape(-1, 3)))[:2] for t in tiles]
    fits = [*fits[:3], fits[0], *fits[4:]]
    matrix = torch.tensor(np.stack([f[0] for f in fits]), dtype=torch.float32)
    max_conc = torch.tensor(np.stack([f[1] for f in fits]), dtype=torch.float32)
    target = StainTarget()
    out = _hwc(macenko(_float(tiles), matrix, max_conc, target)) * 255
    for i, tile in enumerate(tiles):
        ref = torchstain_normalize(tile, fits[i][0], fits[i][1], target)
        np.testing.assert_allclose(out[i], ref, atol=0.05)  # float32 against float64, in 0..255 units


def test_macenko_with_the_tiles_own_fit_is_torchstain(tiles: np.ndarray) -> None:
    torchstain = pytest.importorskip("torchstain.numpy.normalizers.macenko")
    tile = tiles[1]
    matrix, max_conc, _ = fit_macenko(optical_density(tile.reshape(-1, 3)))
    ref, _, _ = torchstain.NumpyMacenkoNormalizer().normalize(tile, stains=False)  # fits the tile itself, uint8
    out = macenko(
        _float(tile[None]), torch.tensor(matrix[None]).float(), torch.tensor(max_conc[None]).float(), StainTarget()
    )
    ours = (_hwc(out)[0] * 255).astype(np.uint8)  # torchstain truncates to uint8 the same way
    assert np.mean(np.abs(ours.astype(int) - ref.astype(int)) <= 1) > 0.999


def test_reinhard_is_the_cielab_statistics_transfer(tiles: np.ndarray) -> None:
    out = _hwc(reinhard(_float(tiles).double(), REINHARD_REFERENCE))
    mean, std = np.array(REINHARD_REFERENCE[0]), np.array(REINHARD_REFERENCE[1])
    for i, tile in enumerate(tiles):
        lab = color.rgb2lab(tile)
        moved = (lab - lab.mean(axis=(0, 1))) / lab.std(axis=(0, 1)) * std + mean
        ref = np.clip(color.lab2rgb(moved), 0, 1)
        np.testing.assert_allclose(out[i], ref, atol=2e-3)


def test_reinhard_output_has_the_target_statistics(tiles: np.ndarray) -> None:
    out = reinhard(_float(tiles[:2]))
    lab = color.rgb2lab(_hwc(out)[0])
    np.testing.assert_allclose(lab.mean(axis=(0, 1)), REINHARD_REFERENCE[0], atol=1.5)  # clipping to sRGB aside


def test_hed_jitter_is_scikit_images_hed_scaled_and_shifted(tiles: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    scale = rng.uniform(0.8, 1.2, (len(tiles), 3))
    shift = rng.uniform(-0.02, 0.02, (len(tiles), 3))
    out = _hwc(hed_jitter(_float(tiles).double(), torch.from_numpy(scale), torch.from_numpy(shift)))
    for i, tile in enumerate(tiles):
        rgb = np.maximum(tile / 255.0, 1e-6)
        hed = (np.log(rgb) / np.log(1e-6)) @ color.hed_from_rgb  # rgb2hed, without its clip at 0
        ref = color.hed2rgb(hed * scale[i] + shift[i])
        np.testing.assert_allclose(out[i], ref, atol=1e-6)


def test_hed_jitter_of_one_and_zero_leaves_the_image(tiles: np.ndarray) -> None:
    x = _float(tiles)
    b = len(tiles)
    out = hed_jitter(x, torch.ones(b, 3), torch.zeros(b, 3))
    assert (out - x).abs().max() < 1e-5


def test_colour_jitter_is_torchvisions_per_sample(tiles: np.ndarray) -> None:
    rng = np.random.default_rng(1)
    factors = np.column_stack([rng.uniform(0.7, 1.3, (len(tiles), 3)), rng.uniform(-0.1, 0.1, len(tiles))])
    out = _hwc(colour_jitter(_float(tiles).double(), torch.from_numpy(factors)))
    for i, tile in enumerate(tiles):
        np.testing.assert_allclose(out[i], jitter_reference(tile / 255.0, factors[i]), atol=1e-6)


def test_the_operations_run_on_float32_without_a_loop_over_samples(tiles: np.ndarray) -> None:
    x = _float(tiles)
    b = len(tiles)
    for out in (
        reinhard(x),
        hed_jitter(x, torch.ones(b, 3), torch.zeros(b, 3)),
        colour_jitter(x, torch.tensor([[1.0, 1.0, 1.0, 0.0]]).expand(b, 4)),
    ):
        assert out.shape == x.shape and out.dtype == torch.float32 and torch.isfinite(out).all()
