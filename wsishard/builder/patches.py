"""Cutting a read block into patches and encoding them as sample members."""

from __future__ import annotations

import io
import json
import math

from PIL import Image

from wsishard.format import PatchMeta, sample_key
from wsishard.grid import Block, Candidates
from wsishard.slide import SlideReader

_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}


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


def block_samples(reader: SlideReader, block: Block, cands: Candidates, *, level: int, slide_id: str,
                  file_name: str, target_mpp: float, image_format: str, quality: int,
                  label: int | None) -> list[tuple[str, dict[str, bytes]]]:  # fmt: skip
    """Read one block and return its patches as ``(key, members)`` in the block's patch order."""
    image = read_block_image(reader, block, cands, level)
    l0_x, l0_y = cands.l0_x, cands.l0_y
    size, extent = cands.patch, cands.l0_extent
    out = []
    for i in block.patches.tolist():
        ox, oy = int(cands.col[i]) * cands.stride - block.o_x, int(cands.row[i]) * cands.stride - block.o_y
        x, y = int(l0_x[i]), int(l0_y[i])
        meta: PatchMeta = {
            "slide_id": slide_id, "file": file_name, "x": x, "y": y, "extent": extent, "mpp": target_mpp,
            "level": level, "patch_size": size, "tissue": round(float(cands.tissue[i]), 4),
        }  # fmt: skip
        members = {image_format: encode_image(image.crop((ox, oy, ox + size, oy + size)), image_format, quality)}
        if label is not None:
            meta["label"] = label
            members["cls"] = str(label).encode()
        members["json"] = json.dumps(meta, sort_keys=True).encode()
        out.append((sample_key(slide_id, x, y), members))
    return out
