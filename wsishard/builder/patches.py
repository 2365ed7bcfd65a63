"""A block's patches: read the block's region once, resample it to the target mpp, cut and encode the patches.

Scan (to measure encoded bytes), extraction and staging all go through :func:`block_samples`, with the slide's
:class:`SlideWork` and the build's :class:`EncodeOptions`.
"""

from __future__ import annotations

import io
import json
import math
import os
from dataclasses import dataclass

from PIL import Image

from wsishard.builder.grid import Block, Candidates
from wsishard.errors import OptionError
from wsishard.format import IMAGE_FORMATS, PatchMeta, sample_key
from wsishard.slide import SlideReader

_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
Samples = list[tuple[str, dict[str, bytes]]]  # (key, {ext: encoded bytes}) per sample, in write order


@dataclass(frozen=True, kw_only=True)
class EncodeOptions:
    """How patches are made from a slide's pixels.

    Attributes:
        target_mpp: microns per pixel of the written patches.
        image_format: ``jpg`` (lossy, ``quality``), ``png`` or ``webp`` (lossless).
        quality: JPEG quality 1..100.
        fast_path: decode TIFF-family tiles directly instead of through OpenSlide.

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    target_mpp: float = 0.5
    image_format: str = "jpg"
    quality: int = 90
    fast_path: bool = True

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
    """The block's region at the output resolution, (o_w, o_h): read once, resized once.

    Source tiles that no kept patch of the block (nor the resampling filter around it) touches are not decoded:
    they stay white and are never cut into a patch.
    """
    downsample = reader.level_downsamples[level]
    scale = cands.l0_per_o / downsample  # level px per output px
    l_x, l_y, l_w, l_h = block.level_rect(cands.l0_per_o, downsample)
    size = cands.patch
    fx, fy = block.o_x * scale - l_x, block.o_y * scale - l_y  # the block's exact extent within the read
    factor = round(scale)
    boxed = abs(scale - factor) < 1e-9 and factor >= 1 and fx == 0 and fy == 0  # integer box reduction
    margin = 0 if boxed else math.ceil(3 * max(scale, 1.0)) + 1  # the resampling filter's reach past an edge
    needed = [
        (math.floor(ox * scale) - margin, math.floor(oy * scale) - margin,
         math.ceil((ox + size) * scale) + margin, math.ceil((oy + size) * scale) + margin)
        for ox, oy in zip((cands.col[block.patches] * cands.stride).tolist(),
                          (cands.row[block.patches] * cands.stride).tolist(), strict=True)
    ]  # fmt: skip
    reduced = getattr(reader, "read_level_reduced", None)
    if boxed and factor > 1 and reduced is not None:  # decode straight at the output scale when the codec can
        pixels = reduced(level, l_x, l_y, l_w, l_h, factor, needed=needed)  # (l_h / factor, l_w / factor, 3)
        if pixels is not None:
            out = Image.fromarray(pixels)
            return out if out.size == (block.o_w, block.o_h) else out.crop((0, 0, block.o_w, block.o_h))
    image = Image.fromarray(reader.read_level(level, l_x, l_y, l_w, l_h, needed=needed))  # (l_h, l_w, 3)
    if boxed:  # each output pixel is the mean of its own factor x factor source pixels: nothing bleeds in
        out = image if factor == 1 else image.reduce(factor)  # exact box filter for integer factors
        return out if out.size == (block.o_w, block.o_h) else out.crop((0, 0, block.o_w, block.o_h))
    box = (fx, fy, fx + block.o_w * scale, fy + block.o_h * scale)
    return image.resize((block.o_w, block.o_h), Image.Resampling.LANCZOS, box=box, reducing_gap=3.0)


def block_samples(reader: SlideReader, work: SlideWork, block: Block, encode: EncodeOptions) -> Samples:
    """Read one block of ``work``'s slide and return its patches as ``(key, members)`` in the block's order."""
    cands = work.cands
    image = read_block_image(reader, block, cands, work.level)
    l0_x, l0_y = cands.l0_x, cands.l0_y
    size, extent = cands.patch, cands.l0_extent
    out = []
    for i in block.patches.tolist():
        ox, oy = int(cands.col[i]) * cands.stride - block.o_x, int(cands.row[i]) * cands.stride - block.o_y
        x, y = int(l0_x[i]), int(l0_y[i])
        meta: PatchMeta = {
            "slide_id": work.slide_id, "file": work.name, "x": x, "y": y, "extent": extent,
            "mpp": encode.target_mpp, "level": work.level, "patch_size": size,
            "tissue": round(float(cands.tissue[i]), 4),
        }  # fmt: skip
        patch = image.crop((ox, oy, ox + size, oy + size))
        members = {encode.image_format: encode_image(patch, encode.image_format, encode.quality)}
        if work.label is not None:
            meta["label"] = work.label
            members["cls"] = str(work.label).encode()
        members["json"] = json.dumps(meta, sort_keys=True).encode()
        out.append((sample_key(work.slide_id, x, y), members))
    return out
