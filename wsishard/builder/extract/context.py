"""Context patches: with each sample, a patch centred on the same point at each ``--context-mpp``.

A context patch is made as a main patch is (:mod:`wsishard.builder.extract.patches`): the pyramid level chosen for its
mpp as :func:`~wsishard.builder.scan.grid.choose_level` chooses one, stage 1 (an integer reduction, DCT-scaled where the
reader can) over one region per block and scale, then stage 2, OpenCV's bicubic resample at exactly the rest of the
scale. Its corner is not moved to a reduced pixel: it is where the main patch's centre puts it, in floating point,
so the two centres agree exactly. What lies off the slide is white (glass); the fraction of the field that does is
recorded as ``padded``.

Frames: ``l0_`` is level-0 px, ``l_`` is px of the level read, ``c_`` is context px (the slide at the context mpp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wsishard.builder.extract.resample import REST_SLACK, Reduced, ceil_to, encode_image, floor_to, reduced_read
from wsishard.builder.options.patchopts import ContextOptions as ContextOptions
from wsishard.builder.scan.grid import Block, Candidates, PatchOptions, choose_level
from wsishard.errors import SlideError
from wsishard.format import ContextMeta, context_ext
from wsishard.slide import SlideReader
from wsishard.slide.reader import BACKGROUND

if TYPE_CHECKING:  # patches.py builds on this module
    from wsishard.builder.extract.patches import SlideWork


def padded_fraction(l0_x: float, l0_y: float, l0_side: float, l0_dims: tuple[int, int]) -> float:
    """The fraction of the square ``[l0_x, l0_x + l0_side) x [l0_y, l0_y + l0_side)`` (level-0 px) that lies off a
    slide of level-0 size ``l0_dims`` (width, height), rounded to 4 decimals as the quality scores are."""
    inside_w = max(0.0, min(l0_x + l0_side, l0_dims[0]) - max(l0_x, 0.0))
    inside_h = max(0.0, min(l0_y + l0_side, l0_dims[1]) - max(l0_y, 0.0))
    return max(0.0, round(1.0 - inside_w * inside_h / (l0_side * l0_side), 4))  # never -0.0


def context_field(l0_cx: float, l0_cy: float, mpp: float, size_px: int, slide_mpp: float) -> tuple[float, float, float]:
    """``(l0_x, l0_y, l0_side)``: the level-0 square a ``size_px`` context patch at ``mpp`` covers, centred on
    level-0 ``(l0_cx, l0_cy)`` of a slide whose level 0 is ``slide_mpp`` microns per px."""
    side = size_px * mpp / slide_mpp
    return l0_cx - side / 2, l0_cy - side / 2, side


def context_footprints(
    cands: Candidates, options: ContextOptions | None, slide_mpp: float
) -> list[tuple[float, float, float]]:
    """The level-0 squares ``(x, y, side)`` of one sample's context fields (the kept patch in the middle of the
    list), for the QC picture; empty without context or kept patches."""
    if options is None or len(cands) == 0:
        return []
    i = len(cands) // 2
    half = cands.l0_extent / 2
    centre = float(cands.l0_x[i]) + half, float(cands.l0_y[i]) + half
    return [context_field(*centre, mpp, options.size_px, slide_mpp) for mpp in options.mpps]


def context_legend(options: ContextOptions | None) -> list[str]:
    """The QC legend's line for :func:`context_footprints` (none without context)."""
    return [] if options is None else [f"context of one sample (red): {', '.join(f'{m:g}' for m in options.mpps)} mpp"]


@dataclass(frozen=True)
class _Scale:
    """One context mpp's stage-1 region for a block."""

    reduced: Reduced  # snap=False: stage 2 starts at the exact corner (floats pass through its cut)
    l0_per_c: float  # level-0 px per context px


