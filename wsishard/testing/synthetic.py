"""Seeded synthetic whole-slide images that OpenSlide reads as real ones, with their true tissue masks.

Two layouts are written:

- ``svs``: Aperio-style. Level 0 tiled, an untiled thumbnail page, then the lower levels, all JPEG with the
  Aperio ``ImageDescription`` (``AppMag``, ``MPP``) on level 0. Level tiles are RGB-colourspace JPEG (no
  YCbCr transform, Adobe marker) with the RGB photometric tag, like ``JPEG/RGB`` Aperio files (newer
  scanners write YCbCr); the thumbnail is YCbCr JPEG, which OpenSlide needs for associated images.
  OpenSlide's vendor is ``aperio``.
- ``tiff``: a generic pyramidal TIFF, each level its own tiled page (YCbCr 2x2 JPEG, as libvips writes it)
  with its resolution in pixels per centimetre. OpenSlide's vendor is ``generic-tiff``.

The content is H&E-like: pink textured stroma with purple nuclei as tissue islands with irregular borders,
holes and thin strands, on a near-white noisy background, with a few small dark dust specks that are not
tissue. The tissue outline is a signed field (in mask pixels, positive inside tissue) made at a low
resolution of ``MASK_DOWNSAMPLE`` level-0 px per mask px; level 0 is rendered tile by tile from it (the field
interpolated bilinearly, textures taken from small periodic swatches), so a large slide is never whole in
memory. The true mask is ``field > 0`` at the mask pixel centres. Same arguments and seed, same bytes.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tifffile
from PIL import Image
from scipy import ndimage as ndi
from skimage.draw import ellipse

logger = logging.getLogger(__name__)

MASK_DOWNSAMPLE = 16  # level-0 px per true-mask px
LEVEL_FACTOR = 4  # downsample between pyramid levels
MIN_LEVEL_PX = 1000  # levels are added until the longest side is below this
THUMB_PX = 1024  # longest side of the svs thumbnail page
EDGE_L0_PX = 3.0  # width of the soft tissue border at level 0


def _rgb(r: float, g: float, b: float) -> np.ndarray:
    """A (3,) float32 colour (or colour offset)."""
    return np.array([r, g, b], dtype=np.float32)


EOSIN = _rgb(225, 150, 190)
HEMATOXYLIN = _rgb(100, 60, 150)
GLASS = _rgb(240, 240, 242)
PALE_GAP = _rgb(238, 222, 232)
SHADE = _rgb(-20, -44, -20)  # colour shift from pale (shade 0) to dark (shade 1)

SlideKind = Literal["svs", "tiff"]


@dataclass(frozen=True)
class SyntheticSlide:
    """A generated slide and its ground truth.

    Attributes:
        path: the slide file.
        width, height: level-0 size in px.
        mpp: level-0 microns per px (the true value, also when the file does not record it).
        mask: (H_m, W_m) bool true tissue mask; dust is not tissue.
        mask_downsample: level-0 px per mask px (mask px ``(i, j)`` covers level-0 rows ``i*d..(i+1)*d``).
    """

    path: str
    width: int
    height: int
    mpp: float
    mask: np.ndarray
    mask_downsample: float


@dataclass(frozen=True)
class _Speck:
    """A dust speck: a level-0 alpha stamp at ``(l0_y, l0_x)`` painted with ``color``."""

    l0_y: int
    l0_x: int
    alpha: np.ndarray  # (h, w) float32 0..1
    color: np.ndarray  # (3,) float32


@dataclass(frozen=True)
class _Scene:
    """Everything the level-0 tile renderer needs; fields are padded by one mask px on top and left."""

    field: np.ndarray  # (rows, cols) float32 signed distance to the tissue border, mask px
    shade: np.ndarray  # (rows, cols) float32 stain intensity 0..1
    lo: np.ndarray  # (tile_px,) int64: tile px -> lower padded-field index (same for rows and columns)
    frac: np.ndarray  # (tile_px,) float32 bilinear weight of lo + 1
    tissue: np.ndarray  # (S, S, 3) float32 periodic tissue texture, 0..255 plus 0.5 (rounding)
    glass: np.ndarray  # (G, G, 3) uint8 periodic background texture
    glass_f: np.ndarray  # the same as float32 plus 0.5
    specks: tuple[_Speck, ...]
    tile_px: int


def make_slide(
    path: str | os.PathLike[str],
    *,
    width: int = 4096,
    height: int = 4096,
    mpp: float = 0.25,
    kind: SlideKind | None = None,
    seed: int = 0,
    tissue_fraction: float = 0.3,
    tissue: bool = True,
    dust: bool = True,
    include_mpp: bool = True,
    quality: int = 90,
    tile_px: int = 256,
) -> SyntheticSlide:
    """Write one synthetic slide and return it with its true tissue mask.

    Args:
        path: output file; its suffix picks the layout when ``kind`` is None (``.svs``; ``.tif``/``.tiff``).
        width, height: level-0 size in px, at least 64.
        mpp: level-0 microns per px; the svs ``AppMag`` is ``round(10 / mpp)``.
        kind: ``"svs"`` or ``"tiff"``; None infers it from the suffix.
        seed: non-negative seed; the same arguments and seed give byte-identical files.
        tissue_fraction: fraction of the slide area covered by tissue (0..0.9).
        tissue: False makes a blank slide (glass, noise and maybe dust).
        dust: add a few small dark dust specks on the glass, away from tissue.
        include_mpp: False leaves the resolution out of the file (no ``openslide.mpp-x``).
        quality: JPEG quality 1..100.
        tile_px: tile side in px, a multiple of 16.

    Raises:
        ValueError: a bad argument (the message names it and its value).
    """
    kind = _check_args(path, kind, width, height, mpp, seed, tissue_fraction, quality, tile_px)
    px_um = mpp * MASK_DOWNSAMPLE
    mask_shape = (math.ceil(height / MASK_DOWNSAMPLE), math.ceil(width / MASK_DOWNSAMPLE))
    frac = tissue_fraction if tissue else 0.0
    field = _tissue_field(np.random.default_rng((seed, 1)), mask_shape, px_um, frac)
    scene = _make_scene(np.random.default_rng((seed, 2)), field, (height, width), mpp, tile_px, dust)
    writer = _write_svs if kind == "svs" else _write_tiff
    writer(str(path), scene, (height, width), mpp, include_mpp, quality)
    logger.debug("wrote %s (%s, %dx%d, seed %d)", path, kind, width, height, seed)
    return SyntheticSlide(str(path), width, height, mpp, field > 0, float(MASK_DOWNSAMPLE))


def make_slides(
    folder: str | os.PathLike[str],
    n: int,
    *,
    seed: int = 0,
    width: int = 4096,
    height: int = 4096,
    mpp: float = 0.25,
    kinds: tuple[SlideKind, ...] = ("svs", "tiff"),
    **kw: Any,
) -> list[SyntheticSlide]:
    """Write ``n`` slides ``slide-000.svs``, ``slide-001.tif``, ... (kinds in turn) into ``folder``.

    Slide ``i`` is seeded from ``(seed, i)``; other keyword arguments go to :func:`make_slide`.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    if not kinds or any(k not in ("svs", "tiff") for k in kinds):
        raise ValueError(f"kinds must name 'svs' or 'tiff', got {kinds!r}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    slides: list[SyntheticSlide] = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        name = f"slide-{i:03d}.{'svs' if kind == 'svs' else 'tif'}"
        slide_seed = int(np.random.SeedSequence((seed, i)).generate_state(1)[0])
        slides.append(make_slide(out / name, width=width, height=height, mpp=mpp, kind=kind, seed=slide_seed, **kw))
    return slides


def _check_args(
    path: str | os.PathLike[str],
    kind: SlideKind | None,
    width: int,
    height: int,
    mpp: float,
    seed: int,
    tissue_fraction: float,
    quality: int,
    tile_px: int,
) -> SlideKind:
    """Validate make_slide's arguments and return the layout kind."""
    checks = [
        ("width", width, width >= 64),
        ("height", height, height >= 64),
        ("mpp", mpp, math.isfinite(mpp) and mpp > 0),
        ("seed", seed, seed >= 0),
        ("tissue_fraction", tissue_fraction, 0.0 <= tissue_fraction <= 0.9),
        ("quality", quality, 1 <= quality <= 100),
        ("tile_px", tile_px, tile_px >= 16 and tile_px % MASK_DOWNSAMPLE == 0),
    ]
    for name, value, ok in checks:
        if not ok:
            raise ValueError(f"invalid {name}: {value!r}")
    if kind is not None:
        if kind not in ("svs", "tiff"):
            raise ValueError(f"invalid kind: {kind!r} (expected 'svs' or 'tiff')")
        return kind
    suffix = Path(path).suffix.lower()
    if suffix == ".svs":
        return "svs"
    if suffix in (".tif", ".tiff"):
        return "tiff"
    raise ValueError(f"cannot infer the slide kind from the suffix of {str(path)!r}; pass kind=")


# ---------------------------------------------------------------------------------------------------------
# The tissue field (mask resolution)
# ---------------------------------------------------------------------------------------------------------


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], spacing_px: float) -> np.ndarray:
    """Zero-mean, unit-std smooth noise with blobs about ``spacing_px`` apart (wraps around; float32)."""
    sigma = max(float(spacing_px), 1.0) / 3
    return _normalized(_blur_wrap(rng.standard_normal(shape, dtype=np.float32), (sigma, sigma)))


