"""The seeded content of a synthetic slide and its level-0 tile renderer.

The content is H&E-like: pink textured stroma with purple nuclei as tissue islands with irregular borders,
holes and thin strands, on a near-white noisy background, with a few small dark dust specks that are not
tissue. The tissue outline is a signed field (in mask pixels, positive inside tissue, see
:mod:`wsishard.testing.tissue_field`) made at a low resolution of ``MASK_DOWNSAMPLE`` level-0 px per mask
px; level 0 is rendered tile by tile from it (the field interpolated bilinearly, textures taken from small
periodic swatches), so a large slide is never whole in memory.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import ndimage as ndi
from skimage.draw import ellipse

from wsishard.testing.pigment import CARBON_T, carbon_swatch
from wsishard.testing.tissue_field import blur_wrap, normalized, pick, smooth_noise

MASK_DOWNSAMPLE = 16  # level-0 px per true-mask px
EDGE_L0_PX = 3.0  # width of the soft tissue border at level 0


def _rgb(r: float, g: float, b: float) -> np.ndarray:
    """A (3,) float32 colour (or colour offset)."""
    return np.array([r, g, b], dtype=np.float32)


EOSIN = _rgb(225, 150, 190)
HEMATOXYLIN = _rgb(100, 60, 150)
GLASS = _rgb(240, 240, 242)
PALE_GAP = _rgb(238, 222, 232)
SHADE = _rgb(-20, -44, -20)  # colour shift from pale (shade 0) to dark (shade 1)


@dataclass(frozen=True)
class _Speck:
    """A dust speck: a level-0 alpha stamp at ``(l0_y, l0_x)`` painted with ``color``."""

    l0_y: int
    l0_x: int
    alpha: np.ndarray  # (h, w) float32 0..1
    color: np.ndarray  # (3,) float32


@dataclass(frozen=True)
class Scene:
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
    overlay: np.ndarray | None = None  # (rows, cols, 3) float32 artefacts' pixel factor (padded), None: none
    carbon: np.ndarray | None = None  # (rows, cols) float32 weight of the carbon specks (padded), None: none
    specks_alpha: np.ndarray | None = None  # (S, S) float32 periodic carbon-speck opacity at level 0


# ---------------------------------------------------------------------------------------------------------
# Textures, dust and the scene
# ---------------------------------------------------------------------------------------------------------


def _periodic_noise(rng: np.random.Generator, size: int, sigma_yx: tuple[float, float]) -> np.ndarray:
    """(size, size) zero-mean unit-std periodic Gaussian-filtered noise, sigmas in px; float32."""
    return normalized(blur_wrap(rng.standard_normal((size, size), dtype=np.float32), sigma_yx))


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
    alpha = np.clip(blur_wrap(alpha, (0.4 * um, 0.4 * um)), 0.0, 1.0)[..., None]
    nuclei = HEMATOXYLIN + fine * _rgb(10, 8, 12)
    return np.clip(stroma * (1 - alpha) + nuclei * alpha + 0.5, 0, 255).astype(np.uint8)


_TEXTURES: OrderedDict[str, tuple[np.ndarray, Mapping[str, Any]]] = OrderedDict()
_TEXTURES_KEPT = 4  # ~13 MB each at 1024 px


def _tissue_texture(rng: np.random.Generator, size: int, mpp: float) -> np.ndarray:
    """:func:`_tissue_swatch` as read-only float32 (+0.5: rounded when cast back). The same ``rng`` state, size and
    mpp make the same swatch, so the last few are kept: slides of one seed and size (with other artefacts or
    pigments) pay for theirs once. ``rng`` is left where making the swatch would leave it."""
    key = f"{rng.bit_generator.state}|{size}|{mpp!r}"
    if key in _TEXTURES:
        _TEXTURES.move_to_end(key)
        texture, rng.bit_generator.state = _TEXTURES[key]
        return texture
    texture = _tissue_swatch(rng, size, mpp).astype(np.float32) + np.float32(0.5)
    texture.flags.writeable = False
    _TEXTURES[key] = (texture, rng.bit_generator.state)
    while len(_TEXTURES) > _TEXTURES_KEPT:
        _TEXTURES.popitem(last=False)
    return texture


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
        my, mx = pick(rng, ok)
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


def make_scene(
    rng: np.random.Generator,
    field: np.ndarray,
    shape: tuple[int, int],
    mpp: float,
    tile_px: int,
    dust: bool,
    overlay: np.ndarray | None = None,
    carbon: np.ndarray | None = None,
) -> Scene:
    """Pad the fields for tile rendering and make the textures and dust; ``overlay`` is the artefacts' (and
    pigments') (rows, cols, 3) pixel factor at mask resolution (:attr:`wsishard.testing.artefacts.Artefacts.factor`),
    ``carbon`` the (rows, cols) weight of carbon specks (:attr:`wsishard.testing.pigment.Pigments.carbon`)."""
    k = tile_px // MASK_DOWNSAMPLE
    need = (math.ceil(shape[0] / tile_px) * k + 2, math.ceil(shape[1] / tile_px) * k + 2)
    pad = ((1, need[0] - field.shape[0] - 1), (1, need[1] - field.shape[1] - 1))
    shade = np.clip(0.5 + 0.3 * smooth_noise(rng, field.shape, 300.0 / (mpp * MASK_DOWNSAMPLE)), 0, 1)
    u = (np.arange(tile_px) + 0.5) / MASK_DOWNSAMPLE + 0.5  # tile px -> padded-field coordinates
    lo = np.floor(u).astype(np.int64)
    swatch = tile_px * math.ceil(1024 / tile_px)
    glass = _glass_swatch(rng, tile_px * math.ceil(512 / tile_px))
    return Scene(
        field=np.pad(field, pad, mode="edge"),
        shade=np.pad(shade, pad, mode="edge").astype(np.float32),
        lo=lo,
        frac=(u - lo).astype(np.float32),
        tissue=_tissue_texture(rng, swatch, mpp),
        glass=glass,
        glass_f=glass.astype(np.float32) + np.float32(0.5),
        specks=_dust_specks(rng, field, shape, mpp) if dust else (),
        tile_px=tile_px,
        overlay=None if overlay is None else np.pad(overlay, (*pad, (0, 0)), mode="edge").astype(np.float32),
        carbon=None if carbon is None else np.pad(carbon, pad, mode="edge").astype(np.float32),
        specks_alpha=None if carbon is None else carbon_swatch(rng, swatch, mpp),
    )


# ---------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------


def _bilinear(sc: Scene, patch: np.ndarray) -> np.ndarray:
    """Upsample a (k + 2, k + 2) padded-field patch to the (tile_px, tile_px) tile (no BLAS: threads spin)."""
    rows = patch[sc.lo] + sc.frac[:, None] * (patch[sc.lo + 1] - patch[sc.lo])
    return rows[:, sc.lo] + sc.frac[None, :] * (rows[:, sc.lo + 1] - rows[:, sc.lo])


def render_tile(sc: Scene, ty: int, tx: int) -> np.ndarray:
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
    return _overlaid(sc, ty, tx, out)


def _overlaid(sc: Scene, ty: int, tx: int, out: np.ndarray) -> np.ndarray:
    """The tile with carbon specks, then multiplied by the artefacts' factor (bilinear from mask resolution), where
    there are any."""
    k, t = sc.tile_px // MASK_DOWNSAMPLE, sc.tile_px
    rows, cols = slice(ty * k, ty * k + k + 2), slice(tx * k, tx * k + k + 2)
    patch = None if sc.overlay is None else sc.overlay[rows, cols]  # (k + 2, k + 2, 3)
    if patch is not None and patch.min() >= 1.0:
        patch = None
    cover = None  # (t, t) float32 carbon-speck opacity
    if sc.carbon is not None and sc.specks_alpha is not None and sc.carbon[rows, cols].max() > 0.0:
        sy, sx = (ty * t) % sc.specks_alpha.shape[0], (tx * t) % sc.specks_alpha.shape[1]
        cover = _bilinear(sc, np.ascontiguousarray(sc.carbon[rows, cols])) * sc.specks_alpha[sy : sy + t, sx : sx + t]
    if patch is None and cover is None:
        return out
    painted = out.astype(np.float32)
    for c in range(3):
        if cover is not None:
            painted[..., c] *= 1 - cover + cover * CARBON_T[c]
        if patch is not None:
            painted[..., c] *= _bilinear(sc, np.ascontiguousarray(patch[..., c]))
    return np.clip(painted + 0.5, 0, 255).astype(np.uint8)


def _tissue_tile(sc: Scene, ty: int, tx: int) -> np.ndarray | None:
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
