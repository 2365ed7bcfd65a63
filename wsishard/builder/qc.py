"""Quality-control pictures: the slide's thumbnail with the tissue contour and the kept patches drawn."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw
from skimage.segmentation import find_boundaries

_CONTOUR_RGB = (0, 170, 0)
_PATCH_RGB = (30, 60, 230)


def qc_picture(thumb: np.ndarray, mask: np.ndarray, l0_per_t: float, l0_x: np.ndarray, l0_y: np.ndarray,
               l0_extent: int, *, max_side_px: int = 1200) -> Image.Image:  # fmt: skip
    """Draw the tissue contour and the kept patches over the thumbnail.

    Args:
        thumb: (h, w, 3) uint8 thumbnail; ``mask`` is (h, w) bool at the same resolution.
        l0_per_t: level-0 px per thumbnail px.
        l0_x, l0_y: (n,) level-0 top-left corners of the kept patches.
        l0_extent: level-0 side of a patch.
        max_side_px: the picture is scaled down to at most this side.
    """
    rgb = np.array(thumb)  # (h, w, 3) uint8
    edge = find_boundaries(mask, mode="inner")
    rgb[edge] = _CONTOUR_RGB
    image = Image.fromarray(rgb)
    scale = min(1.0, max_side_px / max(image.size))
    if scale < 1.0:
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    draw = ImageDraw.Draw(image)
    t_per_l0 = scale / l0_per_t  # picture px per level-0 px
    side = max(1.0, l0_extent * t_per_l0)
    for x, y in zip(l0_x.tolist(), l0_y.tolist(), strict=True):
        px, py = x * t_per_l0, y * t_per_l0
        draw.rectangle((px, py, px + side - 1, py + side - 1), outline=_PATCH_RGB)
    return image