def _normalized(x: np.ndarray) -> np.ndarray:
    """``x`` shifted and scaled to zero mean and unit standard deviation."""
    return (x - x.mean()) / max(float(x.std()), 1e-6)


def _tissue_field(rng: np.random.Generator, shape: tuple[int, int], px_um: float, fraction: float) -> np.ndarray:
    """Signed field (mask px, > 0 inside tissue) with islands, holes and strands covering ``fraction``."""
    if fraction <= 0:
        return np.full(shape, -8.0, dtype=np.float32)
    size = max(shape)
    base = _smooth_noise(rng, shape, size / 3) + 0.5 * _smooth_noise(rng, shape, size / 8)
    base += 0.3 * _smooth_noise(rng, shape, 80.0 / px_um)  # ragged borders, ~80 um
    yy = np.minimum(np.arange(shape[0]), shape[0] - 1 - np.arange(shape[0]))[:, None]
    xx = np.minimum(np.arange(shape[1]), shape[1] - 1 - np.arange(shape[1]))[None, :]
    ramp = np.clip(np.minimum(yy, xx) / (0.08 * size), 0.0, 1.0)
    base -= 3.0 * (1.0 - ramp).astype(np.float32)  # keep tissue off the slide edges
    sd = _as_distance(base - np.quantile(base, 1.0 - fraction))
    min_px = 25_000.0 / px_um**2  # smallest island (the largest is always kept), mask px
    sd = _drop_fragments(sd, min_px)
    islands = sd > 0
    field = _fit_fraction(sd, _hole_field(rng, islands, px_um), _strand_field(rng, islands, px_um), fraction)
    field = _drop_fragments(field, min_px)  # fitting can leave crumbs; refit once without them
    return _drop_fragments(field - _kth_largest(field, round(fraction * field.size)), min_px)


