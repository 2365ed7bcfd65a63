"""An in-memory slide (as openslide-python's ``ImageSlide``): a pyramid built from an RGB array, for tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

from wsishard.slide.reader import BACKGROUND, Rect, SlideReader


class MemorySlide(SlideReader):
    """A slide held in memory: level 0 is ``rgb``, each further level ``downsample`` times smaller (box filter).

    Args:
        rgb: (h, w, 3) uint8 level-0 pixels.
        mpp: level-0 microns per pixel, reported as OpenSlide does (``openslide.mpp-x/y``); None: none reported.
        downsample: integer factor between levels.
        min_level_px: no level whose longest side would be below this is made.
        path: the name the slide goes by (errors and records).

    Raises:
        ValueError: ``rgb`` is not (h, w, 3) uint8, or ``downsample`` < 2.
    """

    backend = "memory"

    def __init__(
        self,
        rgb: np.ndarray,
        *,
        mpp: float | None = 0.25,
        downsample: int = 4,
        min_level_px: int = 64,
        path: str = "<memory>",
    ) -> None:
        if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
            raise ValueError(f"expected an (h, w, 3) uint8 array, got {rgb.dtype} {rgb.shape}")
        if downsample < 2:
            raise ValueError(f"downsample must be >= 2, got {downsample}")
        self.path = path
        self._levels = [np.ascontiguousarray(rgb)]  # each (h, w, 3) uint8
        while max(self._levels[-1].shape[:2]) // downsample >= min_level_px:
            image = Image.fromarray(self._levels[-1])
            small = image.reduce(downsample)  # box filter over downsample x downsample pixels
            self._levels.append(np.asarray(small))
        self.level_dimensions = tuple((lv.shape[1], lv.shape[0]) for lv in self._levels)
        self.level_downsamples = tuple(float(downsample**i) for i in range(len(self._levels)))
        props = {} if mpp is None else {"openslide.mpp-x": str(mpp), "openslide.mpp-y": str(mpp)}
        self.properties: Mapping[str, str] = props

    def read_level(
        self, level: int, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None = None
    ) -> np.ndarray:
        src = self._levels[level]  # (h, w, 3)
        out = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)  # (height, width, 3)
        x0, y0 = max(l_x, 0), max(l_y, 0)
        x1, y1 = min(l_x + width, src.shape[1]), min(l_y + height, src.shape[0])
        if x0 < x1 and y0 < y1:
            out[y0 - l_y : y1 - l_y, x0 - l_x : x1 - l_x] = src[y0:y1, x0:x1]
        return out

    def close(self) -> None:
        self._levels = []