class BlockContext:
    """The context patches of one block's samples. Each scale's region is read once, when the first sample that is
    kept needs it (a block whose patches are all filtered out reads nothing)."""

    def __init__(
        self,
        reader: SlideReader,
        work: SlideWork,
        block: Block,
        options: ContextOptions,
        image_format: str,
        quality: int,
    ) -> None:
        self.reader, self.work, self.block, self.options = reader, work, block, options
        self.image_format, self.quality = image_format, quality
        self.slide_mpp = work.patch_mpp / work.cands.l0_per_o  # the slide's level-0 mpp
        self._scales: dict[int, _Scale] = {}

    def sample(self, l0_x: float, l0_y: float) -> tuple[dict[str, bytes], list[ContextMeta]]:
        """The context members (``ctx<i>.<format>``) and ``.json`` entries of the main patch whose pixels start at
        level-0 ``(l0_x, l0_y)`` (floating point: the corner as stage 1 placed it)."""
        half = self.work.cands.patch * self.work.cands.l0_per_o / 2
        members: dict[str, bytes] = {}
        metas: list[ContextMeta] = []
        for i, mpp in enumerate(self.options.mpps):
            x, y, side = context_field(l0_x + half, l0_y + half, mpp, self.options.size_px, self.slide_mpp)
            pixels = self._cut(i, x, y)  # (size, size, 3) uint8
            members[context_ext(i, self.image_format)] = encode_image(pixels, self.image_format, self.quality)
            padded = padded_fraction(x, y, side, self.reader.level_dimensions[0])
            metas.append({"mpp": mpp, "x": round(x), "y": round(y), "size": self.options.size_px, "padded": padded})
        return members, metas

    def _cut(self, i: int, l0_x: float, l0_y: float) -> np.ndarray:
        """Stage 2 of scale ``i`` from level-0 corner ``(l0_x, l0_y)``, pixels whose centres lie off the slide
        white."""
        if i not in self._scales:
            self._scales[i] = self._read(self.options.mpps[i])
        scale, size = self._scales[i], self.options.size_px
        pixels, _, _ = scale.reduced.cut(l0_x / scale.l0_per_c, l0_y / scale.l0_per_c, size, size)  # type: ignore[arg-type]
        pixels = np.ascontiguousarray(pixels)  # (size, size, 3) uint8
        l0_w, l0_h = self.reader.level_dimensions[0]
        centres = (np.arange(size) + 0.5) * scale.l0_per_c
        pixels[:, ((l0_x + centres) < 0) | ((l0_x + centres) >= l0_w)] = BACKGROUND
        pixels[((l0_y + centres) < 0) | ((l0_y + centres) >= l0_h)] = BACKGROUND
        return pixels

    def _read(self, mpp: float) -> _Scale:
        """Stage 1 for context ``mpp``: the region every kept patch of the block reaches at that mpp, reduced."""
        work, cands, size = self.work, self.work.cands, self.options.size_px
        upsample = PatchOptions(
            target_mpp=mpp, allow_upsample=self.options.allow_upsample, max_upsample=self.options.max_upsample
        )
        try:
            level = choose_level(work.path, self.slide_mpp, self.reader.level_downsamples, upsample)
        except SlideError as exc:  # a context mpp finer than level 0: name it, the target is not the patches'
            raise SlideError(work.path, f"context {exc.reason}") from exc
        down = self.reader.level_downsamples[level]
        l0_per_c = mpp / self.slide_mpp
        scale = l0_per_c / down  # level px per context px
        k = max(1, math.floor(scale * (1 + REST_SLACK) + 1e-9))
        reach = (math.ceil(max(scale / k, 1.0)) + 4) * k  # level px: stage 2's crop margin and filter
        slack = 2 * cands.l0_per_o  # level-0 px the main patch's corner may have moved
        half, side = cands.patch * cands.l0_per_o / 2, size * l0_per_c
        rects = []
        for col, row in zip(
            cands.col[self.block.patches].tolist(), cands.row[self.block.patches].tolist(), strict=True
        ):
            x = col * cands.stride * cands.l0_per_o + half - side / 2
            y = row * cands.stride * cands.l0_per_o + half - side / 2
            lo_x, lo_y = math.floor((x - slack) / down) - reach, math.floor((y - slack) / down) - reach
            hi_x, hi_y = math.ceil((x + side + slack) / down) + reach, math.ceil((y + side + slack) / down) + reach
            rects.append((lo_x, lo_y, hi_x, hi_y))
        x0, y0 = floor_to(min(r[0] for r in rects), k), floor_to(min(r[1] for r in rects), k)
        x1, y1 = ceil_to(max(r[2] for r in rects), k), ceil_to(max(r[3] for r in rects), k)
        image = _read_on_slide(self.reader, level, (x0, y0, x1, y1), k, rects)  # ((y1-y0)/k, (x1-x0)/k, 3)
        return _Scale(Reduced(image, x0, y0, k, scale, snap=False), l0_per_c)


_CHUNK_PX = 2048  # level px a side of one stage-1 read, at least (k-aligned; one k x k block if k is larger)


def _read_on_slide(
    reader: SlideReader, level: int, box: tuple[int, int, int, int], k: int, needed: list[tuple[int, int, int, int]]
) -> np.ndarray:
    """Stage 1 of the level-px ``box`` (x0, y0, x1, y1; multiples of ``k``) reduced ``k`` times: only the part on
    the slide is read, in k-aligned chunks of about :data:`_CHUNK_PX` a side; the rest is glass white, as a read
    off the slide gives. Each reduced px is the mean of its own k x k block as in one read of the whole box, and
    memory is the reduced box plus one chunk, whatever the field's size (``--context-mpp 999`` on a small slide)."""
    x0, y0, x1, y1 = box
    out = np.full(((y1 - y0) // k, (x1 - x0) // k, 3), BACKGROUND, dtype=np.uint8)  # (h / k, w / k, 3)
    l_w, l_h = reader.level_dimensions[level]
    sx0, sy0 = max(x0, 0), max(y0, 0)  # 0 is a multiple of k: chunks stay aligned with the box's blocks
    sx1, sy1 = min(x1, ceil_to(l_w, k)), min(y1, ceil_to(l_h, k))
    step = k * max(1, _CHUNK_PX // k)
    for cy in range(sy0, sy1, step):
        for cx in range(sx0, sx1, step):
            w, h = min(step, sx1 - cx), min(step, sy1 - cy)
            part = reduced_read(reader, level, (cx, cy, w, h), k, needed)  # (h / k, w / k, 3)
            oy, ox = (cy - y0) // k, (cx - x0) // k
            out[oy : oy + h // k, ox : ox + w // k] = part
    return out