def _as_distance(g: np.ndarray) -> np.ndarray:
    """Scale a field so it reads roughly as a signed distance in px near its zero level."""
    grad = np.hypot(*np.gradient(g))
    band = np.abs(g) < np.quantile(np.abs(g), 0.05)
    slope = float(np.median(grad[band])) if band.any() else 1.0
    return (g / max(slope, 1e-6)).astype(np.float32)


def _drop_fragments(sd: np.ndarray, min_px: float) -> np.ndarray:
    """Push islands smaller than ``min_px`` below zero, keeping at least the largest one."""
    labels, n = ndi.label(sd > 0)
    if n == 0:
        return sd
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    small = sizes < min_px
    small[0] = False
    small[int(np.argmax(sizes))] = False
    out = sd.copy()
    out[small[labels]] = -1e3
    return out


def _hole_field(rng: np.random.Generator, islands: np.ndarray, px_um: float) -> np.ndarray:
    """Field that is negative inside a few irregular round holes well inside islands (+inf elsewhere)."""
    holes = np.full(islands.shape, np.inf, dtype=np.float32)
    depth = ndi.distance_transform_edt(islands)
    placed: list[tuple[float, float, float]] = []
    for _ in range(int(rng.integers(1, 4))):
        r = rng.uniform(70.0, 160.0) / px_um
        cand = np.argwhere(depth >= r + 3.0)
        for py, px, pr in placed:
            cand = cand[np.hypot(cand[:, 0] - py, cand[:, 1] - px) > r + pr + 3.0]
        if len(cand) == 0:
            continue
        cy, cx = (float(v) for v in cand[rng.integers(len(cand))])
        placed.append((cy, cx, r))
        y0, y1 = int(cy - 1.3 * r) - 1, int(cy + 1.3 * r) + 2
        x0, x1 = int(cx - 1.3 * r) - 1, int(cx + 1.3 * r) + 2
        yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
        theta = np.arctan2(yy - cy, xx - cx)
        phase = rng.uniform(0, 2 * np.pi, 2)
        radius = r * (1 + 0.12 * np.sin(3 * theta + phase[0]) + 0.06 * np.sin(5 * theta + phase[1]))
        region = holes[max(y0, 0) : y1, max(x0, 0) : x1]
        local = (np.hypot(yy - cy, xx - cx) - radius)[max(-y0, 0) :, max(-x0, 0) :]
        region[...] = np.minimum(region, local[: region.shape[0], : region.shape[1]])
    return holes


