"""The two-stage resampling every patch goes through, main and context alike: stage 1 reads a level's region
reduced ``k`` times (DCT-scaled where the tiles allow), stage 2 cuts a patch from it at exactly the rest of the scale;
then the patch is encoded.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from wsishard.slide.reader import SlideReader

_PIL_FORMAT = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
# Stage 1 may reduce by the integer just above the scale when the rest is then an upsampling of at most 6%: that
# costs less than decoding at full size, at a quality tests hold against a full-resolution Lanczos.
REST_SLACK = 0.06


def encode_image(image: Image.Image | np.ndarray, image_format: str, quality: int) -> bytes:
    """Encode an RGB patch, a Pillow image or (h, w, 3) uint8. ``png`` and ``webp`` are lossless; ``quality``
    applies to ``jpg``.

    ``jpg`` goes through OpenCV's libjpeg-turbo with Pillow's settings (4:2:0, standard tables, no optimisation):
    the same bytes as Pillow's ``save``, without Pillow's unpacking of the pixels and its Python-level encoder
    set-up (a third of the encode's cost)."""
    if image_format == "jpg":
        import cv2  # not at import: the CLI starts without OpenCV

        bgr = cv2.cvtColor(np.asarray(image), cv2.COLOR_RGB2BGR)
        ok, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise ValueError(f"OpenCV could not encode a {bgr.shape} patch as JPEG")
        return data.tobytes()
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    if image_format == "jpg":
        image.save(buf, "JPEG", quality=quality)
    elif image_format == "webp":
        image.save(buf, "WEBP", lossless=True, quality=quality)
    else:
        image.save(buf, _PIL_FORMAT[image_format], compress_level=1)
    return buf.getvalue()


@dataclass(frozen=True)
class Reduced:
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
        pixels = cv2.warpAffine(
            crop, m, (width, height), flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE
        )
        return pixels, o_x * self.scale, o_y * self.scale


def reduced_read(
    reader: SlideReader, level: int, rect: tuple[int, int, int, int], k: int, needed: list[tuple[int, int, int, int]]
) -> np.ndarray:
    """The level-px ``rect`` (x, y, w, h; multiples of ``k``) reduced ``k`` times: DCT-scaled where possible."""
    reduced = getattr(reader, "read_level_reduced", None)
    if k > 1 and reduced is not None:
        pixels = reduced(level, *rect, k, needed=needed)  # (h / k, w / k, 3), None where it does not apply
        if pixels is not None:
            return pixels
    pixels = reader.read_level(level, *rect, needed=needed)  # (h, w, 3)
    if k == 1:
        return pixels
    if k > _PIL_REDUCE_MAX:  # Pillow's reduce drifts past that: a white 1200 x 1200 block gives 241
        h, w = pixels.shape[0] // k, pixels.shape[1] // k
        sums = pixels.reshape(h, k, w, k, 3).sum(axis=(1, 3), dtype=np.uint64)  # (h, w, 3)
        return ((sums * 2 + k * k) // (2 * k * k)).astype(np.uint8)  # the mean, rounded half up
    return np.asarray(Image.fromarray(pixels).reduce(k))  # each pixel the exact mean of its own k x k source pixels


_PIL_REDUCE_MAX = 64  # Pillow's reduce is within 1 of the mean up to here (k = 400: a white block gives 253)


def floor_to(value: int, k: int) -> int:
    return (value // k) * k


def ceil_to(value: int, k: int) -> int:
    return -(-value // k) * k
