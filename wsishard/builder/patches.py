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

import numpy as np
from PIL import Image

from wsishard.builder.grid import Block, Candidates
from wsishard.builder.quality import QualityOptions, quality_scores
from wsishard.errors import OptionError
from wsishard.format import IMAGE_FORMATS, PatchMeta, sample_key
from wsishard.slide.reader import SlideReader
from wsishard.storage.urls import public_location

_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
# Stage 1 may reduce by the integer just above the scale when the rest is then an upsampling of at most 6%: that
# costs less than decoding at full size, at a quality tests hold against a full-resolution Lanczos.
_REST_SLACK = 0.06
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
    file_name: str = ""  # recorded in each sample's .json (default: the path's base name, without a URL's query)

    @property
    def name(self) -> str:
        return self.file_name or os.path.basename(public_location(self.path))


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


def patch_images(reader: SlideReader, block: Block, cands: Candidates,
                 level: int) -> list[tuple[Image.Image, float, float]]:  # fmt: skip
    """The block's kept patches at the output resolution, in the block's order, each with the level px of its
    top-left: one read for the block, stage 2 (:func:`read_block_image`) for each patch alone, so a block's empty
    cells cost nothing. A patch starts on the reduced pixel nearest its grid position (at most half a reduced
    pixel away; where grid steps are shorter than that, at its grid position: :meth:`_Reduced.cut`), so its
    level-0 corner is exact; patches keep exactly the target resolution."""
    reduced = _stage_one(reader, block, cands, level)
    size, stride = cands.patch, cands.stride
    out = []
    for col, row in zip(cands.col[block.patches].tolist(), cands.row[block.patches].tolist(), strict=True):
        pixels, l_x, l_y = reduced.cut(col * stride, row * stride, size, size)
        out.append((Image.fromarray(pixels), l_x, l_y))
    return out


@dataclass(frozen=True)
class _Reduced:
    """A block's region after stage 1: level px ``[x0, x0 + w * k) x [y0, y0 + h * k)`` reduced ``k`` times."""

    image: np.ndarray  # (h, w, 3) uint8
    x0: int  # level px of image[0, 0]; multiples of k
    y0: int
    k: int
    scale: float  # level px per output px
    snap: bool  # corners move to the nearest reduced pixel (False when grid steps are shorter than one)

    def cut(self, o_x: int, o_y: int, width: int, height: int) -> tuple[np.ndarray, float, float]:
        """Output px ``[o_x, o_x + width) x [o_y, o_y + height)`` (stage 2) and the level px of its top-left.

        The corner moves to the nearest reduced pixel and the rest is one ``cv2.resize`` at exactly ``rest``; its
        first row and column take their outer bicubic tap from a repeated edge pixel (weight 0.03-0.05 at scanner
        rests). Where the grid's steps are shorter than a reduced pixel (``--stride 1``), two cells could move to
        one corner: there the corner stays where the grid puts it and ``cv2.warpAffine`` resamples from it.
        """
        k, rest = self.k, self.scale / self.k
        if not self.snap:
            return self._cut_between(o_x, o_y, width, height)
        l_x, l_y = k * math.floor(o_x * self.scale / k + 0.5), k * math.floor(o_y * self.scale / k + 0.5)
        r_x, r_y = (l_x - self.x0) // k, (l_y - self.y0) // k
        if abs(rest - 1.0) < 1e-9:
            return self.image[r_y : r_y + height, r_x : r_x + width], l_x, l_y
        import cv2  # not at import: the CLI starts without OpenCV

        crop = self.image[r_y : r_y + math.ceil(height * rest) + 3, r_x : r_x + math.ceil(width * rest) + 3]
        # fx given (no dsize): OpenCV maps output px j to source px (j + 0.5) * rest - 0.5, exactly this rest
        pixels = cv2.resize(crop, None, fx=1 / rest, fy=1 / rest, interpolation=cv2.INTER_CUBIC)[:height, :width]
        if pixels.shape[:2] != (height, width):
            raise AssertionError(f"stage 2 read too little: {crop.shape} gave {pixels.shape}")
        return pixels, l_x, l_y

    def _cut_between(self, o_x: int, o_y: int, width: int, height: int) -> tuple[np.ndarray, float, float]:
        import cv2

        k, rest = self.k, self.scale / self.k
        f_x, f_y = (o_x * self.scale - self.x0) / k, (o_y * self.scale - self.y0) / k  # the corner, reduced px
        c_x, c_y = math.floor(f_x) - 1, math.floor(f_y) - 1
        crop = self.image[c_y : c_y + math.ceil(height * rest) + 4, c_x : c_x + math.ceil(width * rest) + 4]
        shift = 0.5 * rest - 0.5  # output px j samples the source at corner + (j + 0.5) * rest - 0.5
        m = np.array([[rest, 0.0, f_x - c_x + shift], [0.0, rest, f_y - c_y + shift]])
        pixels = cv2.warpAffine(crop, m, (width, height), flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP,
                                borderMode=cv2.BORDER_REPLICATE)  # fmt: skip
        return pixels, o_x * self.scale, o_y * self.scale


