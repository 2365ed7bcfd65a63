"""SVS and pyramidal TIFF slides read in place from object storage: range reads, never a whole-file copy.

The TIFF header and directories are read through an fsspec file object (small blocks); the levels, their
downsamples and the resolution come from the TIFF pages themselves, as OpenSlide would report them, so a slide
read here plans and extracts exactly as its local copy would through :class:`~wsishard.slide.tiff.TiffTileReader`.
Tile bytes are fetched by range (:mod:`wsishard.slide.ranges`: the tiles of a read coalesced into large requests,
several in flight, the planned reads' tiles fetched ahead) and kept in a sparse scratch file at their own offsets
(holes take no disk), which the direct-tile reader's decoding reads unchanged. ``bytes_read`` counts every byte
fetched, ``requests`` every tile request.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec
import numpy as np
import tifffile

from wsishard.errors import SlideError
from wsishard.slide.ranges import RangeFetcher, RangePolicy, Span, coalesce
from wsishard.slide.reader import Rect, one_line
from wsishard.slide.tiff import Into, TiffTileReader, _TiledLevel, _tiles_needed
from wsishard.storage.urls import StorageOptions, public_location

logger = logging.getLogger(__name__)

REMOTE_SUFFIXES = (".svs", ".tif", ".tiff")
_BLOCK_BYTES = 64 * 1024  # fsspec block size for the header and directories
# A slide under this size is copied (one request): read in place, its directories alone (~6 blocks of 64 KB, read by
# the scan and again to stage) would be most of its bytes, in ten times the requests.
COPY_BELOW_BYTES = 512 << 10
_APERIO_MPP = re.compile(r"\|\s*MPP\s*=\s*([0-9.eE+-]+)")


class RemoteTiffReader(TiffTileReader):
    """A direct-tile reader over range reads of a URL (see the module docstring).

    Raises:
        SlideError: the object cannot be opened, or is not a tiled 8-bit RGB pyramid the direct-tile path reads;
            callers then fall back to a local copy read through :func:`~wsishard.slide.open_slide`.
    """

    backend = "tifffile-remote"

    def __init__(
        self,
        url: str,
        scratch: str,
        storage_options: StorageOptions | None = None,
        policy: RangePolicy | None = None,
        copy_below_bytes: int = 0,
    ) -> None:
        self.path = url
        self._closed_bytes: int | None = None  # directory bytes fetched, kept when the file closes (its cache goes)
        try:
            fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
            self._file: Any = fs.open(path, "rb", block_size=_BLOCK_BYTES, cache_type="blockcache")
        except (OSError, ValueError) as exc:
            raise SlideError(url, f"cannot be opened ({type(exc).__name__})") from exc
        if self._file.size is not None and self._file.size < copy_below_bytes:
            self._file.close()
            raise SlideError(url, f"{self._file.size} bytes, under {copy_below_bytes}: a copy is one request")
        try:
            self._tif = tifffile.TiffFile(self._file)
            pages = _level_pages(self._tif)
            w0, h0 = pages[0].imagewidth, pages[0].imagelength
            self.level_dimensions = tuple((p.imagewidth, p.imagelength) for p in pages)
            self.level_downsamples = tuple((w0 / w + h0 / h) / 2 for w, h in self.level_dimensions)
            self.properties = _properties(self._tif)
            self._levels = [self._match_level(w, h) for w, h in self.level_dimensions]
        except SlideError:
            self._close_remote()
            raise
        except Exception as exc:  # tifffile raises many types on foreign files
            self._close_remote()
            raise SlideError(url, f"tifffile cannot read it in place ({one_line(exc)})") from exc
        os.makedirs(scratch, exist_ok=True)
        self._sparse = os.path.join(scratch, f"{uuid.uuid4().hex[:12]}.tiles")
        self._fd = os.open(self._sparse, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        tiles = ((o, c) for lv in self._levels for o, c in zip(lv.offsets, lv.bytecounts, strict=True))
        self._ranges = RangeFetcher(self._get_range, self._fd, policy, tiles)
        self._start_tiles()

    @property
    def bytes_read(self) -> int:
        """Bytes fetched from the object so far (also once closed): directories and tiles."""
        return (self._directory_bytes() if self._closed_bytes is None else self._closed_bytes) + self._ranges.bytes

    @property
    def size_bytes(self) -> int:
        """The object's size."""
        return int(self._file.size or 0)

    def in_place_bytes(self, level: int, under: np.ndarray) -> int:
        """The bytes reading the tiles of ``level`` marked in ``under`` ((rows, cols) bool, as :meth:`tile_bytes`)
        in place fetches: their coalesced ranges, the bytes between neighbouring tiles too."""
        lv, policy = self._levels[level], self._ranges.policy
        spans = [(lv.offsets[i], lv.bytecounts[i]) for i in np.flatnonzero(under)]
        return sum(end - start for start, end, _ in coalesce(spans, policy.gap_bytes, policy.max_range_bytes))

    @property
    def requests(self) -> int:
        """Tile requests made so far (the directories' reads aside)."""
        return self._ranges.requests

    def _directory_bytes(self) -> int:
        cache = getattr(self._file, "cache", None)
        return int(getattr(cache, "total_requested_bytes", 0))

    def _get_range(self, start: int, end: int) -> bytes:
        return bytes(self._file.fs.cat_file(self._file.path, start=start, end=end))

    def _spans(
        self, lv: _TiledLevel, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None
    ) -> list[Span]:
        tiles = (ty * lv.tiles_across + tx for ty, tx in _tiles_needed(lv, l_x, l_y, width, height, needed))
        return [(lv.offsets[i], lv.bytecounts[i]) for i in tiles]

    def plan_read(
        self, level: int, l_x: int, l_y: int, width: int, height: int, factor: int, needed: Sequence[Rect] | None
    ) -> None:
        """As the direct-tile reader's, and the read's tiles are fetched ahead of it."""
        super().plan_read(level, l_x, l_y, width, height, factor, needed)
        self._ranges.plan(self._spans(self._levels[level], l_x, l_y, width, height, needed))

    def _read(
        self, lv: _TiledLevel, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None, f: int
    ) -> Any:
        self._fetch(self._spans(lv, l_x, l_y, width, height, needed), "a region's tiles")
        return super()._read(lv, l_x, l_y, width, height, needed, f)

    def _fetch(self, spans: list[Span], what: str) -> None:
        try:
            self._ranges.ensure(spans)
        except Exception as exc:  # the store client's own errors too (aiohttp's ClientResponseError, botocore's)
            raise SlideError(self.path, f"{what} cannot be read ({type(exc).__name__})") from exc  # no URL: secrets

    def _tile(
        self,
        level: _TiledLevel,
        index: int,
        factor: int = 1,
        keep: bool = False,
        into: Into | None = None,
        last: bool = False,
    ) -> Any:
        self._fetch([(level.offsets[index], level.bytecounts[index])], f"tile {index}")  # (fetched by _read, as a rule)
        return super()._tile(level, index, factor, keep, into, last)

    def _close_remote(self) -> None:
        if self._closed_bytes is None:
            self._closed_bytes = self._directory_bytes()
        with contextlib.suppress(AttributeError):
            self._tif.close()
        self._file.close()

    def close(self) -> None:
        self._stop_tiles()
        self._ranges.close()
        os.close(self._fd)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._sparse)
        self._close_remote()