def _strand_field(rng: np.random.Generator, islands: np.ndarray, px_um: float) -> np.ndarray:
    """Field that is positive inside a few thin curved strands joining or trailing from islands (-inf elsewhere)."""
    strands = np.full(islands.shape, -np.inf, dtype=np.float32)
    labels, n = ndi.label(islands)
    if n == 0:
        return strands
    depth = ndi.distance_transform_edt(islands)
    for _ in range(min(int(rng.integers(1, 3)), n - 1)):  # connecting strands
        a, b = rng.choice(n, 2, replace=False) + 1
        p0 = _pick(rng, _deepest(labels == a, depth, 2.0))
        p1 = _pick(rng, _deepest(labels == b, depth, 2.0))
        _draw_strand(rng, strands, p0, p1, rng.uniform(30.0, 70.0) / px_um)
    for _ in range(int(rng.integers(1, 3))):  # trailing strands
        lab = int(rng.integers(n)) + 1
        p0 = _pick(rng, (labels == lab) & (depth <= 1.5))
        centre = np.argwhere(labels == lab).mean(axis=0)
        direction = p0 - centre
        angle = math.atan2(direction[0], direction[1]) + rng.uniform(-0.5, 0.5)
        length = rng.uniform(150.0, 600.0) / px_um
        p1 = p0 + length * np.array([math.sin(angle), math.cos(angle)])
        _draw_strand(rng, strands, p0, p1, rng.uniform(30.0, 60.0) / px_um)
    return strands


def _deepest(island: np.ndarray, depth: np.ndarray, at_least: float) -> np.ndarray:
    """The island's pixels at least ``at_least`` px deep, or its deepest ones if it is thinner."""
    return island & (depth >= min(at_least, float(depth[island].max())))


def _pick(rng: np.random.Generator, where: np.ndarray) -> np.ndarray:
    """A random (row, col) where ``where`` is true (float64)."""
    cand = np.argwhere(where)
    return cand[rng.integers(len(cand))].astype(np.float64)


def _draw_strand(rng: np.random.Generator, strands: np.ndarray, p0: np.ndarray, p1: np.ndarray, width: float) -> None:
    """Max a quadratic-Bezier strand of ``width`` px from p0 to p1 into ``strands`` (signed, px)."""
    length = float(np.linalg.norm(p1 - p0))
    normal = np.array([-(p1 - p0)[1], (p1 - p0)[0]]) / max(length, 1e-6)
    ctrl = (p0 + p1) / 2 + normal * rng.uniform(-0.3, 0.3) * length
    t = np.linspace(0.0, 1.0, max(int(2 * length), 2))[:, None]
    pts = np.rint((1 - t) ** 2 * p0 + 2 * t * (1 - t) * ctrl + t**2 * p1).astype(np.int64)
    inside = (pts >= 0).all(axis=1) & (pts[:, 0] < strands.shape[0]) & (pts[:, 1] < strands.shape[1])
    pts = pts[inside]
    if len(pts) == 0:
        return
    pad = int(width / 2) + 3
    y0, x0 = np.maximum(pts.min(axis=0) - pad, 0)
    y1, x1 = pts.max(axis=0) + pad + 1
    line = np.ones((min(y1, strands.shape[0]) - y0, min(x1, strands.shape[1]) - x0), dtype=bool)
    line[pts[:, 0] - y0, pts[:, 1] - x0] = False
    local = (width / 2 - ndi.distance_transform_edt(line)).astype(np.float32)
    region = strands[y0 : y0 + line.shape[0], x0 : x0 + line.shape[1]]
    np.maximum(region, local, out=region)


def _kth_largest(values: np.ndarray, k: int) -> np.float32:
    """The value with exactly ``k`` values above it (ties aside), for 0 < k < values.size."""
    flat = values.ravel()
    k = min(max(k, 1), flat.size - 1)
    return np.float32(np.partition(flat, flat.size - k - 1)[flat.size - k - 1])