def _stage_one(reader: SlideReader, block: Block, cands: Candidates, level: int) -> _Reduced:
    scale = cands.l0_per_o / reader.level_downsamples[level]  # level px per output px
    k = max(1, math.floor(scale * (1 + _REST_SLACK) + 1e-9))
    exact = abs(scale / k - 1.0) < 1e-9
    snap = cands.stride * scale >= k  # distinct cells then always move to distinct reduced pixels
    reach = 0 if exact else (math.ceil(max(scale / k, 1.0)) + 4) * k  # the snap, the crop's margin, the filter
    # what stage 2 reads of a patch: from its corner moved up to k/2 back (2k without the move: the crop starts a
    # reduced pixel early), to its far edge + k/2 + 2.5 reduced px
    margins = (0, 0) if exact else (k if snap else 2 * k, 3 * k)
    x0, y0 = _floor_to(math.floor(block.o_x * scale) - reach, k), _floor_to(math.floor(block.o_y * scale) - reach, k)
    x1 = _ceil_to(math.ceil((block.o_x + block.o_w) * scale) + reach, k)
    y1 = _ceil_to(math.ceil((block.o_y + block.o_h) * scale) + reach, k)
    needed = _needed_rects(block, cands, scale, margins)
    image = _reduced_read(reader, level, (x0, y0, x1 - x0, y1 - y0), k, needed)  # ((y1-y0)/k, (x1-x0)/k, 3)
    return _Reduced(image, x0, y0, k, scale, snap)


def _reduced_read(reader: SlideReader, level: int, rect: tuple[int, int, int, int], k: int,
                  needed: list[tuple[int, int, int, int]]) -> np.ndarray:  # fmt: skip
    """The level-px ``rect`` (x, y, w, h; multiples of ``k``) reduced ``k`` times: DCT-scaled where possible."""
    reduced = getattr(reader, "read_level_reduced", None)
    if k > 1 and reduced is not None:
        pixels = reduced(level, *rect, k, needed=needed)  # (h / k, w / k, 3), None where it does not apply
        if pixels is not None:
            return pixels
    pixels = reader.read_level(level, *rect, needed=needed)  # (h, w, 3)
    if k == 1:
        return pixels
    return np.asarray(Image.fromarray(pixels).reduce(k))  # each pixel the exact mean of its own k x k source pixels


def _needed_rects(block: Block, cands: Candidates, scale: float,
                  margins: tuple[int, int]) -> list[tuple[int, int, int, int]]:  # fmt: skip
    """Level-px rectangles the block's kept patches use: their level extent, ``margins`` (before, after) wider."""
    size, (lo, hi) = cands.patch, margins
    return [
        (math.floor(ox * scale) - lo, math.floor(oy * scale) - lo,
         math.ceil((ox + size) * scale) + hi, math.ceil((oy + size) * scale) + hi)
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
    size, extent, down = cands.patch, cands.l0_extent, reader.level_downsamples[work.level]
    out = []
    for i, (patch, l_x, l_y) in zip(block.patches.tolist(), patch_images(reader, block, cands, work.level),
                                    strict=True):  # fmt: skip
        scores = quality_scores(patch)  # the one place patch pixels are scored
        if encode.filters.rejects(scores) is not None:
            continue
        x, y = round(l_x * down), round(l_y * down)  # where the patch's pixels start, level 0
        meta: PatchMeta = {
            "slide_id": work.slide_id, "file": work.name, "x": x, "y": y, "extent": extent,
            "mpp": work.mpp, "level": work.level, "patch_size": size,
            "tissue": round(float(cands.tissue[i]), 4), **scores,  # type: ignore[typeddict-item]
            "pigment": round(float(cands.pigment[i]), 4) if cands.pigment is not None else 0.0,
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
