"""Slide readers: one narrow protocol, an OpenSlide backend, a direct-tile TIFF backend, an in-memory backend.

:func:`open_slide` picks the fast direct-tile reader for SVS and pyramidal TIFF files whose levels it can read,
and OpenSlide for everything else.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING, Any

from wsishard.errors import SlideError
from wsishard.slide.mpp import resolve_mpp, slide_mpp
from wsishard.slide.suffixes import SLIDE_SUFFIXES

if TYPE_CHECKING:
    import openslide

    from wsishard.slide.memory import MemorySlide
    from wsishard.slide.openslide_backend import OpenSlideReader
    from wsishard.slide.reader import SlideReader, read_lowres
    from wsishard.slide.tiff import TiffTileReader

__all__ = [
    "SLIDE_SUFFIXES",
    "MemorySlide",
    "OpenSlideReader",
    "SlideReader",
    "TiffTileReader",
    "open_slide",
    "read_lowres",
    "resolve_mpp",
    "slide_mpp",
]

logger = logging.getLogger(__name__)

_FAST_SUFFIXES = (".svs", ".tif", ".tiff")
# imported on first use: ``wsishard --help`` loads neither the backends (OpenSlide, tifffile) nor numpy and Pillow
_BACKENDS = {
    "MemorySlide": "memory",
    "OpenSlideReader": "openslide_backend",
    "TiffTileReader": "tiff",
    "SlideReader": "reader",
    "read_lowres": "reader",
}


def __getattr__(name: str) -> Any:
    if name in _BACKENDS:
        return getattr(importlib.import_module(f"{__name__}.{_BACKENDS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_slide(path: str, *, fast: bool = True, cache: openslide.OpenSlideCache | None = None) -> SlideReader:
    """Open ``path`` with the fast tile path when it applies, else with OpenSlide.

    Raises:
        SlideError: the file does not exist or no backend can open it.
    """
    if not os.path.isfile(path):
        if os.path.islink(path):
            raise SlideError(path, f"a symlink to {os.readlink(path)}, which is not there (a dangling link)")
        raise SlideError(path, "no such file")
    from wsishard.slide.openslide_backend import OpenSlideReader
    from wsishard.slide.tiff import TiffTileReader

    reader = OpenSlideReader(path, cache=cache)
    if not fast or not path.lower().endswith(_FAST_SUFFIXES):
        return reader
    try:
        fast_reader = TiffTileReader(path, reader.level_dimensions, reader.level_downsamples, reader.properties)
    except SlideError as exc:
        logger.debug("fast path off for %s: %s", path, exc.reason)
        return reader
    reader.close()
    return fast_reader
