"""The direct-tile backend: SVS and pyramidal TIFF tiles read with tifffile, JPEG tiles decoded by libjpeg-turbo
(simplejpeg, strict: a corrupt-data warning is an error, as in OpenSlide), others by imagecodecs or OpenJPEG.

It decodes the slide's own tiles instead of going through OpenSlide's paint step, and is
used only when every OpenSlide level maps to a tiled 8-bit RGB page of the same size; anything else uses
:class:`~wsishard.slide.openslide_backend.OpenSlideReader`.
"""

from __future__ import annotations

import io
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import simplejpeg
import tifffile
from PIL import Image

from wsishard.errors import SlideError
from wsishard.slide.reader import BACKGROUND, Rect, SlideReader, one_line
from wsishard.slide.tilecache import TILES as TILES
from wsishard.slide.tilecache import TileCache as TileCache

_JPEG = 7  # TIFF compression tag value of (new-style) JPEG
_J2K = frozenset({33005, 34712})  # Aperio JPEG 2000 RGB, standard JPEG 2000: decoded at 1/2, 1/4, 1/8 by OpenJPEG
# Aperio JPEG 2000 YCbCr (33003) is left to OpenSlide: its codestreams hold YCbCr without the JPEG 2000 colour
# transform, which OpenSlide converts and the direct decoders here would not.
_OPENSLIDE_ONLY = frozenset({33003})


@dataclass(frozen=True)
class _TiledLevel:
    page_index: int
    width: int
    height: int
    tile_w: int
    tile_h: int
    tiles_across: int
    offsets: tuple[int, ...]
    bytecounts: tuple[int, ...]
    jpegtables: bytes | None
    jpegheader: bytes | None
    compression: int
    rgb_jpeg: bool = False  # JPEG tiles of RGB, no JFIF marker (Aperio's): read as RGB, as tifffile reads them


def _jpeg_complete(data: bytes) -> bool:
    """Whether a JPEG tile's data holds its end-of-image marker after the start of its scan.

    libjpeg (through imagecodecs) decodes a tile whose data stops early, or whose tail was zeroed, into grey
    garbage after a warning nobody sees; OpenSlide, which makes that warning an error, fails the slide ("Premature
    end of JPEG file"). Entropy-coded data never holds ``FF D9`` (an ``FF`` there is followed by ``00`` or a
    restart marker), so a tile cut or overwritten before its end lacks it. Padding after the marker is allowed.
    Two ``bytes`` searches, from either end: a few microseconds for an intact tile, against a millisecond or more
    to decode it. A tile overwritten in its middle, its end intact, is not caught here: the strict decode refuses it.
    """
    scan = data.find(b"\xff\xda")
    return scan >= 0 and data.rfind(b"\xff\xd9") > scan


