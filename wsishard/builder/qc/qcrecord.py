"""What a slide's QC picture needs, recorded by its scan, and the picture drawn from it at any later time.

A build records this with every slide it scans (in the slide's scan file, ``OUT/.wsishard/scan/``): the masks the
picture shows (on the detection view's grid), its legend and context squares, the request that read the detection
view, and that view as a small JPEG. The kept patches are the scan's candidates. Drawing then needs only the slide's
view at the picture's size: read from the slide again when it can be (the same picture the build draws with
``--qc``, byte for byte), otherwise drawn on the recorded view (the same picture, coarser).
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from PIL import Image

from wsishard.builder.qc.qc import QcLayers, qc_picture
from wsishard.builder.scan.grid import Candidates
from wsishard.errors import SlideError
from wsishard.slide import SlideReader, read_lowres

logger = logging.getLogger(__name__)

QC_FINEST_UM = 2.0  # QC pictures are read no finer than this many microns per px (a small slide's is small)
_LAYERS = ("tissue", "ink", "dark", "roi", "pigment")
_PREFIX = "qc_"  # the record's arrays in a scan file
_VIEW_QUALITY = 85


@dataclass(frozen=True)
class QcRecord:
    """A slide's QC picture, but for its view of the slide.

    ``l0_per_t_asked``: the level-0 px per px the detection view was read at (asked for; ``layers.l0_per_m`` is
    what it got); ``view_jpeg``: that view (JPEG); ``slide_mpp``: the slide's level-0 mpp; ``footprints``:
    level-0 squares ``(x, y, side)`` of one sample's context fields."""

    layers: QcLayers
    l0_per_t_asked: float
    slide_mpp: float
    legend: tuple[str, ...]
    footprints: tuple[tuple[float, float, float], ...] = ()
    view_jpeg: bytes = b""


def view_jpeg(view: np.ndarray) -> bytes:
    """The detection view (h, w, 3) uint8 RGB as JPEG bytes (a few tens of KB)."""
    ok, data = cv2.imencode(".jpg", view[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, _VIEW_QUALITY])
    return data.tobytes() if ok else b""


def record_arrays(record: QcRecord) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``record`` as plain JSON data and arrays (masks bit-packed) for a scan file (:func:`read_record`'s inverse)."""
    layers = record.layers
    shape = list(layers.tissue.shape)
    arrays = {_PREFIX + name: np.packbits(mask) for name in _LAYERS if (mask := getattr(layers, name)) is not None}
    arrays[_PREFIX + "view"] = np.frombuffer(record.view_jpeg, dtype=np.uint8)
    meta = dict(
        shape=shape,
        l0_per_m=layers.l0_per_m,
        l0_per_t_asked=record.l0_per_t_asked,
        slide_mpp=record.slide_mpp,
        legend=list(record.legend),
        footprints=[list(f) for f in record.footprints],
    )
    return meta, arrays


def is_record_array(name: str) -> bool:
    return name.startswith(_PREFIX)


def read_record(meta: dict[str, Any], arrays: Any) -> QcRecord:
    """The record :func:`record_arrays` gave as ``meta`` and ``arrays`` (an open ``.npz``)."""
    h, w = meta["shape"]
    masks = {
        n: np.unpackbits(arrays[_PREFIX + n], count=h * w).reshape(h, w).astype(bool)
        for n in _LAYERS
        if _PREFIX + n in arrays.files
    }
    layers = QcLayers(l0_per_m=float(meta["l0_per_m"]), **masks)
    return QcRecord(
        layers,
        float(meta["l0_per_t_asked"]),
        float(meta["slide_mpp"]),
        tuple(meta["legend"]),
        tuple((float(x), float(y), float(s)) for x, y, s in meta["footprints"]),
        arrays[_PREFIX + "view"].tobytes(),
    )


def picture_png(
    record: QcRecord, cands: Candidates | None, size_px: int, reader: SlideReader | None, view: np.ndarray | None = None
) -> bytes:
    """The slide's QC picture at about ``size_px`` as PNG bytes.

    Args:
        cands: the slide's kept patches (None: none).
        reader: the open slide, read for a view at the picture's size (None: drawn on the recorded view).
        view: the detection view itself, (h, w, 3) uint8, when at hand (None: read again, or the recorded one).
    """
    l0_per_m = record.layers.l0_per_m
    if reader is not None:
        view, l0_per_v = _view(record, reader, size_px, view)
    else:
        view = np.asarray(Image.open(io.BytesIO(record.view_jpeg)).convert("RGB"))
        l0_per_v = l0_per_m
    l0_x = cands.l0_x if cands is not None else np.zeros(0)
    l0_y = cands.l0_y if cands is not None else np.zeros(0)
    extent = cands.l0_extent if cands is not None else 1
    picture = qc_picture(
        view,
        l0_per_v,
        record.layers,
        l0_x,
        l0_y,
        extent,
        legend=list(record.legend),
        max_side_px=size_px,
        footprints=record.footprints,
    )
    buf = io.BytesIO()
    # a 256-colour palette (1.2 MB instead of 3 at 2000 px); the octree is 4x as fast as median cut, and lighter;
    # zlib level 3: 2.5x as fast as the default 6, for a file about 15% larger
    picture.quantize(256, method=Image.Quantize.FASTOCTREE).save(buf, "PNG", compress_level=3)
    return buf.getvalue()


def _view(record: QcRecord, reader: SlideReader, size_px: int, view: np.ndarray | None) -> tuple[np.ndarray, float]:
    """A view of the slide of about ``size_px`` (the detection view when it is as large) and its level-0 px per px."""
    l0_w, l0_h = reader.level_dimensions[0]
    wanted = max(1.0, max(l0_w, l0_h) / size_px, QC_FINEST_UM / (record.slide_mpp or 1))
    l0_per_v = record.layers.l0_per_m
    if wanted < l0_per_v * 0.9:
        try:
            return read_lowres(reader, wanted, dct_scaled=True)  # a picture: libjpeg's 1/2 will do
        except SlideError as exc:  # a tile no kept patch needs may be corrupt: the slide is not failed for it
            logger.debug("QC view unreadable (%s); the detection view is used", exc.reason)
    if view is None:
        view, l0_per_v = read_lowres(reader, record.l0_per_t_asked)
    return view, l0_per_v
