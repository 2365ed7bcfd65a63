"""Seeded artefacts for synthetic slides: marker ink, black dots, a dark scanner-edge band, air bubbles.

Every artefact is a layer at true-mask resolution: an opacity ``alpha`` (0..1) and a per-channel transmittance
``t`` (its colour over the glass / the glass). The renderer multiplies the slide's pixels by the product of every
layer's ``1 - alpha + alpha * t`` (:attr:`Artefacts.factor`), as a translucent
marker or a dark object on the glass does, so tissue under a light stroke stays visible and tissue under a dense
one is lost. The true artefact mask is ``alpha >= 0.5`` (the artefact dominates the pixel); the slide's true
tissue mask excludes it.

Kinds (:data:`ARTEFACT_KINDS`): ``ink`` (a blue marker circle around the tissue, a green stroke and a black stroke
across it, over glass and tissue), ``dots`` (black marker dots), ``edge`` (a black band along the top and left
edges, as a scanner's margin), ``bubbles`` (air bubbles: dark grey rings). Sizes are in microns, so a slide at
1 mpp (4 mm across at 4096 px) gets strokes two to four 128 um patches wide, as real markers are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi

ARTEFACT_KINDS: tuple[str, ...] = ("ink", "dots", "edge", "bubbles")
INK_KINDS: frozenset[str] = frozenset({"ink"})  # the rest are dark artefacts
GLASS_VALUE = 240.0
# Marker colours as they look over the glass (RGB); their transmittance is colour / glass.
BLUE_INK = (30.0, 95.0, 190.0)
GREEN_INK = (40.0, 140.0, 80.0)
BLACK_INK = (32.0, 32.0, 38.0)
EDGE_BLACK = (14.0, 14.0, 14.0)
BUBBLE_RIM = (70.0, 70.0, 72.0)


@dataclass(frozen=True)
class Artefacts:
    """Artefact layers at true-mask resolution (the tissue field's shape).

    Attributes:
        alpha: (rows, cols) float32 combined opacity 0..1.
        factor: (rows, cols, 3) float32 what the pixels are multiplied by, 0..1 (1 where there is nothing).
        kind: (rows, cols) uint8: 0 nothing, 1 ink, 2 dark artefact (where ``alpha >= 0.5``).
    """

    alpha: np.ndarray
    factor: np.ndarray
    kind: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        """(rows, cols) bool: the artefact dominates the pixel."""
        return self.alpha >= 0.5


def _check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    bad = [k for k in kinds if k not in ARTEFACT_KINDS]
    if bad:
        raise ValueError(f"invalid artefacts: {bad!r} (kinds: {', '.join(ARTEFACT_KINDS)})")
    return tuple(kinds)


def make_artefacts(rng: np.random.Generator, field: np.ndarray, px_um: float, kinds: Sequence[str]) -> Artefacts:
    """Artefact layers over the tissue ``field`` (mask px, > 0 inside tissue) at ``px_um`` microns per mask px.

    Raises:
        ValueError: an unknown kind.
    """
    kinds = _check_kinds(kinds)
    shape = field.shape
    layers = _Layers(shape)
    tissue = field > 0
    if "edge" in kinds:
        _edge_band(rng, layers, px_um)
    if "ink" in kinds:
        _marker_circle(rng, layers, tissue, px_um)
        for color in (GREEN_INK, BLACK_INK):
            _crossing_stroke(rng, layers, tissue, px_um, color)
    if "dots" in kinds:
        _dots(rng, layers, px_um)
    if "bubbles" in kinds:
        _bubbles(rng, layers, px_um)
    return layers.done()


class _Layers:
    """Layers being painted: each new artefact is composited over the ones below (ink over ink darkens)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.factor = np.ones((*shape, 3), dtype=np.float32)  # what the pixels get multiplied by
        self.alpha = np.zeros(shape, dtype=np.float32)
        self.kind = np.zeros(shape, dtype=np.uint8)

    def paint(self, alpha: np.ndarray, color: tuple[float, float, float], kind: int) -> None:
        trans = np.array(color, dtype=np.float32) / GLASS_VALUE
        self.factor *= 1 - alpha[..., None] + alpha[..., None] * trans
        self.kind[(alpha >= 0.5) & (alpha >= self.alpha)] = kind
        self.alpha = 1 - (1 - self.alpha) * (1 - alpha)

    def done(self) -> Artefacts:
        alpha = np.clip(self.alpha, 0.0, 1.0).astype(np.float32)
        kind = np.where(alpha >= 0.5, self.kind, 0).astype(np.uint8)
        return Artefacts(alpha, np.clip(self.factor, 0.0, 1.0).astype(np.float32), kind)


def _soft(distance_out: np.ndarray, density: float) -> np.ndarray:
    """Opacity from a signed distance (mask px, > 0 outside): ``density`` inside, a one-px soft edge."""
    return (np.clip(0.5 - distance_out, 0.0, 1.0) * density).astype(np.float32)


def _line_distance(shape: tuple[int, ...], points: np.ndarray) -> np.ndarray:
    """Distance (mask px) of every pixel from a polyline sampled densely at ``points`` (n, 2) (row, col)."""
    line = np.ones(shape, dtype=bool)
    pts = np.rint(points).astype(np.int64)
    ok = (pts >= 0).all(axis=1) & (pts[:, 0] < shape[0]) & (pts[:, 1] < shape[1])
    line[pts[ok, 0], pts[ok, 1]] = False
    if line.all():
        return np.full(shape, np.inf, dtype=np.float32)
    return ndi.distance_transform_edt(line).astype(np.float32)


def _stroke_width(rng: np.random.Generator, px_um: float) -> float:
    return float(rng.uniform(250.0, 450.0)) / px_um  # mask px


def _marker_circle(rng: np.random.Generator, layers: _Layers, tissue: np.ndarray, px_um: float) -> None:
    """A blue ring around the tissue (partly over it where the tissue reaches out), as pathologists circle a lesion."""
    rows, cols = tissue.shape
    found = np.argwhere(tissue)
    cy, cx = found.mean(axis=0) if len(found) else (rows / 2, cols / 2)
    ry = (found[:, 0].max() - found[:, 0].min()) / 2 * 0.95 if len(found) else rows / 3
    rx = (found[:, 1].max() - found[:, 1].min()) / 2 * 0.95 if len(found) else cols / 3
    ry, rx = min(max(ry, rows / 6), rows / 2.2), min(max(rx, cols / 6), cols / 2.2)
    t = np.linspace(0, 2 * np.pi * rng.uniform(0.8, 0.95), 4000) + rng.uniform(0, 2 * np.pi)
    wobble = 1 + 0.05 * np.sin(3 * t + rng.uniform(0, 6.3))
    pts = np.stack([cy + ry * wobble * np.sin(t), cx + rx * wobble * np.cos(t)], axis=1)
    width = _stroke_width(rng, px_um)
    layers.paint(_soft(_line_distance(tissue.shape, pts) - width / 2, rng.uniform(0.85, 0.95)), BLUE_INK, 1)


def _crossing_stroke(
    rng: np.random.Generator, layers: _Layers, tissue: np.ndarray, px_um: float, color: tuple[float, float, float]
) -> None:
    """A gently curved stroke through a tissue point, from glass to glass (over the tissue on its way)."""
    rows, cols = tissue.shape
    found = np.argwhere(tissue)
    through = found[rng.integers(len(found))] if len(found) else np.array([rows / 2, cols / 2])
    angle = rng.uniform(0, np.pi)
    direction = np.array([math.sin(angle), math.cos(angle)])
    length = rng.uniform(0.35, 0.6) * max(rows, cols)
    p0, p1 = through - direction * length / 2, through + direction * length / 2
    bend = np.array([-direction[1], direction[0]]) * rng.uniform(-0.15, 0.15) * length
    t = np.linspace(0.0, 1.0, 4000)[:, None]
    pts = (1 - t) ** 2 * p0 + 2 * t * (1 - t) * (through + bend) + t**2 * p1
    width = _stroke_width(rng, px_um) * 0.8
    layers.paint(_soft(_line_distance(tissue.shape, pts) - width / 2, rng.uniform(0.85, 0.95)), color, 1)


def _dots(rng: np.random.Generator, layers: _Layers, px_um: float) -> None:
    """Three to six black marker dots 120-300 um across, anywhere (over glass or tissue)."""
    rows, cols = layers.alpha.shape
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float32)
    for _ in range(int(rng.integers(3, 7))):
        r = rng.uniform(60.0, 150.0) / px_um
        cy, cx = rng.uniform(0.1, 0.9) * rows, rng.uniform(0.1, 0.9) * cols
        layers.paint(_soft(np.hypot(yy - cy, xx - cx) - r, 0.97), BLACK_INK, 2)


