"""Pure patch-grid arithmetic: level choice, candidate patches, tissue fractions and read blocks.

Frames: ``l0_`` is level-0 pixels, ``l_`` is pixels of the level read, ``o_`` is output pixels (the slide
resampled to the target mpp, in which patches are exactly ``patch_size_px`` wide), ``m_`` is tissue-mask pixels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from wsishard.builder.options.patchopts import PatchOptions as PatchOptions
from wsishard.errors import SlideError

LEVEL_SLACK = 0.01  # a level up to 1% coarser than the target still serves it (upsampled by at most 1%)


def choose_level(path: str, slide_mpp: float, level_downsamples: tuple[float, ...], options: PatchOptions) -> int:
    """The pyramid level nearest to, and not coarser than, the target resolution (within ``LEVEL_SLACK``, or
    ``mpp_tolerance`` when larger: a 0.2522 mpp scanner's 4x level serves a 1.0 mpp target).

    Raises:
        SlideError: the target is finer than level 0 and upsampling is not allowed, or allowed but by less than the
            factor needed (``max_upsample``).
    """
    l0_per_o = options.mpp / slide_mpp  # level-0 px per output px
    slack = 1.0 + max(LEVEL_SLACK, options.mpp_tolerance)
    if l0_per_o * options.max_upsample < 1.0:
        raise SlideError(
            path,
            f"target {options.target_mpp:g} mpp would upsample level 0 ({slide_mpp:.4g} mpp) "
            f"{1.0 / l0_per_o:.3g}x, more than --max-upsample {options.max_upsample:g} allows "
            "(is the slide's mpp right?)",
        )
    if l0_per_o * slack < 1.0 and not options.allow_upsample:
        raise SlideError(
            path,
            f"target {options.target_mpp} mpp is finer than level 0 ({slide_mpp:.4g} mpp); use --allow-upsample",
        )
    return max(i for i, d in enumerate(level_downsamples) if d <= l0_per_o * slack or i == 0)


def output_scale(slide_mpp: float, level_downsample: float, options: PatchOptions) -> float:
    """Level-0 px per output px: ``target_mpp / slide_mpp`` exactly, or, within ``mpp_tolerance`` of it, the nearest
    integer multiple of the level's downsample (the level reduced by a whole factor: no fractional resampling).

    The patches' actual mpp is ``slide_mpp * output_scale(...)``.
    """
    exact = options.mpp / slide_mpp
    factor = max(1, round(exact / level_downsample))
    snapped = factor * level_downsample
    return snapped if abs(snapped / exact - 1.0) <= options.mpp_tolerance else exact


@dataclass(frozen=True)
class Candidates:
    """Kept grid cells of one slide. Arrays are (n,) and sorted by (row, col)."""

    col: np.ndarray  # (n,) int64 grid column
    row: np.ndarray  # (n,) int64 grid row
    tissue: np.ndarray  # (n,) float32 tissue fraction
    l0_per_o: float  # level-0 px per output px
    stride: int  # output px between grid cells
    patch: int  # output px per patch side
    total: int  # candidate cells with any tissue before the min_tissue cut
    dropped_artefact: int = 0  # cells with enough tissue dropped for holding more than max_artefact artefacts
    dropped_roi: int = 0  # cells with enough tissue dropped for lying less than min_roi_coverage in the regions
    dropped_class: int = 0  # cells dropped for lying mostly in an annotation class not among the labels
    dropped_low: int = 0  # cells with some tissue, but less than min_tissue
    dropped_cap: int = 0  # cells left out of the seeded subset max_patches_per_slide keeps
    label: np.ndarray | None = None  # (n,) int64 per-patch label (annotation classes), None: the slide's label
    label_names: tuple[str, ...] = ()  # the names of the per-patch labels
    pigment: np.ndarray | None = None  # (n,) float32 fraction of dark pigment kept as tissue, None: not measured

    ARRAYS: ClassVar[tuple[str, ...]] = ("col", "row", "tissue", "label", "label_names", "pigment")  # arrays() gives

    def __len__(self) -> int:
        return int(self.col.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-patch arrays (and the label names) to save; :meth:`from_arrays` reads them back."""
        out = {"col": self.col, "row": self.row, "tissue": self.tissue}
        if self.label is not None:
            out.update(label=self.label, label_names=np.array(self.label_names, dtype=str))
        if self.pigment is not None:
            out["pigment"] = self.pigment
        return out

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], suffix: str = "", **geometry: Any) -> Candidates:
        """The candidates :meth:`arrays` saved (each name followed by ``suffix``), with the scalar fields in
        ``geometry``."""
        got = {name: arrays[name + suffix] for name in cls.ARRAYS if name + suffix in arrays}
        names = tuple(str(n) for n in got["label_names"]) if "label_names" in got else ()
        return cls(
            col=got["col"],
            row=got["row"],
            tissue=got["tissue"],
            label=got.get("label"),
            label_names=names,
            pigment=got.get("pigment"),
            **geometry,
        )

    @property
    def l0_x(self) -> np.ndarray:
        return np.rint(self.col * self.stride * self.l0_per_o).astype(np.int64)

    @property
    def l0_y(self) -> np.ndarray:
        return np.rint(self.row * self.stride * self.l0_per_o).astype(np.int64)

    @property
    def l0_extent(self) -> int:
        return round(self.patch * self.l0_per_o)


