"""The OpenSlide backend: any format OpenSlide opens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import openslide

from wsishard.errors import SlideError, machine_shortage
from wsishard.slide.reader import Rect, SlideReader, composite_on_white, one_line


class OpenSlideReader(SlideReader):
    """Any format OpenSlide opens. Transparent pixels (outside scanned areas) read as white (composited on it)."""

    backend = "openslide"

    def __init__(self, path: str, cache: openslide.OpenSlideCache | None = None) -> None:
        self.path = path
        try:
            self._slide = openslide.OpenSlide(path)
        except (openslide.OpenSlideError, OSError) as exc:
            _can_open(path)
            raise SlideError(path, f"OpenSlide cannot open it ({one_line(exc)})") from exc
        if cache is not None:
            self._slide.set_cache(cache)
        self.level_dimensions = tuple(self._slide.level_dimensions)
        self.level_downsamples = tuple(float(d) for d in self._slide.level_downsamples)
        self.properties: Mapping[str, str] = dict(self._slide.properties)

    def read_level(
        self, level: int, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None = None
    ) -> np.ndarray:
        ds = self.level_downsamples[level]
        l0_xy = (round(l_x * ds), round(l_y * ds))
        try:
            rgba = np.asarray(self._slide.read_region(l0_xy, level, (width, height)))
        except openslide.OpenSlideError as exc:
            raise SlideError(self.path, f"read failed at level {level} ({one_line(exc)})") from exc
        return composite_on_white(rgba)  # (h, w, 3) uint8: transparent (unscanned) areas white, edges blended

    def close(self) -> None:
        self._slide.close()


def _can_open(path: str) -> None:
    """Raise the system's ``OSError`` if ``path`` cannot be opened for want of file descriptors (or memory):
    OpenSlide reports that as an "unsupported or missing image file", which would blame the slide."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        if machine_shortage(exc) is not None:
            raise
