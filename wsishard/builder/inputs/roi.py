"""Annotation regions (``--roi``): GeoJSON polygons per slide, rasterized at the tissue mask's resolution.

A slide's annotations come from a GeoJSON file matched by the slide's name (``<stem>.geojson``, ``<stem>.json``,
``<file name>.geojson``) in the ``--roi`` folder, or the ``--roi`` file itself when its name matches (or when the
build has a single slide). What QuPath and most viewers export is read: a FeatureCollection, a list of Features, a
Feature, or a bare geometry; Polygon and MultiPolygon (holes included; a GeometryCollection's polygons too) with
coordinates in level-0 pixels; the class name from ``properties.classification.name`` (QuPath), or
``properties.classification`` / ``classification_name`` / ``class`` / ``label`` when that is a string. Points and
lines are not regions and are passed over. A file that is not JSON, holds no polygon or a malformed one is the
slide's failure with that reason (:class:`~wsishard.errors.SlideError`); the build goes on.

Patches are kept where at least ``min_roi_coverage`` of them is annotated; tissue outside the regions does not
count towards ``min_tissue``. Regions of a class named in ``exclude`` are cut out of the others. With ``labels`` a
patch's label is the listed class covering most of it (its index in ``labels``), written as ``.cls`` with its name
in the ``.json``; patches mostly of an unlisted class are left out.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from wsishard.builder.options.tissueopts import MISSING_POLICIES as MISSING_POLICIES
from wsishard.builder.options.tissueopts import RoiOptions as RoiOptions
from wsishard.builder.options.tissueopts import parse_names as parse_names
from wsishard.builder.scan.grid import Candidates, tissue_fractions
from wsishard.errors import OptionError, SlideError

logger = logging.getLogger(__name__)

ROI_SUFFIXES = (".geojson", ".json")
MAX_ROI_BYTES = 256 << 20  # an annotation file is parsed whole, in every worker that scans its slide
Ring = np.ndarray  # (n, 2) float64 level-0 (x, y)


def match_annotations(roi_path: str | None, slides: Sequence[str]) -> list[str | None]:
    """Each slide's annotation file, or None where there is none.

    A single file given for a single slide is that slide's whatever its name (with a warning when the name is not
    the slide's).

    Raises:
        OptionError: ``roi_path`` does not exist.
    """
    if roi_path is None:
        return [None] * len(slides)
    if os.path.isfile(roi_path):
        base = os.path.basename(roi_path)
        found = [roi_path if base in _names(s) else None for s in slides]
        if len(slides) == 1 and found[0] is None:  # applied all the same: one slide, one file
            logger.warning(
                "--roi %s is applied to %s though its name is not that slide's (%s expected): check it is the "
                "slide's annotation file",
                roi_path,
                os.path.basename(slides[0].rstrip("/")),
                _names(slides[0])[0],
            )
        return [roi_path] if len(slides) == 1 else found
    if not os.path.isdir(roi_path):
        raise OptionError(f"--roi: no such file or folder: {roi_path}")
    present = set(os.listdir(roi_path))
    return [next((os.path.join(roi_path, n) for n in _names(s) if n in present), None) for s in slides]


def _names(slide: str) -> list[str]:
    """File names an annotation file of ``slide`` may have."""
    base = slide.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]
    stem = base.rsplit(".", 1)[0] if "." in base else base
    return [stem + s for s in ROI_SUFFIXES] + [base + s for s in ROI_SUFFIXES]


@dataclass(frozen=True)
class Region:
    """One annotated polygon: its rings in level-0 px (the first the outline, the rest holes) and its class."""

    rings: tuple[Ring, ...]
    name: str


def load_regions(path: str) -> list[Region]:
    """The polygons of a GeoJSON annotation file.

    Raises:
        SlideError: (on ``path``) it cannot be read, is over :data:`MAX_ROI_BYTES`, is not JSON, holds a malformed
            geometry or no polygon at all.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_ROI_BYTES:  # json.loads holds the text and every object of it: twice the file and more
                raise SlideError(
                    path,
                    f"annotation file is {size:,} bytes, over the {MAX_ROI_BYTES:,} an annotation file may have (it "
                    "is read whole): export only the regions, or simplify them",
                )
            data = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise SlideError(path, f"annotation file unreadable or not JSON ({type(exc).__name__}: {exc})") from exc
    regions: list[Region] = []
    try:
        for geometry, name in _features(data):
            regions += [Region(rings, name) for rings in _polygons(geometry)]
    except (TypeError, ValueError, KeyError) as exc:
        raise SlideError(path, f"malformed annotation GeoJSON ({exc})") from exc
    if not regions:
        raise SlideError(path, "annotation GeoJSON holds no Polygon or MultiPolygon")
    return regions