def grid_shape(l0_dims: tuple[int, int], l0_per_o: float, patch: int, stride: int) -> tuple[int, int]:
    """(cols, rows) of whole patches that fit in the slide."""
    o_w, o_h = l0_dims[0] / l0_per_o, l0_dims[1] / l0_per_o
    cols = math.floor((o_w - patch) / stride) + 1 if o_w >= patch else 0
    rows = math.floor((o_h - patch) / stride) + 1 if o_h >= patch else 0
    return cols, rows


def tissue_fractions(mask: np.ndarray, m_x0: np.ndarray, m_y0: np.ndarray, m_size: float) -> np.ndarray:
    """Fraction of tissue in squares of side ``m_size`` mask px at float mask coords, via an integral image.

    Args:
        mask: (h, w) bool tissue mask.
        m_x0, m_y0: (n,) float top-left corners in mask px.
    """
    h, w = mask.shape
    if h * w < 2**31 and h and w:  # OpenCV's integral image in int32: exact, a tenth of numpy's two cumsums
        import cv2  # not at import: the CLI starts without OpenCV

        integral = cv2.integral(np.ascontiguousarray(mask, dtype=bool).view(np.uint8), sdepth=cv2.CV_32S)
    else:
        integral = np.zeros((h + 1, w + 1), dtype=np.int64)
        integral[1:, 1:] = np.cumsum(np.cumsum(mask, axis=0, dtype=np.int64), axis=1)
    x0 = np.clip(np.rint(m_x0), 0, w).astype(np.int64)
    y0 = np.clip(np.rint(m_y0), 0, h).astype(np.int64)
    x1 = np.clip(np.maximum(np.rint(m_x0 + m_size), x0 + 1), 0, w).astype(np.int64)
    y1 = np.clip(np.maximum(np.rint(m_y0 + m_size), y0 + 1), 0, h).astype(np.int64)
    inside = integral[y1, x1] - integral[y0, x1] - integral[y1, x0] + integral[y0, x0]
    area = np.maximum((x1 - x0) * (y1 - y0), 1)
    return (inside / area).astype(np.float32)


def _capped(idx: np.ndarray, cap: int | None, seed: int) -> tuple[np.ndarray, int]:
    """``idx``, or its seeded sorted subset of ``cap`` cells; and how many the cap left out."""
    capped = max(0, idx.size - cap) if cap is not None else 0
    if capped:
        idx = np.sort(np.random.default_rng((seed, 0x5A3D)).choice(idx, size=cap, replace=False))
    return idx, capped


def candidates(
    l0_dims: tuple[int, int],
    slide_mpp: float,
    mask: np.ndarray,
    l0_per_m: float,
    options: PatchOptions,
    seed: int = 0,
    *,
    level_downsample: float = 1.0,
    artefact: np.ndarray | None = None,
    roi: np.ndarray | None = None,
    min_roi_coverage: float = 0.5,
    pigment: np.ndarray | None = None,
) -> Candidates:
    """The slide's patches with at least ``min_tissue`` tissue (and the seeded subset if capped).

    Args:
        l0_dims: level-0 (width, height).
        slide_mpp: level-0 microns per px.
        mask: (h, w) bool tissue mask covering the slide.
        l0_per_m: level-0 px per mask px.
        seed: seeds the subset when ``max_patches_per_slide`` caps the count.
        level_downsample: downsample of the level the patches are read from (for ``mpp_tolerance`` snapping).
        artefact: (h, w) bool ink and dark artefacts, the mask's frame: cells more than ``max_artefact`` of them
            are dropped (counted in ``dropped_artefact``).
        roi: (h, w) bool annotated regions, the mask's frame: only tissue inside them counts, and cells less than
            ``min_roi_coverage`` inside them are dropped (those with enough tissue counted in ``dropped_roi``).
        pigment: (h, w) bool dark pigment kept as tissue, the mask's frame: each kept cell's fraction of it is
            recorded (``Candidates.pigment``; None: not recorded).
    """
    l0_per_o = output_scale(slide_mpp, level_downsample, options)
    patch, stride = options.patch_size_px, options.stride
    cols, rows = grid_shape(l0_dims, l0_per_o, patch, stride)
    row, col = np.divmod(np.arange(cols * rows, dtype=np.int64), max(cols, 1))
    m_per_o = l0_per_o / l0_per_m

    def fractions(layer: np.ndarray) -> np.ndarray:
        return tissue_fractions(layer, col * stride * m_per_o, row * stride * m_per_o, patch * m_per_o)

    frac = fractions(mask)
    total = int(np.count_nonzero(frac > 0))
    keep = frac >= options.min_tissue if options.min_tissue > 0 else np.ones_like(frac, dtype=bool)
    low = int(np.count_nonzero((frac > 0) & ~keep))
    dropped = [0, 0]
    if artefact is not None and artefact.any():
        good = fractions(artefact) <= options.max_artefact
        dropped[0] = int(np.count_nonzero(keep & ~good))
        keep &= good
    if roi is not None:  # tissue counts only inside the regions
        frac = fractions(mask & roi)
        good = (frac >= options.min_tissue) & (fractions(roi) >= min_roi_coverage)
        dropped[1] = int(np.count_nonzero(keep & ~good))
        keep &= good
    idx, capped = _capped(np.flatnonzero(keep), options.max_patches_per_slide, seed)
    pig = None
    if pigment is not None:  # only the kept cells are measured
        at = (col[idx] * stride * m_per_o, row[idx] * stride * m_per_o)
        pig = tissue_fractions(pigment, *at, patch * m_per_o) if pigment.any() else np.zeros(idx.size, np.float32)
    return Candidates(
        col=col[idx],
        row=row[idx],
        tissue=frac[idx],
        l0_per_o=l0_per_o,
        stride=stride,
        patch=patch,
        total=total,
        dropped_artefact=dropped[0],
        dropped_roi=dropped[1],
        dropped_low=low,
        dropped_cap=capped,
        pigment=pig,
    )


