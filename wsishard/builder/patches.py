"""A block's patches: read the block's region once, resample it to the target mpp, cut and encode the patches.

Scan (to measure encoded bytes), extraction and staging all go through :func:`block_samples`, with the slide's
:class:`SlideWork` and the build's :class:`EncodeOptions`.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass, field

from PIL import Image

from wsishard.builder.grid import Block, Candidates
from wsishard.builder.quality import QualityOptions, quality_scores
from wsishard.errors import OptionError
from wsishard.format import IMAGE_FORMATS, PatchMeta, sample_key
from wsishard.slide import SlideReader

_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
# Stage 1 may reduce by the integer just above the scale when the rest is then an upsampling of at most 6%: that
# costs less than decoding at full size, and stays above 45 dB PSNR against a full-resolution Lanczos (measured on
# synthetic H&E at 0.2520 and 0.2631 mpp to 0.5 mpp).
_REST_SLACK = 0.06
# Stage 2's filter and its support (px, before scaling): bilinear (antialiased: PIL widens it when reducing) costs
# 0.6 ms per 256 px patch where Lanczos costs 1.4; against a full-resolution Lanczos it gives 46-48 dB PSNR on
# synthetic H&E at scanner mpps (Lanczos: 50-52 dB). tests/unit/test_resample.py holds every scanner mpp >= 40 dB.
_REST_FILTER, _REST_SUPPORT = Image.Resampling.BILINEAR, 1
Samples = list[tuple[str, dict[str, bytes]]]  # (key, {ext: encoded bytes}) per sample, in write order


@dataclass(frozen=True, kw_only=True)
class EncodeOptions:
    """How patches are made from a slide's pixels.

    Attributes:
        target_mpp: microns per pixel of the written patches.
        image_format: ``jpg`` (lossy, ``quality``), ``png`` or ``webp`` (lossless).
        quality: JPEG quality 1..100.
        fast_path: decode TIFF-family tiles directly instead of through OpenSlide.
        filters: per-patch quality filters (the scores are written into every ``.json`` either way).

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    target_mpp: float = 0.5
    image_format: str = "jpg"
    quality: int = 90
    fast_path: bool = True
    filters: QualityOptions = field(default_factory=QualityOptions)

    def __post_init__(self) -> None:
        if self.image_format not in IMAGE_FORMATS:
            raise OptionError(f"invalid image_format: {self.image_format!r}")
        if not 1 <= self.quality <= 100:
            raise OptionError(f"invalid quality: {self.quality!r}")


@dataclass(frozen=True)
class SlideWork:
    """What reading a scanned slide's patches needs: where it is, its id and label, the level and the grid."""

    path: str  # a local file (a URL slide's local copy while it is read)
    slide_id: str
    level: int
    mpp: float  # microns per pixel of the written patches (recorded in each sample's .json)
    cands: Candidates
    blocks: list[Block]
    label: int | None
    file_name: str = ""  # recorded in each sample's .json (default: the path's base name)

    @property
    def name(self) -> str:
        return self.file_name or os.path.basename(self.path)


def encode_image(image: Image.Image, image_format: str, quality: int) -> bytes:
    """Encode an RGB patch. ``png`` and ``webp`` are lossless; ``quality`` applies to ``jpg``."""
    buf = io.BytesIO()
    if image_format == "jpg":
        image.save(buf, "JPEG", quality=quality)
    elif image_format == "webp":
        image.save(buf, "WEBP", lossless=True, quality=quality)
    else:
        image.save(buf, _PIL_FORMAT[image_format], compress_level=1)
    return buf.getvalue()


def read_block_image(reader: SlideReader, block: Block, cands: Candidates, level: int) -> Image.Image:
    """The block's region at the output resolution, (o_w, o_h): read once, resampled in two stages.

    With ``scale`` level px per output px, split as ``k * rest`` (``k`` an integer, ``rest`` in [1/1.06, 2)):

    1. reduce by ``k``: JPEG tiles decoded at 1/k by libjpeg's DCT scaling where the reader can (k = 2, 4, 8),
       else a full-resolution read reduced by an exact k x k box filter;
    2. resample the small ``rest`` with an antialiasing filter (bilinear) at the reduced size (nothing to do for an
       integer scale).

    Real scanners' mpp (0.2520, 0.2631, 0.2265...) give non-integer scales; stage 2 then costs a filter over
    the reduced patches instead of a filter over the full-resolution block. The read covers the filter's reach past
    the block's edges, so a patch on a block's border gets the same pixels as one inside it. Source tiles that
    no kept patch of the block (nor that reach) touches are not decoded: they stay white and are never cut into a
    patch.
    """
    reduced = _stage_one(reader, block, cands, level)
    return reduced.resample(0, 0, block.o_w, block.o_h)


def patch_images(reader: SlideReader, block: Block, cands: Candidates, level: int) -> list[Image.Image]:
    """The block's kept patches at the output resolution, in the block's order: one read for the block, stage 2
    (:func:`read_block_image`) for each patch alone, so a block's empty cells cost nothing."""
    reduced = _stage_one(reader, block, cands, level)
    size = cands.patch
    return [reduced.resample(int(cands.col[i]) * cands.stride - block.o_x, int(cands.row[i]) * cands.stride - block.o_y,
                             size, size) for i in block.patches.tolist()]  # fmt: skip