def _features(data: Any) -> list[tuple[Any, str]]:
    """(geometry, class name) of every feature in a FeatureCollection, a list of Features, a Feature or a geometry."""
    if isinstance(data, list):
        return [pair for item in data for pair in _features(item)]
    if not isinstance(data, dict):
        raise ValueError(f"expected a GeoJSON object, got {type(data).__name__}")
    kind = data.get("type")
    if kind == "FeatureCollection":
        return _features(data.get("features"))
    if kind == "Feature":
        return [(data.get("geometry"), _class_name(data.get("properties")))]
    return [(data, "")]


def _class_name(props: Any) -> str:
    if not isinstance(props, dict):
        return ""
    cls = props.get("classification")
    if isinstance(cls, dict) and isinstance(cls.get("name"), str):
        return str(cls["name"])
    for key in ("classification", "classification_name", "class", "label"):
        if isinstance(props.get(key), str):
            return str(props[key])
    return ""


def _polygons(geometry: Any) -> list[tuple[Ring, ...]]:
    """The polygons of a geometry, each as its rings; points and lines give none."""
    if geometry is None:
        return []
    if not isinstance(geometry, dict):
        raise ValueError(f"a geometry is {type(geometry).__name__}, not an object")
    kind = geometry.get("type")
    if kind == "Polygon":
        return [_rings(geometry["coordinates"])]
    if kind == "MultiPolygon":
        return [_rings(p) for p in geometry["coordinates"]]
    if kind == "GeometryCollection":
        return [p for g in geometry["geometries"] for p in _polygons(g)]
    if kind in ("Point", "MultiPoint", "LineString", "MultiLineString"):
        return []
    raise ValueError(f"unknown geometry type {kind!r}")


def _rings(coords: Any) -> tuple[Ring, ...]:
    if not isinstance(coords, list) or not coords:
        raise ValueError("a Polygon needs a list of rings")
    rings = []
    for ring in coords:
        arr = np.asarray(ring, dtype=np.float64)  # ValueError/TypeError on ragged or non-numeric input
        if arr.ndim != 2 or arr.shape[0] < 3 or arr.shape[1] < 2 or not np.isfinite(arr[:, :2]).all():
            raise ValueError(f"a ring must be 3 or more finite [x, y] points, got shape {arr.shape}")
        rings.append(arr[:, :2])
    return tuple(rings)


@dataclass(frozen=True)
class SlideRoi:
    """A slide's regions rasterized on the tissue mask's grid ((h, w) bool each)."""

    mask: np.ndarray  # where patches may come from
    classes: dict[str, np.ndarray]  # class name -> its regions (excluded classes left out), for labels


def rasterize(regions: list[Region], shape: tuple[int, int], l0_per_m: float, exclude: Sequence[str] = ()) -> SlideRoi:
    """Regions as masks on a grid of ``shape`` (h, w) at ``l0_per_m`` level-0 px per px (parts outside are cut).

    Regions of an ``exclude`` class are removed from the others; when every region is excluded, the rest of the
    slide is the region.
    """
    classes: dict[str, np.ndarray] = {}
    for region in regions:
        layer = classes.setdefault(region.name, np.zeros(shape, dtype=bool))
        layer |= _fill(region.rings, shape, l0_per_m)
    removed = np.zeros(shape, dtype=bool)
    kept = np.zeros(shape, dtype=bool)
    for name, layer in classes.items():
        if name in exclude:
            removed |= layer
        else:
            kept |= layer
    if not any(name not in exclude for name in classes):
        kept[...] = True
    return SlideRoi(kept & ~removed, {n: m for n, m in classes.items() if n not in exclude})


_FAR_PX = 1e15  # vertices past this many level-0 px are moved to it (see _fill)
_CHUNK = 1 << 22  # (edge, row) crossings worked out at a time: memory bounded whatever the vertex count


