"""The seeded tissue outline of a synthetic slide: a signed field at true-mask resolution.

The field is in mask pixels, positive inside tissue: tissue islands with irregular borders, a few round holes
well inside them and thin strands joining or trailing from them, shifted so the tissue covers the requested
fraction of the slide. The true mask is ``field > 0``. Every random choice comes from the caller's generator.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage as ndi


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], spacing_px: float) -> np.ndarray:
    """Zero-mean, unit-std smooth noise with blobs about ``spacing_px`` apart (wraps around; float32)."""
    sigma = max(float(spacing_px), 1.0) / 3
    return normalized(blur_wrap(rng.standard_normal(shape, dtype=np.float32), (sigma, sigma)))


def normalized(x: np.ndarray) -> np.ndarray:
    """``x`` shifted and scaled to zero mean and unit standard deviation."""
    return (x - x.mean()) / max(float(x.std()), 1e-6)


def blur_wrap(img: np.ndarray, sigma_yx: tuple[float, float]) -> np.ndarray:
    """Gaussian blur of a 2-D image with wrap-around borders (FFT), sigmas in px; float32."""
    h, w = img.shape
    spec = np.fft.rfft2(img.astype(np.float32, copy=False))
    spec *= np.exp(-2 * np.pi**2 * (sigma_yx[0] * np.fft.fftfreq(h)) ** 2).astype(np.float32)[:, None]
    spec *= np.exp(-2 * np.pi**2 * (sigma_yx[1] * np.fft.rfftfreq(w)) ** 2).astype(np.float32)[None, :]
    return np.fft.irfft2(spec, s=(h, w)).astype(np.float32, copy=False)


def tissue_field(rng: np.random.Generator, shape: tuple[int, int], px_um: float, fraction: float) -> np.ndarray:
    """Signed field (mask px, > 0 inside tissue) with islands, holes and strands covering ``fraction``."""
    if fraction <= 0:
        return np.full(shape, -8.0, dtype=np.float32)
    size = max(shape)
    base = smooth_noise(rng, shape, size / 3) + 0.5 * smooth_noise(rng, shape, size / 8)
    base += 0.3 * smooth_noise(rng, shape, 80.0 / px_um)  # ragged borders, ~80 um
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
        p0 = pick(rng, _deepest(labels == a, depth, 2.0))
        p1 = pick(rng, _deepest(labels == b, depth, 2.0))
        _draw_strand(rng, strands, p0, p1, rng.uniform(30.0, 70.0) / px_um)
    for _ in range(int(rng.integers(1, 3))):  # trailing strands
        lab = int(rng.integers(n)) + 1
        p0 = pick(rng, (labels == lab) & (depth <= 1.5))
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


def pick(rng: np.random.Generator, where: np.ndarray) -> np.ndarray:
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