def _fit_fraction(sd: np.ndarray, holes: np.ndarray, strands: np.ndarray, fraction: float) -> np.ndarray:
    """Combine the fields, shifting the island field so the tissue covers ``fraction`` of the mask."""
    in_strand = strands > 0
    free = (holes > 0) & ~in_strand
    vals = sd[free]
    k = round(fraction * sd.size) - int(in_strand.sum())
    if k <= 0 or len(vals) == 0:
        shift = float(vals.max()) if len(vals) else 0.0
    elif k >= len(vals):
        shift = float(vals.min()) - 1.0
    else:
        shift = float(_kth_largest(vals, k))
    return np.maximum(np.minimum(sd - shift, holes), strands).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# Textures, dust and the scene
# ---------------------------------------------------------------------------------------------------------


def _blur_wrap(img: np.ndarray, sigma_yx: tuple[float, float]) -> np.ndarray:
    """Gaussian blur of a 2-D image with wrap-around borders (FFT), sigmas in px; float32."""
    h, w = img.shape
    spec = np.fft.rfft2(img.astype(np.float32, copy=False))
    spec *= np.exp(-2 * np.pi**2 * (sigma_yx[0] * np.fft.fftfreq(h)) ** 2).astype(np.float32)[:, None]
    spec *= np.exp(-2 * np.pi**2 * (sigma_yx[1] * np.fft.rfftfreq(w)) ** 2).astype(np.float32)[None, :]
    return np.fft.irfft2(spec, s=(h, w)).astype(np.float32, copy=False)


def _periodic_noise(rng: np.random.Generator, size: int, sigma_yx: tuple[float, float]) -> np.ndarray:
    """(size, size) zero-mean unit-std periodic Gaussian-filtered noise, sigmas in px; float32."""
    return _normalized(_blur_wrap(rng.standard_normal((size, size), dtype=np.float32), sigma_yx))


def _tissue_swatch(rng: np.random.Generator, size: int, mpp: float) -> np.ndarray:
    """(size, size, 3) uint8 periodic H&E texture: fibrous pink stroma, pale gaps, purple nuclei."""
    um = 1.0 / mpp  # px per micron
    fine = _periodic_noise(rng, size, (0.8 * um, 0.8 * um))[..., None]
    fibre = _periodic_noise(rng, size, (1.5 * um, 8.0 * um))[..., None]
    gaps = np.clip((_periodic_noise(rng, size, (4 * um, 4 * um)) - 1.1) * 1.5, 0.0, 0.8)[..., None]
    stroma = EOSIN + fine * _rgb(4, 6, 4) + fibre * _rgb(7, 11, 7)
    stroma = stroma * (1 - gaps) + PALE_GAP * gaps
    alpha = np.zeros((size, size), dtype=np.float32)
    mean_r = max(4.0 * um, 1.5)
    for _ in range(int(0.12 * size * size / (np.pi * mean_r**2))):  # nuclei, 5.6-10 um wide
        ry, rx = np.maximum(rng.uniform(2.8, 5.0, 2) * um, 1.0)
        rr, cc = ellipse(rng.uniform(0, size), rng.uniform(0, size), ry, rx, rotation=rng.uniform(0, np.pi))
        alpha[rr % size, cc % size] = rng.uniform(0.75, 1.0)
    alpha = np.clip(_blur_wrap(alpha, (0.4 * um, 0.4 * um)), 0.0, 1.0)[..., None]
    nuclei = HEMATOXYLIN + fine * _rgb(10, 8, 12)
    return np.clip(stroma * (1 - alpha) + nuclei * alpha + 0.5, 0, 255).astype(np.uint8)


def _glass_swatch(rng: np.random.Generator, size: int) -> np.ndarray:
    """(size, size, 3) uint8 periodic near-white background with faint noise."""
    slow = _periodic_noise(rng, size, (40.0, 40.0))[..., None] * 0.8
    grain = rng.normal(0.0, 1.2, (size, size, 3)).astype(np.float32)
    return np.clip(GLASS + slow + grain + 0.5, 0, 255).astype(np.uint8)


