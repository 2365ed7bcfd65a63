"""Decoding samples straight into uint8 batches, in the DataLoader workers.

The per-sample work is the loader's throughput: each batch's uint8 tensor is allocated once (in shared memory
inside a worker, so the DataLoader passes it to the main process without copying it) and each JPEG is decoded by
libjpeg-turbo straight into its slot; PIL decodes everything else. No per-sample array, no ``np.stack``.
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypedDict

import imagecodecs
import numpy as np
import torch
from PIL import Image

from wsishard.errors import ShardError
from wsishard.format import PatchMeta, image_header
from wsishard.streaming.stages import ErrorMode, RawSample

logger = logging.getLogger(__name__)

_PIL_FORMATS = ["JPEG", "PNG", "WEBP"]


class Sample(TypedDict):
    """A decoded sample."""

    key: str
    shard: str
    image: np.ndarray  # (h, w, 3) uint8 RGB
    meta: PatchMeta
    label: int  # -1 when unlabelled


class Batch(TypedDict):
    """A batch as the workers yield it (pinned by the DataLoader when CUDA is there)."""

    image: torch.Tensor  # (b, h, w, 3) uint8 RGB
    label: torch.Tensor  # (b,) int64, -1 when unlabelled
    meta: list[PatchMeta]
    key: list[str]


def decode_sample(raw: RawSample) -> Sample:
    """Decode one sample on its own: image via PIL (JPEG/PNG/WebP only), ``.json``, ``.cls``.

    Raises:
        ShardError: a field does not decode (names the shard and the sample).
    """
    meta, label = _fields(raw)
    return Sample(key=raw["key"], shard=raw["shard"], image=_pil_rgb(raw), meta=meta, label=label)


def _fields(raw: RawSample) -> tuple[PatchMeta, int]:
    """The sample's ``.json`` and its label (``.cls``, else the json's ``label``, else -1)."""
    try:
        meta = json.loads(raw["meta"])
        label = int(raw["label"]) if raw["label"] is not None else int(meta.get("label", -1))
    except (ValueError, TypeError, AttributeError) as exc:
        raise _undecodable(raw, exc) from exc
    return meta, label


def _pil_rgb(raw: RawSample, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The image decoded by PIL and converted to RGB: (h, w, 3) uint8.

    With ``shape`` (h, w, 3), an image whose header says another size is refused before its pixels are decoded.
    """
    try:
        with Image.open(io.BytesIO(raw["image"]), formats=_PIL_FORMATS) as img:
            if shape is not None and (img.height, img.width) != shape[:2]:
                raise _other_size(raw, img.width, img.height, shape)
            return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))  # (h, w, 3) uint8
    except ShardError:
        raise
    except Image.DecompressionBombError as exc:  # its header declares a huge image
        raise ShardError(raw["shard"], f"sample {raw['key']} is a decompression bomb ({exc})") from exc
    except (OSError, ValueError, SyntaxError, TypeError, AttributeError) as exc:
        raise _undecodable(raw, exc) from exc


def _undecodable(raw: RawSample, exc: BaseException) -> ShardError:
    return ShardError(raw["shard"], f"sample {raw['key']} does not decode ({type(exc).__name__}: {exc})")


def _other_size(raw: RawSample, width: int, height: int, shape: tuple[int, ...]) -> ShardError:
    return ShardError(raw["shard"], f"sample {raw['key']} is {width}x{height} px, not {shape[1]}x{shape[0]} px "
                                    "(the manifest's patch size)")  # fmt: skip


