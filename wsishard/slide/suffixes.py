"""The file suffixes taken for slides when a folder is searched (a module of its own: the CLI reads it without
loading the readers, numpy or Pillow)."""

from __future__ import annotations

SLIDE_SUFFIXES: tuple[str, ...] = (
    ".svs",
    ".tif",
    ".tiff",
    ".ndpi",
    ".vms",
    ".vmu",
    ".scn",
    ".mrxs",
    ".svslide",
    ".bif",
    ".dcm",
    ".czi",
)