def _dust_specks(rng: np.random.Generator, field: np.ndarray, shape: tuple[int, int], mpp: float) -> tuple[_Speck, ...]:
    """A few dark specks 15-60 um wide on the glass, inside the slide, apart, and away from tissue.

    A speck's edge is 200 um from tissue where the glass allows, else 100 or 60 um (small slides).
    """
    tissue = field > 0
    away_um = ndi.distance_transform_edt(~tissue) * MASK_DOWNSAMPLE * mpp if tissue.any() else None
    specks: list[_Speck] = []
    for _ in range(int(rng.integers(3, 8))):
        d = rng.uniform(15.0, 60.0) / mpp  # level-0 px
        margin = int(d / 2 / MASK_DOWNSAMPLE) + 2
        if 2 * margin >= min(field.shape):
            continue
        free = np.zeros(field.shape, dtype=bool)
        free[margin:-margin, margin:-margin] = True
        for sp in specks:  # keep specks >= 150 um apart
            sy, sx = (
                (sp.l0_y + sp.alpha.shape[0] // 2) // MASK_DOWNSAMPLE,
                (sp.l0_x + sp.alpha.shape[1] // 2) // MASK_DOWNSAMPLE,
            )
            r = int(150.0 / (mpp * MASK_DOWNSAMPLE)) + 1
            free[max(sy - r, 0) : sy + r + 1, max(sx - r, 0) : sx + r + 1] = False
        gaps = [free] if away_um is None else [free & (away_um >= g + d * mpp / 2) for g in (200.0, 100.0, 60.0)]
        ok = next((g for g in gaps if g.any()), None)
        if ok is None:
            continue
        my, mx = _pick(rng, ok)
        specks.append(_speck(rng, d, (my + 0.5) * MASK_DOWNSAMPLE, (mx + 0.5) * MASK_DOWNSAMPLE))
    return tuple(specks)


def _speck(rng: np.random.Generator, d: float, l0_cy: float, l0_cx: float) -> _Speck:
    """An irregular dark speck about ``d`` level-0 px wide centred at (l0_cy, l0_cx)."""
    side = int(d) + 4
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) - (side - 1) / 2
    theta = np.arctan2(yy, xx)
    radius = d / 2 * (1 + 0.2 * np.sin(2 * theta + rng.uniform(0, 6.3)) + 0.1 * np.sin(5 * theta))
    alpha = np.clip(radius - np.hypot(yy, xx) + 0.5, 0.0, 1.0) * 0.92
    color = _rgb(55, 48, 42) + np.float32(rng.uniform(-15, 15))
    return _Speck(int(l0_cy) - side // 2, int(l0_cx) - side // 2, alpha.astype(np.float32), color)


def _make_scene(
    rng: np.random.Generator, field: np.ndarray, shape: tuple[int, int], mpp: float, tile_px: int, dust: bool
) -> _Scene:
    """Pad the fields for tile rendering and make the textures and dust."""
    k = tile_px // MASK_DOWNSAMPLE
    need = (math.ceil(shape[0] / tile_px) * k + 2, math.ceil(shape[1] / tile_px) * k + 2)
    pad = ((1, need[0] - field.shape[0] - 1), (1, need[1] - field.shape[1] - 1))
    shade = np.clip(0.5 + 0.3 * _smooth_noise(rng, field.shape, 300.0 / (mpp * MASK_DOWNSAMPLE)), 0, 1)
    u = (np.arange(tile_px) + 0.5) / MASK_DOWNSAMPLE + 0.5  # tile px -> padded-field coordinates
    lo = np.floor(u).astype(np.int64)
    swatch = tile_px * math.ceil(1024 / tile_px)
    glass = _glass_swatch(rng, tile_px * math.ceil(512 / tile_px))
    return _Scene(
        field=np.pad(field, pad, mode="edge"),
        shade=np.pad(shade, pad, mode="edge").astype(np.float32),
        lo=lo,
        frac=(u - lo).astype(np.float32),
        tissue=_tissue_swatch(rng, swatch, mpp).astype(np.float32) + np.float32(0.5),
        glass=glass,
        glass_f=glass.astype(np.float32) + np.float32(0.5),
        specks=_dust_specks(rng, field, shape, mpp) if dust else (),
        tile_px=tile_px,
    )


# ---------------------------------------------------------------------------------------------------------
# Rendering and writing
# ---------------------------------------------------------------------------------------------------------


def _bilinear(sc: _Scene, patch: np.ndarray) -> np.ndarray:
    """Upsample a (k + 2, k + 2) padded-field patch to the (tile_px, tile_px) tile (no BLAS: threads spin)."""
    rows = patch[sc.lo] + sc.frac[:, None] * (patch[sc.lo + 1] - patch[sc.lo])
    return rows[:, sc.lo] + sc.frac[None, :] * (rows[:, sc.lo + 1] - rows[:, sc.lo])


def _render_tile(sc: _Scene, ty: int, tx: int) -> np.ndarray:
    """The (tile_px, tile_px, 3) uint8 level-0 tile at tile row ``ty``, column ``tx``."""
    t = sc.tile_px
    y0, x0 = ty * t, tx * t
    gy, gx = y0 % sc.glass.shape[0], x0 % sc.glass.shape[1]
    glass = sc.glass[gy : gy + t, gx : gx + t]  # a view: copied before any painting
    out = _tissue_tile(sc, ty, tx)
    if out is None:
        out = glass
    for s in sc.specks:
        sy0, sx0 = s.l0_y - y0, s.l0_x - x0
        h, w = s.alpha.shape
        if sy0 >= t or sx0 >= t or sy0 + h <= 0 or sx0 + w <= 0:
            continue
        if out.base is sc.glass:
            out = out.copy()
        a0y, a0x = max(-sy0, 0), max(-sx0, 0)
        a = s.alpha[a0y : min(h, t - sy0), a0x : min(w, t - sx0)][..., None]
        region = out[sy0 + a0y : sy0 + a0y + a.shape[0], sx0 + a0x : sx0 + a0x + a.shape[1]]
        region[...] = np.clip(region * (1 - a) + s.color * a + 0.5, 0, 255).astype(np.uint8)
    return out


def _tissue_tile(sc: _Scene, ty: int, tx: int) -> np.ndarray | None:
    """The tile with its tissue painted over the glass (uint8), or None where the tile has no tissue."""
    t, k = sc.tile_px, sc.tile_px // MASK_DOWNSAMPLE
    rows, cols = slice(ty * k, ty * k + k + 2), slice(tx * k, tx * k + k + 2)
    patch = sc.field[rows, cols]
    if patch.max() <= -1.0:
        return None
    sy, sx = (ty * t) % sc.tissue.shape[0], (tx * t) % sc.tissue.shape[1]
    shade = _bilinear(sc, sc.shade[rows, cols])  # (t, t) float32, 0..1
    shade -= 0.5
    out = np.empty((t, t, 3), dtype=np.float32)  # in place from here on
    for c in range(3):  # per channel: numpy broadcasting over a last axis of 3 is slow
        np.multiply(shade, SHADE[c], out=out[..., c])
    out += sc.tissue[sy : sy + t, sx : sx + t]
    if patch.min() < 1.0:  # the border runs through the tile: blend with the glass
        alpha = _bilinear(sc, patch)  # signed distance, mask px
        alpha *= MASK_DOWNSAMPLE / EDGE_L0_PX
        alpha += 0.5
        np.clip(alpha, 0.0, 1.0, out=alpha)
        gy, gx = (ty * t) % sc.glass.shape[0], (tx * t) % sc.glass.shape[1]
        back = sc.glass_f[gy : gy + t, gx : gx + t]
        out -= back
        for c in range(3):
            out[..., c] *= alpha
        out += back
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)


def _reduce(img: np.ndarray, factor: int = LEVEL_FACTOR) -> np.ndarray:
    """Block-mean downsample (h, w, 3) uint8 by ``factor``, padding a partial edge block by replication."""
    h, w = img.shape[:2]
    oh, ow = -(-h // factor), -(-w // factor)
    if (oh * factor, ow * factor) != (h, w):
        img = np.pad(img, ((0, oh * factor - h), (0, ow * factor - w), (0, 0)), mode="edge")
    wide = img.astype(np.uint16)
    rows = sum(wide[i::factor] for i in range(1, factor)) + wide[0::factor]  # strided adds beat a reshape-sum
    cols = sum(rows[:, i::factor] for i in range(1, factor)) + rows[:, 0::factor]
    return ((cols + factor * factor // 2) // (factor * factor)).astype(np.uint8)


def _level0_tiles(sc: _Scene, shape: tuple[int, int], level1: np.ndarray) -> Iterator[np.ndarray]:
    """Yield level-0 tiles row by row, writing their 4x block means into ``level1``."""
    t, q = sc.tile_px, sc.tile_px // LEVEL_FACTOR
    for ty in range(math.ceil(shape[0] / t)):
        for tx in range(math.ceil(shape[1] / t)):
            tile = _render_tile(sc, ty, tx)
            level1[ty * q : (ty + 1) * q, tx * q : (tx + 1) * q] = _reduce(tile)
            yield tile


def _levels(
    sc: _Scene, shape: tuple[int, int], write0: Callable[[Iterator[np.ndarray]], None]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Render level 0 through ``write0(tiles)``; return the 4x-reduced view and the lower levels.

    Lower levels are added in 4x steps while the previous level's longest side is at least 1000 px.
    """
    t, q = sc.tile_px, sc.tile_px // LEVEL_FACTOR
    acc = np.empty((math.ceil(shape[0] / t) * q, math.ceil(shape[1] / t) * q, 3), dtype=np.uint8)
    write0(_level0_tiles(sc, shape, acc))
    reduced = acc[: -(-shape[0] // LEVEL_FACTOR), : -(-shape[1] // LEVEL_FACTOR)]
    levels = [reduced] if max(shape) >= MIN_LEVEL_PX else []
    while levels and max(levels[-1].shape[:2]) >= MIN_LEVEL_PX:
        levels.append(_reduce(levels[-1]))
    return reduced, levels


def _jpeg_args(kind: SlideKind, quality: int) -> dict[str, Any]:
    """tifffile arguments for Aperio-style RGB JPEG (svs) or YCbCr 2x2 JPEG (tiff)."""
    if kind == "svs":
        args = {"level": quality, "outcolorspace": "RGB"}
        return {"compression": "jpeg", "compressionargs": args, "subsampling": (1, 1), "photometric": "rgb"}
    return {"compression": "jpeg", "compressionargs": {"level": quality}, "photometric": "rgb"}


def _write_svs(path: str, sc: _Scene, shape: tuple[int, int], mpp: float, include_mpp: bool, quality: int) -> None:
    """Write an Aperio-style svs: level 0, thumbnail, lower levels."""
    h, w = shape
    t = sc.tile_px
    head = f"Aperio Image Library v12.0.0 \r\n{w}x{h} [0,0 {w}x{h}] ({t}x{t})"
    desc = f"{head} JPEG/RGB Q={quality}|AppMag = {round(10 / mpp)}"
    desc += f"|MPP = {mpp:g}" if include_mpp else ""
    jpeg = _jpeg_args("svs", quality)
    common: dict[str, Any] = {"metadata": None, "maxworkers": 1}
    with tifffile.TiffWriter(path, bigtiff=3 * h * w > 2**31) as tw:

        def write0(tiles: Iterator[np.ndarray]) -> None:
            tw.write(tiles, shape=(h, w, 3), dtype=np.uint8, tile=(t, t), description=desc, **jpeg, **common)

        reduced, levels = _levels(sc, shape, write0)
        src = next((lv for lv in reversed(levels) if max(lv.shape[:2]) >= THUMB_PX), reduced)
        scale = min(THUMB_PX, max(src.shape[:2])) / max(shape)
        tw_, th_ = max(1, round(w * scale)), max(1, round(h * scale))
        thumb = np.asarray(Image.fromarray(np.ascontiguousarray(src)).resize((tw_, th_), Image.Resampling.BOX))
        thumb_jpeg = _jpeg_args("tiff", quality)  # untiled, YCbCr JPEG strips
        tw.write(thumb, description=f"{head} -> {tw_}x{th_} - ", **thumb_jpeg, **common)
        for lv in levels:
            lh, lw = lv.shape[:2]
            ldesc = f"{head} -> {lw}x{lh} JPEG/RGB Q={quality}"
            tw.write(lv, tile=(t, t), description=ldesc, **jpeg, **common)


def _write_tiff(path: str, sc: _Scene, shape: tuple[int, int], mpp: float, include_mpp: bool, quality: int) -> None:
    """Write a generic pyramidal TIFF, each level a tiled page with its resolution in px/cm."""
    h, w = shape
    t = sc.tile_px
    jpeg = _jpeg_args("tiff", quality)

    def res(level_shape: tuple[int, ...]) -> dict[str, Any]:
        if not include_mpp:
            return {}
        sy, sx = h / level_shape[0], w / level_shape[1]
        return {"resolution": (1e4 / (mpp * sx), 1e4 / (mpp * sy)), "resolutionunit": "CENTIMETER"}

    common: dict[str, Any] = {"metadata": None, "maxworkers": 1}
    with tifffile.TiffWriter(path, bigtiff=3 * h * w > 2**31) as tw:

        def write0(tiles: Iterator[np.ndarray]) -> None:
            tw.write(tiles, shape=(h, w, 3), dtype=np.uint8, tile=(t, t), **jpeg, **res(shape), **common)

        for lv in _levels(sc, shape, write0)[1]:
            tw.write(lv, tile=(t, t), subfiletype=1, **jpeg, **res(lv.shape), **common)
