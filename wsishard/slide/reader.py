"""The slide reader protocol, and what every backend shares: suffixes, the low-resolution view, helpers.

Coordinate frames follow openslide-python: ``l0_`` names level-0 pixels, ``l_`` names pixels of the level being
read. Readers open file handles in the process that uses them; a reader is never pickled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    from typing_extensions import Self

from wsishard.slide.suffixes import SLIDE_SUFFIXES as SLIDE_SUFFIXES

Rect = tuple[int, int, int, int]  # (x0, y0, x1, y1), half-open
BACKGROUND = 255  # what lies outside the image or under transparent pixels: white glass


class SlideReader(Protocol):
    """What the build needs of a slide. Dimensions are (width, height); regions come back (h, w, 3) uint8.

    A reader is a context manager (``with open_slide(path) as reader: ...`` closes it); backends subclass this
    protocol to inherit that.
    """

    path: str
    backend: str
    level_dimensions: tuple[tuple[int, int], ...]
    level_downsamples: tuple[float, ...]
    properties: Mapping[str, str]

    def read_level(
        self, level: int, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None = None
    ) -> np.ndarray:
        """Pixels ``[l_y, l_y+height) x [l_x, l_x+width)`` of ``level``, in that level's own pixels.

        ``needed``: level-pixel rectangles ``(x0, y0, x1, y1)`` the caller will use; a reader may leave pixels
        outside all of them white instead of decoding them.
        """
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_lowres(
    reader: SlideReader, l0_per_px: float, *, chunk_px: int = 512, dct_scaled: bool = False
) -> tuple[np.ndarray, float]:
    """A low-resolution RGB view of the whole slide with bounded memory.

    Reads the coarsest level that is still at least as fine as the requested view, in chunks of ``chunk_px``
    level pixels, and reduces each chunk into the output (area filter). A huge single-level slide is thus
    never loaded whole.

    Args:
        l0_per_px: level-0 pixels per output pixel (>= 1).
        dct_scaled: where the reader decodes tiles at 1/2, 1/4 or 1/8 (``read_level_reduced``: libjpeg's DCT
            scaling), decode at the largest of those factors that keeps the read at least as fine as the view
            (a fraction of the cost; pixels within 1-2 levels of a full decode's box reduction, so not for tissue
            detection, whose masks must not move).

    Returns:
        ``(rgb, downsample)``: (h, w, 3) uint8 and the exact level-0 px per output px along x.
    """
    l0_w, l0_h = reader.level_dimensions[0]
    out_w, out_h = max(1, round(l0_w / l0_per_px)), max(1, round(l0_h / l0_per_px))
    level = max(i for i, d in enumerate(reader.level_downsamples) if d <= l0_per_px * 1.001 or i == 0)
    lw, lh = reader.level_dimensions[level]
    reduced = getattr(reader, "read_level_reduced", None) if dct_scaled else None
    ratio = l0_per_px * 1.001 / reader.level_downsamples[level]  # level px per output px
    factor = max((f for f in (2, 4, 8) if f <= ratio and chunk_px % f == 0), default=1) if reduced else 1
    sx, sy = out_w / lw, out_h / lh  # output px per level px
    out = np.empty((out_h, out_w, 3), dtype=np.uint8)  # (h, w, 3)
    for cy in range(0, lh, chunk_px):
        for cx in range(0, lw, chunk_px):
            cw, ch = min(chunk_px, lw - cx), min(chunk_px, lh - cy)
            ox0, oy0 = round(cx * sx), round(cy * sy)
            ox1, oy1 = round((cx + cw) * sx), round((cy + ch) * sy)
            if ox1 <= ox0 or oy1 <= oy0:
                continue
            chunk = reduced(level, cx, cy, cw, ch, factor) if reduced and factor > 1 else None
            if chunk is None:  # not DCT-scaled (or not here: an edge chunk not a multiple of the factor)
                chunk = reader.read_level(level, cx, cy, cw, ch)
            small = Image.fromarray(chunk).resize((ox1 - ox0, oy1 - oy0), Image.Resampling.BOX)
            out[oy0:oy1, ox0:ox1] = np.asarray(small)
    return out, l0_w / out_w


def composite_on_white(rgba: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8: (h, w, 4) RGBA (straight alpha, as OpenSlide gives it) composited on white, so what lies
    outside the scanned area reads as glass, never black; (h, w, 3) RGB comes back as it is."""
    if rgba.shape[2] == 3:
        return rgba
    alpha = rgba[..., 3:4].astype(np.uint16)
    out = (rgba[..., :3].astype(np.uint16) * alpha + BACKGROUND * (255 - alpha) + 127) // 255
    return out.astype(np.uint8)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