def decode_into(raw: RawSample, slot: np.ndarray) -> None:
    """Decode the sample's image straight into ``slot``, a (h, w, 3) uint8 C-contiguous view.

    The image's header is read first (:func:`wsishard.format.image_header`): an image that is no JPEG, PNG or
    WebP, or whose header declares another size than the slot's (a decompression bomb among them), is refused
    before a single pixel is decoded. A complete baseline or progressive 8-bit 3-channel JPEG is then decoded by
    libjpeg-turbo (imagecodecs) in place, with no intermediate array; its pixels equal PIL's RGB decode (same
    library, same settings). Anything else (PNG, WebP, grayscale or CMYK JPEG, damaged data) goes through PIL,
    which then decides: it decodes (and the result is copied into the slot) or it raises. A JPEG that does not
    end with its EOI marker always goes to PIL: libjpeg-turbo would fill a truncated image with grey after a
    warning, where PIL raises.

    Raises:
        ShardError: the image has another size than ``slot``'s, or does not decode.
    """
    data = raw["image"]
    header = image_header(data)
    if header is None:
        raise ShardError(raw["shard"], f"sample {raw['key']} does not decode (no JPEG, PNG or WebP header)")
    image_format, width, height = header
    if (height, width) != slot.shape[:2]:
        raise _other_size(raw, width, height, slot.shape)
    if image_format == "jpg" and data[-2:] == b"\xff\xd9":
        try:
            imagecodecs.jpeg8_decode(data, out=slot)
            return
        except (imagecodecs.Jpeg8Error, ValueError):  # not 8-bit 3-channel, or damaged
            pass
    image = _pil_rgb(raw, slot.shape)  # (h, w, 3) uint8
    if image.shape != slot.shape:
        raise _other_size(raw, image.shape[1], image.shape[0], slot.shape)
    slot[...] = image


def _empty_batch(shape: tuple[int, ...], shared: bool) -> torch.Tensor:
    """An uninitialised uint8 tensor of ``shape``.

    ``shared`` (in a DataLoader worker): in shared memory from the start, so that handing it to the main
    process passes a file descriptor; a plain tensor would be copied into a new shared segment there.
    Otherwise numpy's allocation, which asks for transparent huge pages: a fresh 50 MB batch then takes
    far fewer page faults than with torch's allocator.
    """
    if shared:
        storage = torch.UntypedStorage._new_shared(math.prod(shape))
        return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
    return torch.from_numpy(np.empty(shape, dtype=np.uint8))


@dataclass(frozen=True)
class DecodeIntoBatches:
    """Decode samples straight into uint8 batches of ``size``; a last incomplete one is kept unless ``drop_last``.

    Each batch's ``(size, h, w, 3)`` tensor is allocated once, in shared memory inside a DataLoader worker,
    and every image is decoded into its own slot of it (:func:`decode_into`): no per-sample array, no stack,
    no copy on the way to the main process. ``image_hw`` is every image's ``(h, w)``: the manifest's patch
    size, never the first sample's.

    Error behaviour: a sample whose image or ``.json`` does not decode, or whose image header declares another
    size than ``image_hw``, raises :class:`~wsishard.errors.ShardError` with ``on_error="raise"`` and is dropped
    (logged) with ``"skip"``; its slot is then taken by the next sample, so it never shows in a batch.
    """

    size: int
    image_hw: tuple[int, int]
    drop_last: bool = True
    on_error: ErrorMode = "raise"

    def __call__(self, src: Iterator[RawSample]) -> Iterator[Batch]:
        shared = torch.utils.data.get_worker_info() is not None
        shape = (*self.image_hw, 3)  # (h, w, 3) of every image
        image = torch.empty(0, dtype=torch.uint8)  # (size, h, w, 3) uint8 being filled; empty between batches
        slots = image.numpy()  # its numpy view
        labels: list[int] = []
        metas: list[PatchMeta] = []
        keys: list[str] = []
        for raw in src:
            try:
                meta, label = _fields(raw)
                if image.numel() == 0:
                    image = _empty_batch((self.size, *shape), shared)
                    slots = image.numpy()
                decode_into(raw, slots[len(keys)])
            except ShardError as exc:
                if self.on_error == "raise":
                    raise
                logger.warning("skipping %s", exc)
                continue
            labels.append(label)
            metas.append(meta)
            keys.append(raw["key"])
            if len(keys) == self.size:
                yield _batch(image, labels, metas, keys)
                image, labels, metas, keys = torch.empty(0, dtype=torch.uint8), [], [], []
        if keys and not self.drop_last:
            yield _batch(image[: len(keys)], labels, metas, keys)


def _batch(image: torch.Tensor, labels: list[int], metas: list[PatchMeta], keys: list[str]) -> Batch:
    label = torch.tensor(labels, dtype=torch.int64)  # (b,)
    return Batch(image=image, label=label, meta=metas, key=keys)