@dataclass(frozen=True)
class _Reduced:
    """A block's region after stage 1: the image reduced ``k`` times, the block's corner in it, the rest scale."""

    image: Image.Image
    bx: float  # the block's top-left, reduced px
    by: float
    rest: float  # reduced px per output px
    exact: bool  # rest is 1: a crop does

    def resample(self, ox: int, oy: int, width: int, height: int) -> Image.Image:
        """Output px ``[ox, ox + width) x [oy, oy + height)`` of the block (stage 2)."""
        x, y = self.bx + ox * self.rest, self.by + oy * self.rest
        if self.exact:
            return self.image.crop((round(x), round(y), round(x) + width, round(y) + height))
        box = (x, y, x + width * self.rest, y + height * self.rest)
        return self.image.resize((width, height), _REST_FILTER, box=box)


def _stage_one(reader: SlideReader, block: Block, cands: Candidates, level: int) -> _Reduced:
    scale = cands.l0_per_o / reader.level_downsamples[level]  # level px per output px
    k = max(1, math.floor(scale * (1 + _REST_SLACK) + 1e-9))
    rest = scale / k  # in [1/1.06, 2); lower when the whole scale is an upsampling
    exact = abs(rest - 1.0) < 1e-9
    reach = 0 if exact else (math.ceil(_REST_SUPPORT * max(rest, 1.0)) + 1) * k  # filter's reach past an edge
    x0, y0 = _floor_to(math.floor(block.o_x * scale) - reach, k), _floor_to(math.floor(block.o_y * scale) - reach, k)
    x1 = _ceil_to(math.ceil((block.o_x + block.o_w) * scale) + reach, k)
    y1 = _ceil_to(math.ceil((block.o_y + block.o_h) * scale) + reach, k)
    needed = _needed_rects(block, cands, scale, reach)
    image = _reduced_read(reader, level, (x0, y0, x1 - x0, y1 - y0), k, needed)  # ((y1-y0)/k, (x1-x0)/k)
    return _Reduced(image, (block.o_x * scale - x0) / k, (block.o_y * scale - y0) / k, rest, exact)


def _reduced_read(reader: SlideReader, level: int, rect: tuple[int, int, int, int], k: int,
                  needed: list[tuple[int, int, int, int]]) -> Image.Image:  # fmt: skip
    """The level-px ``rect`` (x, y, w, h; multiples of ``k``) reduced ``k`` times: DCT-scaled where possible."""
    reduced = getattr(reader, "read_level_reduced", None)
    if k > 1 and reduced is not None:
        pixels = reduced(level, *rect, k, needed=needed)  # (h / k, w / k, 3), None where it does not apply
        if pixels is not None:
            return Image.fromarray(pixels)
    image = Image.fromarray(reader.read_level(level, *rect, needed=needed))  # (h, w, 3)
    return image.reduce(k) if k > 1 else image  # each pixel the exact mean of its own k x k source pixels


def _needed_rects(block: Block, cands: Candidates, scale: float, reach: int) -> list[tuple[int, int, int, int]]:
    """Level-px rectangles the block's kept patches (and the filter's ``reach`` around them) use."""
    size = cands.patch
    return [
        (math.floor(ox * scale) - reach, math.floor(oy * scale) - reach,
         math.ceil((ox + size) * scale) + reach, math.ceil((oy + size) * scale) + reach)
        for ox, oy in zip((cands.col[block.patches] * cands.stride).tolist(),
                          (cands.row[block.patches] * cands.stride).tolist(), strict=True)
    ]  # fmt: skip


def _floor_to(value: int, k: int) -> int:
    return (value // k) * k


def _ceil_to(value: int, k: int) -> int:
    return -(-value // k) * k


def block_samples(reader: SlideReader, work: SlideWork, block: Block, encode: EncodeOptions) -> Samples:
    """Read one block of ``work``'s slide and return its patches as ``(key, members)`` in the block's order."""
    cands = work.cands
    l0_x, l0_y = cands.l0_x, cands.l0_y
    size, extent = cands.patch, cands.l0_extent
    out = []
    for i, patch in zip(block.patches.tolist(), patch_images(reader, block, cands, work.level), strict=True):
        scores = quality_scores(patch)  # the one place patch pixels are scored
        if encode.filters.rejects(scores) is not None:
            continue
        x, y = int(l0_x[i]), int(l0_y[i])
        meta: PatchMeta = {
            "slide_id": work.slide_id, "file": work.name, "x": x, "y": y, "extent": extent,
            "mpp": work.mpp, "level": work.level, "patch_size": size,
            "tissue": round(float(cands.tissue[i]), 4), **scores,  # type: ignore[typeddict-item]
        }  # fmt: skip
        members = {encode.image_format: encode_image(patch, encode.image_format, encode.quality)}
        label = work.label if cands.label is None else int(cands.label[i])
        if label is not None:
            meta["label"] = label
            members["cls"] = str(label).encode()
        if cands.label is not None and label is not None:
            meta["label_name"] = cands.label_names[label]
        members["json"] = json.dumps(meta, sort_keys=True).encode()
        out.append((sample_key(work.slide_id, x, y), members))
    return out
