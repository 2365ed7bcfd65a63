"""A block's patches: read the block's region once, resample it to the target mpp, cut and encode the patches.

Scan (to measure encoded bytes), extraction and staging all go through :func:`block_samples`, with the slide's
:class:`SlideWork` and the build's :class:`EncodeOptions`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from wsishard.builder.extract.context import BlockContext
from wsishard.builder.extract.quality import quality_scores
from wsishard.builder.extract.resample import REST_SLACK, Reduced, ceil_to, encode_image, floor_to, reduced_read
from wsishard.builder.options.patchopts import EncodeOptions as EncodeOptions
from wsishard.builder.scan.grid import Block, Candidates, ScaleWork
from wsishard.format import PatchMeta, sample_key
from wsishard.slide.reader import SlideReader
from wsishard.storage.urls import public_location

Samples = list[tuple[str, dict[str, bytes]]]  # (key, {ext: encoded bytes}) per sample, in write order


@dataclass(frozen=True)
class SlideWork:
    """What reading a scanned slide's patches needs: where it is, its id and label, the level and the grid; in a
    multi-mpp build, every scale's (``scales``, the blocks' ``scale`` indexing them: :meth:`at`)."""

    path: str  # a local file (a URL slide's local copy while it is read)
    slide_id: str
    level: int
    patch_mpp: float  # microns per pixel of the written patches (recorded in each sample's .json)
    cands: Candidates
    blocks: list[Block]
    label: int | None
    file_name: str = ""  # recorded in each sample's .json (default: the path's base name, without a URL's query)
    scales: tuple[ScaleWork, ...] = ()  # a multi-mpp build's scales, ascending mpp (the first is level, cands...)
    key_mpp: float | None = None  # a multi-mpp build's scale: its target mpp, named in the sample keys

    @property
    def name(self) -> str:
        return self.file_name or os.path.basename(public_location(self.path))

    def at(self, scale: int) -> SlideWork:
        """The work of one scale (a block's ``scale``): its level, grid and key; this work in a build of one mpp."""
        if not self.scales:
            return self
        one = self.scales[scale]
        return replace(self, level=one.level, patch_mpp=one.patch_mpp, cands=one.cands, key_mpp=one.mpp, scales=())


def read_block_image(reader: SlideReader, block: Block, cands: Candidates, level: int) -> Image.Image:
    """The block's region at the output resolution, (o_w, o_h): read once, resampled in two stages.

    With ``scale`` level px per output px, split as ``k * rest`` (``k`` an integer, ``rest`` in [1/1.06, 2)):

    1. reduce by ``k``: JPEG tiles decoded at 1/k by libjpeg's DCT scaling where the reader can (k = 2, 4, 8),
       else a full-resolution read reduced by an exact k x k box filter;
    2. resample the small ``rest`` by OpenCV's bicubic interpolation at the reduced size, at exactly ``rest``
       reduced px per output px (nothing to do for an integer scale); bilinear would blur sharp texture.

    Stage 2 starts on a reduced pixel: the region's top-left is the block's nominal corner moved to the nearest
    multiple of ``k`` level px (at most half a reduced pixel); :func:`patch_images` does the same per patch and
    reports where each patch starts. The read covers the filter's reach past the block's edges. Source tiles that
    no kept patch of the block (nor that reach) touches are not decoded: they stay white and are never cut into a
    patch.
    """
    pixels, _, _ = _stage_one(reader, block, cands, level).cut(block.o_x, block.o_y, block.o_w, block.o_h)
    return Image.fromarray(pixels)


def patch_images(
    reader: SlideReader, block: Block, cands: Candidates, level: int
) -> list[tuple[Image.Image, float, float]]:
    """:func:`patch_pixels` as Pillow images."""
    return [(Image.fromarray(pixels), l_x, l_y) for pixels, l_x, l_y in patch_pixels(reader, block, cands, level)]


def patch_pixels(
    reader: SlideReader, block: Block, cands: Candidates, level: int
) -> list[tuple[np.ndarray, float, float]]:
    """The block's kept patches at the output resolution, (size, size, 3) uint8, in the block's order, each with
    the level px of its top-left: one read for the block, stage 2 (:func:`read_block_image`) for each patch alone,
    so a block's empty cells cost nothing. A patch starts on the reduced pixel nearest its grid position (at most
    half a reduced pixel away; where grid steps are shorter than that, at its grid position: :meth:`Reduced.cut`),
    so its level-0 corner is exact; patches keep exactly the target resolution."""
    reduced = _stage_one(reader, block, cands, level)
    size, stride = cands.patch, cands.stride
    out = []
    for col, row in zip(cands.col[block.patches].tolist(), cands.row[block.patches].tolist(), strict=True):
        out.append(reduced.cut(col * stride, row * stride, size, size))
    return out


def _stage_one(reader: SlideReader, block: Block, cands: Candidates, level: int) -> Reduced:
    rect, k, needed, scale, snap = _stage_one_read(reader, block, cands, level)
    image = reduced_read(reader, level, rect, k, needed)  # (h / k, w / k, 3)
    return Reduced(image, rect[0], rect[1], k, scale, snap)


def plan_block(reader: SlideReader, work: SlideWork, block: Block) -> None:
    """Tell ``reader`` that ``block`` will be read (a reader that keeps tiles for the reads planned, as
    :meth:`~wsishard.slide.tiff.TiffTileReader.plan_read` does, decodes a tile that neighbouring blocks share once)."""
    plan = getattr(reader, "plan_read", None)
    if plan is not None:
        work = work.at(block.scale)
        rect, k, needed, _, _ = _stage_one_read(reader, block, work.cands, work.level)
        plan(work.level, *rect, k, needed)


def _stage_one_read(
    reader: SlideReader, block: Block, cands: Candidates, level: int
) -> tuple[tuple[int, int, int, int], int, list[tuple[int, int, int, int]], float, bool]:
    """What stage 1 reads of ``block``: the level-px rect (x, y, w, h), reduced ``k`` times, only the ``needed``
    rects of it; and ``scale`` (level px per output px) and ``snap`` for stage 2."""
    scale = cands.l0_per_o / reader.level_downsamples[level]  # level px per output px
    k = max(1, math.floor(scale * (1 + REST_SLACK) + 1e-9))
    exact = abs(scale / k - 1.0) < 1e-9
    snap = cands.stride * scale >= k  # distinct cells then always move to distinct reduced pixels
    reach = 0 if exact else (math.ceil(max(scale / k, 1.0)) + 4) * k  # the snap, the crop's margin, the filter
    # what stage 2 reads of a patch: from its corner moved up to k/2 back (2k without the move: the crop starts a
    # reduced pixel early), to its far edge + k/2 + 2.5 reduced px
    margins = (0, 0) if exact else (k if snap else 2 * k, 3 * k)
    x0, y0 = floor_to(math.floor(block.o_x * scale) - reach, k), floor_to(math.floor(block.o_y * scale) - reach, k)
    x1 = ceil_to(math.ceil((block.o_x + block.o_w) * scale) + reach, k)
    y1 = ceil_to(math.ceil((block.o_y + block.o_h) * scale) + reach, k)
    return (x0, y0, x1 - x0, y1 - y0), k, _needed_rects(block, cands, scale, margins), scale, snap


def _needed_rects(
    block: Block, cands: Candidates, scale: float, margins: tuple[int, int]
) -> list[tuple[int, int, int, int]]:
    """Level-px rectangles the block's kept patches use: their level extent, ``margins`` (before, after) wider."""
    size, (lo, hi) = cands.patch, margins
    return [
        (
            math.floor(ox * scale) - lo,
            math.floor(oy * scale) - lo,
            math.ceil((ox + size) * scale) + hi,
            math.ceil((oy + size) * scale) + hi,
        )
        for ox, oy in zip(
            (cands.col[block.patches] * cands.stride).tolist(),
            (cands.row[block.patches] * cands.stride).tolist(),
            strict=True,
        )
    ]


def block_samples(reader: SlideReader, work: SlideWork, block: Block, encode: EncodeOptions) -> Samples:
    """Read one block of ``work``'s slide and return its patches as ``(key, members)`` in the block's order."""
    work = work.at(block.scale)
    cands = work.cands
    size, extent, down = cands.patch, cands.l0_extent, reader.level_downsamples[work.level]
    context = _block_context(reader, work, block, encode)
    out = []
    for i, (patch, l_x, l_y) in zip(
        block.patches.tolist(), patch_pixels(reader, block, cands, work.level), strict=True
    ):
        scores = quality_scores(patch)  # the one place patch pixels are scored
        if encode.filters.rejects(scores) is not None:
            continue
        x, y = round(l_x * down), round(l_y * down)  # where the patch's pixels start, level 0
        meta: PatchMeta = {
            "slide_id": work.slide_id,
            "file": work.name,
            "x": x,
            "y": y,
            "extent": extent,
            "patch_mpp": work.patch_mpp,
            "level": work.level,
            "patch_size": size,
            "tissue": round(float(cands.tissue[i]), 4),
            **scores,  # type: ignore[typeddict-item]
            "pigment": round(float(cands.pigment[i]), 4) if cands.pigment is not None else 0.0,
        }
        members = {encode.image_format: encode_image(patch, encode.image_format, encode.quality)}
        if context is not None:
            context_members, meta["context"] = context.sample(l_x * down, l_y * down)
            members.update(context_members)
        label = work.label if cands.label is None else int(cands.label[i])
        if label is not None:
            meta["label"] = label
            members["cls"] = str(label).encode()
        if cands.label is not None and label is not None:
            meta["label_name"] = cands.label_names[label]
        members["json"] = json.dumps(meta, sort_keys=True).encode()
        out.append((sample_key(work.slide_id, x, y, work.key_mpp), members))
    return out


def _block_context(reader: SlideReader, work: SlideWork, block: Block, encode: EncodeOptions) -> BlockContext | None:
    """The block's context patches (:mod:`wsishard.builder.extract.context`), None without."""
    if encode.context is None:
        return None
    return BlockContext(reader, work, block, encode.context, encode.image_format, encode.quality)