def _tiles_needed(
    lv: _TiledLevel, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None
) -> list[tuple[int, int]]:
    """``(ty, tx)`` of the tiles of ``lv`` in the region (clipped to the level) that a rectangle of ``needed``
    overlaps (every one without ``needed``), row by row."""
    x_lo, y_lo = max(l_x, 0), max(l_y, 0)
    x_hi, y_hi = min(l_x + width, lv.width), min(l_y + height, lv.height)
    if x_lo >= x_hi or y_lo >= y_hi:
        return []
    tw, th = lv.tile_w, lv.tile_h
    ty0, ty1, tx0, tx1 = y_lo // th, (y_hi - 1) // th, x_lo // tw, (x_hi - 1) // tw
    if needed is None:
        return [(ty, tx) for ty in range(ty0, ty1 + 1) for tx in range(tx0, tx1 + 1)]
    found: set[tuple[int, int]] = set()
    for rx0, ry0, rx1, ry1 in needed:  # tile tx overlaps [rx0, rx1) iff rx0 // tw <= tx <= (rx1 - 1) // tw
        xs = range(max(rx0 // tw, tx0), min((rx1 - 1) // tw, tx1) + 1)
        found.update((ty, tx) for ty in range(max(ry0 // th, ty0), min((ry1 - 1) // th, ty1) + 1) for tx in xs)
    return sorted(found)


Into = tuple[np.ndarray, tuple[int, int, int, int]]  # (where, (y0, y1, x0, x1)): a part of a tile, written there


def _decode_scaled(data: bytes, level: _TiledLevel, factor: int, into: Into | None = None) -> np.ndarray:
    """A tile decoded at 1/``factor`` scale (1: as stored): JPEG by libjpeg's DCT scaling, JPEG 2000 by OpenJPEG's
    resolution reduction (PIL's ``reduce``). ``into``: a JPEG tile's part is written there, and that array returned."""
    if level.compression == _JPEG:
        if level.jpegtables:  # abbreviated stream: splice the shared tables in
            data = level.jpegtables[:-2] + data[2:]  # (drop their EOI and the tile's SOI)
        return _jpeg_scaled(data, level.tile_w // factor, level.tile_h // factor, factor, level.rgb_jpeg, into)
    with Image.open(io.BytesIO(data), formats=["JPEG2000"]) as image:
        image.reduce = factor.bit_length() - 1  # type: ignore[assignment,method-assign]  # 2**n: n levels
        tile = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    if tile.shape != (level.tile_h // factor, level.tile_w // factor, 3):
        raise ValueError(f"scaled decode gave {tile.shape}")
    return tile


def _jpeg_scaled(
    data: bytes, width: int, height: int, factor: int, rgb: bool = False, into: Into | None = None
) -> np.ndarray:
    """A 3-component JPEG decoded to RGB at 1/``factor`` by libjpeg-turbo, its corrupt-data warnings made errors.

    libjpeg decodes a tile whose entropy-coded data was damaged (overwritten in its middle, its end marker kept)
    into garbage after a warning ("Corrupt JPEG data: ..."); OpenSlide makes that warning an error, and so does this
    decoder: simplejpeg's strict mode raises ``ValueError`` with libjpeg's message. libjpeg reads the colour
    transform from the stream's own markers, except with ``rgb``: the stream holds RGB whatever its markers say (an
    Aperio tile). Where its markers say otherwise, Pillow's decoder (which can be told) decodes it, and a strict
    greyscale decode checks the data (twice the work, for such tiles only). It decodes into an RGBX buffer (one per
    size and thread, reused) and OpenCV packs that into contiguous RGB, or, with ``into`` (``(where, (y0, y1, x0,
    x1))``), packs the tile's rows y0:y1 and columns x0:x1 straight into ``where`` (a view of the caller's region:
    no tile-sized copy in between) and returns ``where``. The pixels are Pillow's (``Image.open`` + ``draft``).
    """
    buf, image = _rgbx_target(width, height)
    if rgb and simplejpeg.decode_jpeg_header(data)[2] != "RGB":
        _pillow_rgb(data, image, factor)
        simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=height, min_width=width, strict=True)
    else:
        got = simplejpeg.decode_jpeg(data, colorspace="RGBX", min_height=height, min_width=width, buffer=buf)
        if got.shape != buf.shape:
            raise ValueError(f"scaled decode gave {got.shape[:2]}, not {(height, width)}")
    if into is not None:
        where, (y0, y1, x0, x1) = into
        # in place; OpenCV would write a new array instead of a `where` of another shape, leaving `where` white
        if (
            where.shape != (y1 - y0, x1 - x0, 3)
            or cv2.cvtColor(buf[y0:y1, x0:x1], cv2.COLOR_RGBA2RGB, dst=where) is not where
        ):
            raise ValueError(f"a tile's part {(y1 - y0, x1 - x0)} does not fit its place {where.shape}")
        return where
    return np.asarray(cv2.cvtColor(buf, cv2.COLOR_RGBA2RGB))  # (h, w, 3), contiguous


def _pillow_rgb(data: bytes, image: Image.Image, factor: int) -> None:
    """Decode a JPEG whose data is RGB (whatever its markers say) at 1/``factor`` into ``image`` (RGBX, mapped on
    a buffer), through Pillow's libjpeg decoder driven directly (what ``Image.open`` + ``draft`` + ``load`` run)."""
    decoder = Image.core.jpeg_decoder("RGBX", "RGB", "RGB", factor, 0)  # mode, rawmode, jpegmode, scale, draft
    decoder.setimage(image.im, (0, 0, *image.size))
    try:
        consumed, err = decoder.decode(data)  # (-1, 0): done; (n >= 0, 0): wants more data; err < 0: an error
    finally:
        decoder.cleanup()
    if err < 0:
        raise ValueError(f"JPEG decoder error {err}")
    if consumed >= 0:
        raise ValueError("truncated JPEG")


_TARGETS = threading.local()  # per thread: {(width, height): (buf, image)}, the decoder's reusable RGBX targets


def _rgbx_target(width: int, height: int) -> tuple[np.ndarray, Image.Image]:
    """This thread's (h, w, 4) uint8 buffer and the Pillow RGBX image mapped on it, for tiles of that size."""
    targets = getattr(_TARGETS, "by_size", None)
    if targets is None:
        targets = _TARGETS.by_size = {}
    found = targets.get((width, height))
    if found is None:
        buf = np.empty((height, width, 4), dtype=np.uint8)  # (h, w, RGBX)
        image = Image.frombuffer("RGBX", (width, height), buf, "raw", "RGBX", 0, 1)  # mapped on buf, not copied
        found = targets[(width, height)] = (buf, image)
    return found


class TiffTileReader(SlideReader):
    """Direct tile decoding of SVS / pyramidal TIFF files with tifffile + imagecodecs.

    Raises:
        SlideError: when the file is not a tiled 8-bit RGB pyramid that matches OpenSlide's levels; callers then
            fall back to :class:`OpenSlideReader`.
    """

    backend = "tifffile"

    def __init__(
        self,
        path: str,
        level_dimensions: tuple[tuple[int, int], ...],
        level_downsamples: tuple[float, ...],
        properties: Mapping[str, str],
    ) -> None:
        self.path = path
        self.level_dimensions = level_dimensions
        self.level_downsamples = level_downsamples
        self.properties = properties
        try:
            self._tif = tifffile.TiffFile(path)
        except Exception as exc:  # tifffile raises many types on foreign files
            raise SlideError(path, f"tifffile cannot open it ({one_line(exc)})") from exc
        try:
            self._levels = [self._match_level(w, h) for w, h in level_dimensions]
        except SlideError:
            self._tif.close()
            raise
        self._fd = os.open(path, os.O_RDONLY)  # tiles are read with one pread each (no seek, no buffer copy)
        self._start_tiles()

    def _start_tiles(self) -> None:
        """The state tile reading keeps: decoders per page, this reader's place in :data:`TILES`, planned reads."""
        self._decoders: dict[int, Callable[..., Any]] = {}
        self._number = TILES.new_reader()  # this reader's tiles in TILES
        self._uses: dict[tuple[int, int], np.ndarray] = {}  # (page, factor): planned reads to come, per tile
        self._planned: Counter[tuple[int, ...]] = Counter()  # (page, x, y, w, h, factor) of the planned reads to come

    def _stop_tiles(self) -> None:
        self._uses.clear()
        self._planned.clear()
        TILES.drop_reader(self._number)

    def _match_level(self, width: int, height: int) -> _TiledLevel:
        """The first tiled, 8-bit, 3-sample RGB/YCbCr page of exactly ``width`` x ``height``."""
        for index, page in enumerate(self._tif.pages):
            if not isinstance(page, tifffile.TiffPage) or (page.imagewidth, page.imagelength) != (width, height):
                continue
            usable = page.is_tiled and page.samplesperpixel == 3 and page.bitspersample == 8
            if not usable or page.planarconfig != 1 or page.photometric not in (2, 6) or page.imagedepth != 1:
                continue  # e.g. an untiled thumbnail page of the same size as a level
            if int(page.compression) in _OPENSLIDE_ONLY:
                raise SlideError(self.path, f"compression {int(page.compression)} is read through OpenSlide")
            return _TiledLevel(
                page_index=index,
                width=width,
                height=height,
                tile_w=page.tilewidth,
                tile_h=page.tilelength,
                tiles_across=math.ceil(width / page.tilewidth),
                offsets=tuple(page.dataoffsets),
                bytecounts=tuple(page.databytecounts),
                jpegtables=page.jpegtables,
                jpegheader=page.jpegheader,
                compression=int(page.compression),
                rgb_jpeg=page.photometric == 2 and not page.is_jfif,
            )
        raise SlideError(self.path, f"no tiled 8-bit RGB page of {width}x{height} for the fast path")

    def _tile(
        self,
        level: _TiledLevel,
        index: int,
        factor: int = 1,
        keep: bool = False,
        into: Into | None = None,
        last: bool = False,
    ) -> np.ndarray | None:
        """Decoded tile ``index`` of ``level``, (tile_h / factor, tile_w / factor, 3) uint8, None if empty; from
        :data:`TILES` if it is there (and taken out if this is its ``last`` planned use), and put there if
        ``keep`` (read-only then). ``into``: a tile neither cached nor kept may be written there instead (its part
        ``(y0, y1, x0, x1)``), and ``into``'s array returned."""
        key = (self._number, level.page_index, index, factor)
        tile = TILES.get(key, last)
        if tile is None:
            tile = self._decode_tile(level, index, factor, None if keep else into)
            if tile is not None and keep:
                tile.flags.writeable = False
                TILES.put(key, tile)
        return tile

    def _decode_tile(self, level: _TiledLevel, index: int, factor: int, into: Into | None = None) -> np.ndarray | None:
        offset, count = level.offsets[index], level.bytecounts[index]
        if count == 0:
            return None
        data = os.pread(self._fd, count, offset)
        if len(data) != count:
            raise SlideError(self.path, f"truncated: tile {index} of page {level.page_index} runs past the end")
        if level.compression == _JPEG and not _jpeg_complete(data):
            raise SlideError(
                self.path,
                f"tile {index} of page {level.page_index} is corrupt: its JPEG data ends "
                "before its end marker (a truncated or overwritten tile)",
            )
        try:
            if factor > 1 or (level.compression == _JPEG and not level.jpegheader):  # strict libjpeg-turbo decode
                return _decode_scaled(data, level, factor, into)
            decode = self._decoders.get(level.page_index)
            if decode is None:
                decode = self._tif.pages[level.page_index].decode
                self._decoders[level.page_index] = decode
            tile, _, _ = decode(data, index, jpegtables=level.jpegtables, jpegheader=level.jpegheader)
        except Exception as exc:  # imagecodecs and PIL raise codec-specific errors
            raise SlideError(
                self.path, f"tile {index} of page {level.page_index} is corrupt ({one_line(exc)})"
            ) from exc
        return np.asarray(tile).reshape(level.tile_h, level.tile_w, 3)

    def tile_bytes(self, level: int) -> tuple[int, int, np.ndarray]:
        """``(tile_w, tile_h, bytes)``: the compressed size of each tile of ``level``, (rows, cols) int64, read from
        the file's directory (nothing decoded): how much detail each part of the slide holds."""
        lv = self._levels[level]
        rows = len(lv.bytecounts) // lv.tiles_across
        counts = np.asarray(lv.bytecounts[: rows * lv.tiles_across], dtype=np.int64)
        return lv.tile_w, lv.tile_h, counts.reshape(rows, lv.tiles_across)

    def read_level(
        self, level: int, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None = None
    ) -> np.ndarray:
        return self._read(self._levels[level], l_x, l_y, width, height, needed, 1)

    def read_level_reduced(
        self, level: int, l_x: int, l_y: int, width: int, height: int, factor: int, needed: Sequence[Rect] | None = None
    ) -> np.ndarray | None:
        """The region reduced ``factor`` times (2, 4 or 8) by decoding tiles at that scale.

        JPEG: libjpeg's scaled decode averages each ``factor`` x ``factor`` pixels on the fly, matching full decoding
        plus box reduction within 1-2 levels at a fraction of the cost. JPEG 2000: OpenJPEG decodes only the
        wavelet's lower resolutions (its low-pass, not a box filter). Returns None when it does not apply (another
        codec, or sizes and offsets not multiples of ``factor``); the caller then reads at full size.
        """
        lv = self._levels[level]
        if not self._reducible(lv, l_x, l_y, width, height, factor):
            return None
        return self._read(lv, l_x, l_y, width, height, needed, factor)

    @staticmethod
    def _reducible(lv: _TiledLevel, l_x: int, l_y: int, width: int, height: int, factor: int) -> bool:
        aligned = all(v % factor == 0 for v in (l_x, l_y, width, height, lv.tile_w, lv.tile_h))
        return factor in (2, 4, 8) and (lv.compression == _JPEG or lv.compression in _J2K) and aligned

    def plan_read(
        self, level: int, l_x: int, l_y: int, width: int, height: int, factor: int, needed: Sequence[Rect] | None
    ) -> None:
        """Announce a coming read: ``read_level_reduced`` with these arguments (``read_level`` for ``factor`` 1,
        and where a reduced read does not apply). A tile that several planned reads share is decoded once and kept
        in :data:`TILES` until its last one, which takes it out; a tile of no planned read is kept as before (on
        a region's edge). Planned reads that never come (another process's) only keep tiles longer: the cache
        drops the least recently used past its size. What is read is the same either way: only what is decoded
        twice changes."""
        lv = self._levels[level]
        f = factor if factor > 1 and self._reducible(lv, l_x, l_y, width, height, factor) else 1
        self._planned[(lv.page_index, l_x, l_y, width, height, f)] += 1
        uses = self._uses.get((lv.page_index, f))
        if uses is None:  # a count per tile of the level: 4 bytes a tile, whatever the number of reads planned
            uses = self._uses[(lv.page_index, f)] = np.zeros(len(lv.offsets), dtype=np.int32)
        for ty, tx in _tiles_needed(lv, l_x, l_y, width, height, needed):
            uses[ty * lv.tiles_across + tx] += 1

    def _read(
        self, lv: _TiledLevel, l_x: int, l_y: int, width: int, height: int, needed: Sequence[Rect] | None, f: int
    ) -> np.ndarray:
        """Region of ``lv`` (level px), reduced by ``f`` (1: as stored); tiles outside ``needed`` stay white."""
        out = np.full((-(-height // f), -(-width // f), 3), BACKGROUND, dtype=np.uint8)  # (h/f, w/f, 3)
        x_lo, y_lo = max(l_x, 0), max(l_y, 0)
        x_hi, y_hi = min(l_x + width, lv.width), min(l_y + height, lv.height)
        if x_lo >= x_hi or y_lo >= y_hi:
            return out
        ty0, ty1 = y_lo // lv.tile_h, (y_hi - 1) // lv.tile_h
        tx0, tx1 = x_lo // lv.tile_w, (x_hi - 1) // lv.tile_w
        read = (lv.page_index, l_x, l_y, width, height, f)
        planned = self._planned.get(read, 0)  # a read nobody planned (a context patch's) leaves the counts alone
        uses = self._uses.get((lv.page_index, f)) if planned else None
        if planned > 1:
            self._planned[read] = planned - 1
        elif planned:
            del self._planned[read]
        ox, oy = l_x // f, l_y // f
        for ty, tx in _tiles_needed(lv, l_x, l_y, width, height, needed):  # the others stay white
            index = ty * lv.tiles_across + tx
            left = 0 if uses is None else int(uses[index])  # planned reads to come, this one included
            if left:
                uses[index] = left - 1  # type: ignore[index]
            edge = ty in (ty0, ty1) or tx in (tx0, tx1)  # unplanned: what a neighbouring region may read too
            t_x0, t_y0 = tx * lv.tile_w, ty * lv.tile_h
            sx0, sy0 = max(x_lo, t_x0) // f, max(y_lo, t_y0) // f
            sx1, sy1 = -(-min(x_hi, t_x0 + lv.tile_w) // f), -(-min(y_hi, t_y0 + lv.tile_h) // f)
            rx, ry = t_x0 // f, t_y0 // f
            where = out[sy0 - oy : sy1 - oy, sx0 - ox : sx1 - ox]
            part = (sy0 - ry, sy1 - ry, sx0 - rx, sx1 - rx)
            tile = self._tile(lv, index, f, keep=left > 1 if left else edge, into=(where, part), last=left == 1)
            if tile is not None and tile is not where:  # (a tile decoded into `where` is there already)
                where[...] = tile[part[0] : part[1], part[2] : part[3]]
        return out

    def close(self) -> None:
        self._stop_tiles()
        os.close(self._fd)
        self._tif.close()