def _edge_band(rng: np.random.Generator, layers: _Layers, px_um: float) -> None:
    """A black band along the top and the left edges (a scanner's margin), 4-8% of the side wide."""
    rows, cols = layers.alpha.shape
    top, left = rng.uniform(0.04, 0.08) * rows, rng.uniform(0.03, 0.06) * cols
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float32)
    distance_out = np.minimum(yy + 0.5 - top, xx + 0.5 - left)
    layers.paint(_soft(distance_out, 1.0), EDGE_BLACK, 2)


def _bubbles(rng: np.random.Generator, layers: _Layers, px_um: float) -> None:
    """One or two air bubbles: dark grey rims 20-35 um thick, 150-400 um in radius."""
    rows, cols = layers.alpha.shape
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float32)
    for _ in range(int(rng.integers(1, 3))):
        r = rng.uniform(150.0, 400.0) / px_um
        rim = max(rng.uniform(20.0, 35.0) / px_um, 1.0)
        cy, cx = rng.uniform(0.2, 0.8) * rows, rng.uniform(0.2, 0.8) * cols
        layers.paint(_soft(np.abs(np.hypot(yy - cy, xx - cx) - r) - rim / 2, 0.9), BUBBLE_RIM, 2)


def patch_fractions(
    mask: np.ndarray, mask_downsample: float, l0_x: np.ndarray, l0_y: np.ndarray, l0_extent: int
) -> np.ndarray:
    """(n,) float: the fraction of each level-0 square ``[x, x + extent) x [y, y + extent)`` that is True in a
    true mask at ``mask_downsample`` level-0 px per mask px (outside the mask counts as False)."""
    out = np.zeros(len(l0_x), dtype=np.float64)
    side = max(1, round(l0_extent / mask_downsample))
    for i, (x, y) in enumerate(zip(l0_x.tolist(), l0_y.tolist(), strict=True)):
        mx, my = round(x / mask_downsample), round(y / mask_downsample)
        out[i] = float(mask[my : my + side, mx : mx + side].sum()) / (side * side)
    return out