def _level_pages(tif: tifffile.TiffFile) -> list[tifffile.TiffPage]:
    """The pyramid's levels as OpenSlide reads SVS and generic TIFF: the tiled pages, largest first.

    Raises:
        SlideError: no tiled page.
    """
    pages = [p for p in tif.pages if isinstance(p, tifffile.TiffPage) and p.is_tiled]
    if not pages:
        raise SlideError(tif.filehandle.name, "no tiled page: read through OpenSlide")
    return sorted(pages, key=lambda p: -p.imagewidth)


def _properties(tif: tifffile.TiffFile) -> Mapping[str, str]:
    """OpenSlide's resolution properties where the file states them: Aperio's ``MPP`` in the first page's
    ImageDescription, else the TIFF resolution tags in centimetres."""
    page = tif.pages.first
    found = _APERIO_MPP.search(page.description or "")
    if found:
        return {"openslide.mpp-x": found.group(1), "openslide.mpp-y": found.group(1)}
    tags = page.tags
    unit, xres, yres = tags.get("ResolutionUnit"), tags.get("XResolution"), tags.get("YResolution")
    if unit is None or int(unit.value) != 3 or xres is None or yres is None:
        return {}
    return {
        f"openslide.mpp-{axis}": repr(10_000 * tag.value[1] / tag.value[0])
        for axis, tag in (("x", xres), ("y", yres))
        if tag.value[0]
    }


def open_in_place(
    url: str, scratch: str, storage_options: StorageOptions | None, *, fast: bool
) -> RemoteTiffReader | None:
    """A URL slide read by range (SVS, pyramidal TIFF), or None when it needs a local copy: the direct-tile path
    is off (``fast`` False), its suffix is another format's, :class:`RemoteTiffReader` cannot read it, or it is
    smaller than :data:`COPY_BELOW_BYTES` (in place cannot win; the copy is read by the same direct-tile reader)."""
    if not (fast and public_location(url).lower().endswith(REMOTE_SUFFIXES)):  # a presigned URL's query aside
        return None
    try:
        return RemoteTiffReader(url, scratch, storage_options, copy_below_bytes=COPY_BELOW_BYTES)
    except SlideError as exc:
        logger.debug("%s is copied: %s", public_location(url), exc.reason)
        return None
