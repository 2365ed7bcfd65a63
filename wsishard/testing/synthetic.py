"""Seeded synthetic whole-slide images that OpenSlide reads as real ones, with their true tissue masks.

Two layouts are written:

- ``svs``: Aperio-style. Level 0 tiled, an untiled thumbnail page, then the lower levels, all JPEG with the
  Aperio ``ImageDescription`` (``AppMag``, ``MPP``) on level 0. Level tiles are RGB-colourspace JPEG (no
  YCbCr transform, Adobe marker) with the RGB photometric tag, like ``JPEG/RGB`` Aperio files (newer
  scanners write YCbCr); the thumbnail is YCbCr JPEG, which OpenSlide needs for associated images.
  OpenSlide's vendor is ``aperio``.
- ``tiff``: a generic pyramidal TIFF, each level its own tiled page (YCbCr 2x2 JPEG, as libvips writes it)
  with its resolution in pixels per centimetre. OpenSlide's vendor is ``generic-tiff``.

The content (H&E-like tissue with holes and strands, glass, dust specks) comes from
:mod:`wsishard.testing.scene`; this module renders it tile by tile into a pyramid and writes the file. The
true mask is the tissue field's ``> 0`` at the mask pixel centres. Same arguments and seed, same bytes.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tifffile
from PIL import Image

from wsishard.testing.artefacts import Artefacts, make_artefacts
from wsishard.testing.pigment import Pigments, make_pigments
from wsishard.testing.scene import MASK_DOWNSAMPLE, Scene, make_scene, render_tile
from wsishard.testing.tissue_field import tissue_field

logger = logging.getLogger(__name__)

LEVEL_FACTOR = 4  # downsample between pyramid levels
MIN_LEVEL_PX = 1000  # levels are added until the longest side is below this
THUMB_PX = 1024  # longest side of the svs thumbnail page

SlideKind = Literal["svs", "tiff"]
Codec = Literal["jpeg", "jp2k"]


@dataclass(frozen=True)
class SyntheticSlide:
    """A generated slide and its ground truth.

    Attributes:
        path: the slide file.
        width, height: level-0 size in px.
        mpp: level-0 microns per px (the true value, also when the file does not record it).
        mask: (H_m, W_m) bool true tissue mask; dust is not tissue.
        mask_downsample: level-0 px per mask px (mask px ``(i, j)`` covers level-0 rows ``i*d..(i+1)*d``).
        artefacts: the artefact layers at mask resolution (None when the slide has none); ``mask`` excludes
            where they dominate (``artefacts.mask``).
        pigment: (H_m, W_m) bool true pigmented tissue (inside ``mask``; None when the slide has none).
    """

    path: str
    width: int
    height: int
    mpp: float
    mask: np.ndarray
    mask_downsample: float
    artefacts: Artefacts | None = None
    pigment: np.ndarray | None = None


def make_slide(
    path: str | os.PathLike[str],
    *,
    width: int = 4096,
    height: int = 4096,
    mpp: float = 0.25,
    kind: SlideKind | None = None,
    seed: int = 0,
    tissue_fraction: float = 0.3,
    tissue: bool = True,
    dust: bool = True,
    include_mpp: bool = True,
    quality: int = 90,
    tile_px: int = 256,
    codec: Codec = "jpeg",
    artefacts: Sequence[str] = (),
    pigments: Sequence[str] = (),
) -> SyntheticSlide:
    """Write one synthetic slide and return it with its true tissue mask.

    Args:
        path: output file; its suffix picks the layout when ``kind`` is None (``.svs``; ``.tif``/``.tiff``).
        width, height: level-0 size in px, at least 64.
        mpp: level-0 microns per px; the svs ``AppMag`` is ``round(10 / mpp)``.
        kind: ``"svs"`` or ``"tiff"``; None infers it from the suffix.
        seed: non-negative seed; the same arguments and seed give byte-identical files.
        tissue_fraction: fraction of the slide area covered by tissue (0..0.9).
        tissue: False makes a blank slide (glass, noise and maybe dust).
        dust: add a few small dark dust specks on the glass, away from tissue.
        include_mpp: False leaves the resolution out of the file (no ``openslide.mpp-x``).
        quality: JPEG quality 1..100.
        tile_px: tile side in px, a multiple of 16.
        codec: ``"jpeg"``, or ``"jp2k"`` for an Aperio JPEG 2000 svs (compression 33005, RGB; lossy at about
            ``quality / 2`` dB PSNR, as older TCGA slides are); tiff is always JPEG.
        artefacts: kinds of artefacts to add (:data:`~wsishard.testing.artefacts.ARTEFACT_KINDS`: ``ink``,
            ``dots``, ``edge``, ``bubbles``); none by default (the slide is then the same as without them).
        pigments: pigment kinds to add inside the tissue (``melanin``, ``carbon``, ``dense``), kept in the true mask.

    Raises:
        ValueError: a bad argument (the message names it and its value).
    """
    kind = _check_args(path, kind, width, height, mpp, seed, tissue_fraction, quality, tile_px)
    if codec not in ("jpeg", "jp2k") or (codec == "jp2k" and kind != "svs"):
        raise ValueError(f"codec must be 'jpeg', or 'jp2k' for an svs, got {codec!r} for {kind}")
    px_um = mpp * MASK_DOWNSAMPLE
    mask_shape = (math.ceil(height / MASK_DOWNSAMPLE), math.ceil(width / MASK_DOWNSAMPLE))
    frac = tissue_fraction if tissue else 0.0
    field = tissue_field(np.random.default_rng((seed, 1)), mask_shape, px_um, frac)
    arts = make_artefacts(np.random.default_rng((seed, 3)), field, px_um, artefacts) if artefacts else None
    pigs, paint = _pigmented(seed, field, px_um, pigments, arts)
    scene = make_scene(np.random.default_rng((seed, 2)), field, (height, width), mpp, tile_px, dust, *paint)
    if kind == "svs":
        _write_svs(str(path), scene, (height, width), mpp, include_mpp, quality, codec)
    else:
        _write_tiff(str(path), scene, (height, width), mpp, include_mpp, quality)
    logger.debug("wrote %s (%s, %dx%d, seed %d)", path, kind, width, height, seed)
    mask = (field > 0) if arts is None else (field > 0) & ~arts.mask
    pigment = None if pigs is None else pigs.mask & mask
    return SyntheticSlide(str(path), width, height, mpp, mask, float(MASK_DOWNSAMPLE), arts, pigment)


Paint = tuple[np.ndarray | None, np.ndarray | None]  # the scene's pixel factor and carbon-speck weight


def _pigmented(
    seed: int, field: np.ndarray, px_um: float, pigments: Sequence[str], arts: Artefacts | None
) -> tuple[Pigments | None, Paint]:
    """The pigment layers (None without pigment), and the scene's pixel factor (artefacts and smooth pigment) and
    carbon-speck weight, each None when there is none."""
    pigs = make_pigments(np.random.default_rng((seed, 4)), field, px_um, pigments) if pigments else None
    overlay = None if arts is None else arts.factor
    if pigs is not None:
        overlay = pigs.factor if overlay is None else overlay * pigs.factor
    return pigs, (overlay, None if pigs is None or not pigs.carbon.any() else pigs.carbon)


def make_slides(
    folder: str | os.PathLike[str],
    n: int,
    *,
    seed: int = 0,
    width: int = 4096,
    height: int = 4096,
    mpp: float = 0.25,
    kinds: tuple[SlideKind, ...] = ("svs", "tiff"),
    **kw: Any,
) -> list[SyntheticSlide]:
    """Write ``n`` slides ``slide-000.svs``, ``slide-001.tif``, ... (kinds in turn) into ``folder``.

    Slide ``i`` is seeded from ``(seed, i)``; other keyword arguments go to :func:`make_slide`.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    if not kinds or any(k not in ("svs", "tiff") for k in kinds):
        raise ValueError(f"kinds must name 'svs' or 'tiff', got {kinds!r}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    slides: list[SyntheticSlide] = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        name = f"slide-{i:03d}.{'svs' if kind == 'svs' else 'tif'}"
        slide_seed = int(np.random.SeedSequence((seed, i)).generate_state(1)[0])
        slides.append(make_slide(out / name, width=width, height=height, mpp=mpp, kind=kind, seed=slide_seed, **kw))
    return slides


def _check_args(
    path: str | os.PathLike[str],
    kind: SlideKind | None,
    width: int,
    height: int,
    mpp: float,
    seed: int,
    tissue_fraction: float,
    quality: int,
    tile_px: int,
) -> SlideKind:
    """Validate make_slide's arguments and return the layout kind."""
    checks = [
        ("width", width, width >= 64),
        ("height", height, height >= 64),
        ("mpp", mpp, math.isfinite(mpp) and mpp > 0),
        ("seed", seed, seed >= 0),
        ("tissue_fraction", tissue_fraction, 0.0 <= tissue_fraction <= 0.9),
        ("quality", quality, 1 <= quality <= 100),
        ("tile_px", tile_px, tile_px >= 16 and tile_px % MASK_DOWNSAMPLE == 0),
    ]
    for name, value, ok in checks:
        if not ok:
            raise ValueError(f"invalid {name}: {value!r}")
    if kind is not None:
        if kind not in ("svs", "tiff"):
            raise ValueError(f"invalid kind: {kind!r} (expected 'svs' or 'tiff')")
        return kind
    suffix = Path(path).suffix.lower()
    if suffix == ".svs":
        return "svs"
    if suffix in (".tif", ".tiff"):
        return "tiff"
    raise ValueError(f"cannot infer the slide kind from the suffix of {str(path)!r}; pass kind=")


# ---------------------------------------------------------------------------------------------------------
# The pyramid and the writers
# ---------------------------------------------------------------------------------------------------------


def _reduce(img: np.ndarray, factor: int = LEVEL_FACTOR) -> np.ndarray:
    """Block-mean downsample (h, w, 3) uint8 by ``factor``, padding a partial edge block by replication."""
    h, w = img.shape[:2]
    oh, ow = -(-h // factor), -(-w // factor)
    if (oh * factor, ow * factor) != (h, w):
        img = np.pad(img, ((0, oh * factor - h), (0, ow * factor - w), (0, 0)), mode="edge")
    wide = img.astype(np.uint16)
    rows = sum(wide[i::factor] for i in range(1, factor)) + wide[0::factor]  # strided adds beat a reshape-sum
    cols = sum(rows[:, i::factor] for i in range(1, factor)) + rows[:, 0::factor]
    return ((cols + factor * factor // 2) // (factor * factor)).astype(np.uint8)


def _level0_tiles(sc: Scene, shape: tuple[int, int], level1: np.ndarray) -> Iterator[np.ndarray]:
    """Yield level-0 tiles row by row, writing their 4x block means into ``level1``."""
    t, q = sc.tile_px, sc.tile_px // LEVEL_FACTOR
    for ty in range(math.ceil(shape[0] / t)):
        for tx in range(math.ceil(shape[1] / t)):
            tile = render_tile(sc, ty, tx)
            level1[ty * q : (ty + 1) * q, tx * q : (tx + 1) * q] = _reduce(tile)
            yield tile


def _levels(
    sc: Scene, shape: tuple[int, int], write0: Callable[[Iterator[np.ndarray]], None]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Render level 0 through ``write0(tiles)``; return the 4x-reduced view and the lower levels.

    Lower levels are added in 4x steps while the previous level's longest side is at least 1000 px.
    """
    t, q = sc.tile_px, sc.tile_px // LEVEL_FACTOR
    acc = np.empty((math.ceil(shape[0] / t) * q, math.ceil(shape[1] / t) * q, 3), dtype=np.uint8)
    write0(_level0_tiles(sc, shape, acc))
    reduced = acc[: -(-shape[0] // LEVEL_FACTOR), : -(-shape[1] // LEVEL_FACTOR)]
    levels = [reduced] if max(shape) >= MIN_LEVEL_PX else []
    while levels and max(levels[-1].shape[:2]) >= MIN_LEVEL_PX:
        levels.append(_reduce(levels[-1]))
    return reduced, levels


def _jpeg_args(kind: SlideKind, quality: int) -> dict[str, Any]:
    """tifffile arguments for Aperio-style RGB JPEG (svs) or YCbCr 2x2 JPEG (tiff)."""
    if kind == "svs":
        args = {"level": quality, "outcolorspace": "RGB"}
        return {"compression": "jpeg", "compressionargs": args, "subsampling": (1, 1), "photometric": "rgb"}
    return {"compression": "jpeg", "compressionargs": {"level": quality}, "photometric": "rgb"}


def _jp2k_args(quality: int) -> dict[str, Any]:
    """tifffile arguments for Aperio JPEG 2000 RGB tiles (compression 33005), lossy at about quality / 2 dB."""
    return {"compression": 33005, "compressionargs": {"level": max(20, quality // 2)}, "photometric": "rgb"}


def _write_svs(
    path: str, sc: Scene, shape: tuple[int, int], mpp: float, include_mpp: bool, quality: int, codec: Codec = "jpeg"
) -> None:
    """Write an Aperio-style svs: level 0, thumbnail, lower levels."""
    h, w = shape
    t = sc.tile_px
    head = f"Aperio Image Library v12.0.0 \r\n{w}x{h} [0,0 {w}x{h}] ({t}x{t})"
    name = "JPEG/RGB" if codec == "jpeg" else "J2K/KDU"
    desc = f"{head} {name} Q={quality}|AppMag = {round(10 / mpp)}"
    desc += f"|MPP = {mpp:g}" if include_mpp else ""
    jpeg = _jpeg_args("svs", quality) if codec == "jpeg" else _jp2k_args(quality)
    common: dict[str, Any] = {"metadata": None, "maxworkers": 1}
    with tifffile.TiffWriter(path, bigtiff=3 * h * w > 2**31) as tw:

        def write0(tiles: Iterator[np.ndarray]) -> None:
            tw.write(tiles, shape=(h, w, 3), dtype=np.uint8, tile=(t, t), description=desc, **jpeg, **common)

        reduced, levels = _levels(sc, shape, write0)
        src = next((lv for lv in reversed(levels) if max(lv.shape[:2]) >= THUMB_PX), reduced)
        scale = min(THUMB_PX, max(src.shape[:2])) / max(shape)
        tw_, th_ = max(1, round(w * scale)), max(1, round(h * scale))
        thumb = np.asarray(Image.fromarray(np.ascontiguousarray(src)).resize((tw_, th_), Image.Resampling.BOX))
        thumb_jpeg = _jpeg_args("tiff", quality)  # untiled, YCbCr JPEG strips
        tw.write(thumb, description=f"{head} -> {tw_}x{th_} - ", **thumb_jpeg, **common)
        for lv in levels:
            lh, lw = lv.shape[:2]
            ldesc = f"{head} -> {lw}x{lh} {name} Q={quality}"
            tw.write(lv, tile=(t, t), description=ldesc, **jpeg, **common)


def _write_tiff(path: str, sc: Scene, shape: tuple[int, int], mpp: float, include_mpp: bool, quality: int) -> None:
    """Write a generic pyramidal TIFF, each level a tiled page with its resolution in px/cm."""
    h, w = shape
    t = sc.tile_px
    jpeg = _jpeg_args("tiff", quality)

    def res(level_shape: tuple[int, ...]) -> dict[str, Any]:
        if not include_mpp:
            return {}
        sy, sx = h / level_shape[0], w / level_shape[1]
        return {"resolution": (1e4 / (mpp * sx), 1e4 / (mpp * sy)), "resolutionunit": "CENTIMETER"}

    common: dict[str, Any] = {"metadata": None, "maxworkers": 1}
    with tifffile.TiffWriter(path, bigtiff=3 * h * w > 2**31) as tw:

        def write0(tiles: Iterator[np.ndarray]) -> None:
            tw.write(tiles, shape=(h, w, 3), dtype=np.uint8, tile=(t, t), **jpeg, **res(shape), **common)

        for lv in _levels(sc, shape, write0)[1]:
            tw.write(lv, tile=(t, t), subfiletype=1, **jpeg, **res(lv.shape), **common)