def _fill(rings: tuple[Ring, ...], shape: tuple[int, int], l0_per_m: float) -> np.ndarray:
    """One polygon with its holes (even-odd: each hole empties); a mask px is inside when its centre is.

    A scanline fill: each edge's crossings with the rows of px centres it spans toggle the parity of every px to
    their right, so the work grows with the vertices plus the px, not with their product (scikit-image's
    ``polygon`` tests every px of the bounding box against every edge: 10 s for 10,000 vertices on 500 x 500).
    Vertices beyond +/-1e15 level-0 px (a region "covering everything" at +/-1e300) are moved to that bound: an
    axis-aligned edge stays exactly where it was, any other moves by less than (slide size)**2 / 1e15 px over the slide.
    """
    h, w = shape
    parity = np.zeros(h * (w + 1), dtype=np.int64)  # (h, w + 1) crossings, flat, toggled at the first px right of them
    for ring in rings:
        pts = np.clip(ring, -_FAR_PX, _FAR_PX) / l0_per_m - 0.5  # (n, 2) grid (x, y): px centres at integers
        x0, y0 = pts[:, 0], pts[:, 1]
        x1, y1 = np.roll(x0, -1), np.roll(y0, -1)  # each vertex to the next, the last back to the first
        lo = np.clip(np.ceil(np.minimum(y0, y1)), 0, h)  # rows r with min(y) <= r < max(y): none for a flat edge
        count = (np.clip(np.ceil(np.maximum(y0, y1)), 0, h) - lo).astype(np.int64)
        ends = np.cumsum(count)
        start = 0
        while start < len(count):  # edges in runs of at most _CHUNK crossings (one edge may exceed it alone)
            stop = max(int(np.searchsorted(ends, ends[start] - count[start] + _CHUNK, side="right")), start + 1)
            parity += _crossings(x0, y0, x1, y1, lo, count, slice(start, stop), shape)
            start = stop
    return (np.cumsum(parity.reshape(h, w + 1), axis=1)[:, :w] % 2).astype(bool)


def _crossings(
    x0: np.ndarray,
    y0: np.ndarray,
    x1: np.ndarray,
    y1: np.ndarray,
    lo: np.ndarray,
    count: np.ndarray,
    part: slice,
    shape: tuple[int, int],
) -> np.ndarray:
    """Crossings of the edges ``part`` with the px-centre rows, counted per (row, first column right of them)."""
    h, w = shape
    n = count[part]
    edge = np.repeat(np.arange(part.start, part.start + len(n)), n)  # (crossings,)
    row = lo[edge] + np.arange(len(edge)) - np.repeat(np.cumsum(n) - n, n)
    x = x0[edge] + (row - y0[edge]) * ((x1[edge] - x0[edge]) / (y1[edge] - y0[edge]))
    col = np.clip(np.ceil(x), 0, w).astype(np.int64)
    return np.bincount(row.astype(np.int64) * (w + 1) + col, minlength=h * (w + 1))


def patch_labels(classes: dict[str, np.ndarray], names: Sequence[str], fractions: Any) -> np.ndarray:
    """(n,) int64: the index in ``names`` of the class covering most of each patch (-1: mostly an unlisted class,
    or none). ``fractions(mask)`` gives the patches' (n,) coverage of a mask."""
    cover = [np.asarray(fractions(classes[n])) if n in classes else None for n in names]
    others = [np.asarray(fractions(m)) for n, m in classes.items() if n not in names]
    n = next((len(c) for c in cover + others if c is not None), 0)
    best = np.full(n, -1, dtype=np.int64)
    top = np.zeros(n)
    for i, c in enumerate(cover):
        if c is not None:
            better = c > top
            best[better], top[better] = i, c[better]
    for c in others:
        best[c > top] = -1
        top = np.maximum(top, c)
    return best


def roi_status(options: RoiOptions, roi_file: str | None) -> str:
    """What the slide record says of a slide's regions: ``""`` (no ``--roi``), ``annotated: <file name>``,
    ``missing: skipped`` or ``missing: built whole``."""
    if options.path is None:
        return ""
    if roi_file is not None:
        return f"annotated: {os.path.basename(roi_file)}"
    return "missing: skipped" if options.missing == "skip" else "missing: built whole"


def slide_roi(options: RoiOptions, roi_file: str | None, shape: tuple[int, ...], l0_per_m: float) -> SlideRoi | None:
    """The slide's regions on the tissue mask's grid (``shape`` (h, w), ``l0_per_m`` level-0 px per px), or None
    when it has no annotation file.

    Raises:
        SlideError: the annotation file is unreadable, malformed or holds no polygon.
    """
    if roi_file is None:
        return None
    return rasterize(load_regions(roi_file), (int(shape[0]), int(shape[1])), l0_per_m, options.exclude)


def label_patches(cands: Candidates, roi: SlideRoi, names: Sequence[str], l0_per_m: float) -> Candidates:
    """``cands`` with per-patch labels (the listed class covering most of each patch); patches mostly of an
    unlisted class (or of none) are dropped and counted in ``dropped_class``."""
    m_per_o = cands.l0_per_o / l0_per_m
    o_x, o_y = cands.col * cands.stride, cands.row * cands.stride

    def fractions(mask: np.ndarray) -> np.ndarray:
        return tissue_fractions(mask, o_x * m_per_o, o_y * m_per_o, cands.patch * m_per_o)

    labels = patch_labels(roi.classes, names, fractions)
    keep = labels >= 0
    return replace(
        cands,
        col=cands.col[keep],
        row=cands.row[keep],
        tissue=cands.tissue[keep],
        label=labels[keep],
        label_names=tuple(names),
        dropped_class=int(np.count_nonzero(~keep)),
        pigment=None if cands.pigment is None else cands.pigment[keep],
    )