@dataclass(frozen=True)
class Block:
    """A rectangle of neighbouring patches read as one region.

    Attributes:
        patches: (k,) indices into the slide's :class:`Candidates`.
        o_x, o_y: output-px top-left of the block.
        o_w, o_h: output-px size of the block.
        scale: a multi-mpp build's scale the block is of (its index in the target mpps, ascending); 0 otherwise.
    """

    patches: np.ndarray
    o_x: int
    o_y: int
    o_w: int
    o_h: int
    scale: int = 0


def blocks(cands: Candidates, block_patches: int, scale: int = 0) -> list[Block]:
    """Cut the kept patches into blocks of at most ``block_patches`` x ``block_patches`` grid cells.

    Each block's rectangle is the bounding box of its kept cells, so no more is read than needed.
    Blocks come in strips of two block rows, column by column: (0, 0), (1, 0), (0, 1), (1, 1), ..., then (2, 0),
    (3, 0)... Neighbours then follow each other closely in a shard (the plan keeps each slide's block order), and
    the tiles along their shared edges are mostly decoded once (:class:`~wsishard.slide.tilecache.TileCache`), more
    often than in row-major order.
    """
    if len(cands) == 0:
        return []
    b_row, b_col = cands.row // block_patches, cands.col // block_patches
    order = np.lexsort((cands.col, cands.row, b_row % 2, b_col, b_row // 2))
    keys = b_row[order] * (int(b_col.max()) + 1) + b_col[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    out = []
    for members in np.split(order, starts[1:]):
        c0, c1 = int(cands.col[members].min()), int(cands.col[members].max())
        r0, r1 = int(cands.row[members].min()), int(cands.row[members].max())
        s, p = cands.stride, cands.patch
        o_w, o_h = (c1 - c0) * s + p, (r1 - r0) * s + p
        out.append(Block(patches=members, o_x=c0 * s, o_y=r0 * s, o_w=o_w, o_h=o_h, scale=scale))
    return out


@dataclass(frozen=True)
class ScaleWork:
    """One scale of a multi-mpp build's slide: its target mpp, the level read, the patches' mpp and its grid."""

    mpp: float
    level: int
    patch_mpp: float
    cands: Candidates


def scale_grids(
    path: str,
    options: PatchOptions,
    record: Any,
    level_downsamples: tuple[float, ...],
    first: Candidates,
    grid: Callable[[PatchOptions, float], Candidates],
) -> tuple[ScaleWork, ...]:
    """A multi-mpp build's scales (``()`` for one mpp): the first (finest) from the slide ``record`` (its ``slide_mpp``,
    ``level``, ``patch_mpp``) and ``first``; each other one's level and grid as a build of that mpp alone would choose
    them (``grid``: a scale's candidates on the slide's one tissue mask, given its options and level downsample)."""
    if not options.multi:
        return ()
    mpp0 = float(record.slide_mpp or 0)
    out = [ScaleWork(options.mpps[0], record.level or 0, record.patch_mpp or 0, first)]
    for mpp in options.mpps[1:]:
        one = options.at(mpp)
        level = choose_level(path, mpp0, level_downsamples, one)  # coarser than the first: never refused
        patch_mpp = round(mpp0 * output_scale(mpp0, level_downsamples[level], one), 6)
        out.append(ScaleWork(mpp, level, patch_mpp, grid(one, float(level_downsamples[level]))))
    return tuple(out)
