"""The build's per-slide Macenko fit (builder/scan/stain.py): against torchstain on real tissue, on known stains, and
its fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
from cmu import cmu_rgb

from wsishard.builder.scan.stain import (
    IO,
    MIN_PIXELS,
    REFERENCE_MATRIX,
    fit_or_reference,
    macenko,
    optical_density,
)

# two H&E-like stains (unit OD vectors, columns H, E) unlike the reference
_H = np.array([0.70, 0.65, 0.30])
_E = np.array([0.12, 0.85, 0.51])


def _mixed(conc: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """(n, 2) concentrations through ``matrix`` (3, 2) into uint8 RGB, as light through the stains."""
    od = conc @ (matrix / np.linalg.norm(matrix, axis=0)).T  # (n, 3)
    return np.clip(IO * np.exp(-od) - 1, 0, 255).round().astype(np.uint8)


def _conc(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 2) H, E concentrations: nuclei, stroma and what lies between (mostly near one stain), some glass."""
    share = rng.beta(0.3, 0.3, n)  # of haematoxylin
    total = rng.gamma(2.0, 0.5, n) * (rng.random(n) > 0.2)
    return np.stack([total * share, total * (1 - share)], axis=1)


def _patches(rng: np.random.Generator, n: int = 4, size: int = 96) -> np.ndarray:
    """(n, size, size, 3) uint8 tissue-like patches of the stains _H, _E."""
    return _mixed(_conc(rng, n * size * size), np.stack([_H, _E], axis=1)).reshape(n, size, size, 3)


def test_the_fit_is_torchstains_on_real_tissue() -> None:
    torchstain = pytest.importorskip("torchstain.numpy.normalizers.macenko")
    img = cmu_rgb()[:1500, :1500]
    ref = torchstain.NumpyMacenkoNormalizer()
    ref.fit(img)
    matrix, max_conc, _ = macenko(optical_density(img.reshape(-1, 3)))
    np.testing.assert_allclose(matrix, np.abs(ref.HERef), atol=1e-9)  # torchstain leaves the eigenvectors' signs
    np.testing.assert_allclose(max_conc, ref.maxCRef, rtol=1e-9)


def test_known_stains_are_recovered() -> None:
    fit = fit_or_reference(_patches(np.random.default_rng(0)))
    assert fit.source == "fitted" and fit.reason == ""
    cos = np.sum(fit.matrix * np.stack([_H, _E], axis=1) / np.linalg.norm([_H, _E], axis=1), axis=0)
    assert np.degrees(np.arccos(np.clip(cos, -1, 1))).max() < 3.0  # each vector within 3 degrees of its stain


def test_darker_haematoxylin_raises_its_max_concentration_only() -> None:
    rng = np.random.default_rng(1)
    conc = _conc(rng, 4 * 96 * 96)
    matrix = np.stack([_H, _E], axis=1)
    a = fit_or_reference(_mixed(conc, matrix).reshape(4, 96, 96, 3))
    b = fit_or_reference(_mixed(conc * [1.5, 0.6], matrix).reshape(4, 96, 96, 3))
    np.testing.assert_allclose(b.max_conc / a.max_conc, [1.5, 0.6], rtol=0.08)
    assert np.degrees(np.arccos(np.sum(a.matrix * b.matrix, axis=0))).max() < 3.0


def test_blank_glass_falls_back_to_the_reference_with_the_reason() -> None:
    glass = np.full((4, 64, 64, 3), 238, dtype=np.uint8)
    fit = fit_or_reference(glass)
    assert fit.source == "reference"
    assert "too little stained tissue" in fit.reason and f"{MIN_PIXELS} needed" in fit.reason
    np.testing.assert_array_equal(fit.matrix, np.array(REFERENCE_MATRIX))
    assert fit.to_record()["source"] == "reference" and fit.to_record()["reason"] == fit.reason


def test_marker_ink_is_left_out_pixel_by_pixel() -> None:
    rng = np.random.default_rng(2)
    patches = _patches(rng)
    clean = fit_or_reference(patches)
    inked = patches.copy()
    inked[:, :, :40] = (20, 90, 200)  # a blue marker stroke over 40% of each patch
    fit = fit_or_reference(inked)
    assert fit.source == "fitted"
    assert np.degrees(np.arccos(np.sum(clean.matrix * fit.matrix, axis=0))).max() < 3.0
    assert fit.pixels < 0.7 * clean.pixels  # the stroke's pixels were not used


def test_dark_grey_pixels_are_left_out_without_a_mask() -> None:
    rng = np.random.default_rng(4)
    patches = _patches(rng)
    clean = fit_or_reference(patches)
    dirty = patches.copy()
    dirty[:, 40:70] = 45  # black dirt / a black pen stroke: dark and grey
    fit = fit_or_reference(dirty)
    assert np.degrees(np.arccos(np.sum(clean.matrix * fit.matrix, axis=0))).max() < 3.0
    np.testing.assert_allclose(fit.max_conc, clean.max_conc, rtol=0.05)


def test_nothing_kept_is_not_fitted() -> None:
    patches = _patches(np.random.default_rng(5))
    fit = fit_or_reference(patches, np.zeros(patches.shape[:3], dtype=bool))
    assert fit.source == "reference" and "too little stained tissue (0 px" in fit.reason


def test_a_single_stain_is_a_degenerate_fit() -> None:
    rng = np.random.default_rng(3)
    conc = np.zeros((4 * 96 * 96, 2))
    conc[:, 0] = 0.6 + rng.gamma(2.0, 0.4, len(conc))  # haematoxylin only: one direction
    fit = fit_or_reference(_mixed(conc, np.stack([_H, _E], axis=1)).reshape(4, 96, 96, 3))
    assert fit.source == "reference" and fit.reason.startswith("degenerate fit")


def test_no_patches_at_all() -> None:
    fit = fit_or_reference(np.empty((0, 64, 64, 3), np.uint8))
    assert fit.source == "reference" and fit.reason == "no tissue patch to fit on"
