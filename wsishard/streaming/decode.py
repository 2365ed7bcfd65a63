"""Decoding samples straight into uint8 batches, in the DataLoader workers.

The per-sample work is the loader's throughput: each batch is a uint8 buffer of the reader's ring
(:mod:`wsishard.streaming.ring`: in shared memory inside a worker, so the DataLoader passes it to the main process
without copying it, and under the loader filled again once the loop has taken the next batch) and each JPEG is
decoded by libjpeg-turbo straight into its slot; PIL decodes everything else. No per-sample array, no ``np.stack``.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict, overload

import imagecodecs
import numpy as np
import torch
from PIL import Image

from wsishard.errors import ShardError
from wsishard.format import LABEL_RANGE, PatchMeta, image_header, patch_meta
from wsishard.streaming.context import decode_context_into
from wsishard.streaming.ring import BatchBuffers, Handed, Lending, Lent
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
    meta: Metas  # a sequence of PatchMeta dicts, each parsed when first read
    key: list[str]
    context: NotRequired[torch.Tensor]  # (b, K, h', w', 3) uint8 RGB: builds with K context scales only


class Metas(Sequence[PatchMeta]):
    """The ``.json`` of each sample of a batch: a read-only sequence of :class:`~wsishard.format.PatchMeta` dicts,
    each parsed from its JSON text the first time it is read (and then kept: the same dict every time).

    A worker checks every sample's JSON before its batch is made (a sample whose JSON does not parse is an error
    there, or skipped), but builds no dict: most training loops never read them, and building and sending them
    costs the worker and the main process time. ``list(batch["meta"])`` gives a plain list (for
    ``json.dumps``, ``torch.save`` with ``weights_only``, or to append to). Items that are not ``bytes`` are taken
    as already parsed: PyTorch's ``pin_memory`` and ``default_convert`` rebuild a sequence from its items.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[bytes | PatchMeta]) -> None:
        self._items: list[Any] = list(items)  # each sample's .json text (UTF-8 bytes) until read, then its value

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> PatchMeta: ...

    @overload
    def __getitem__(self, i: slice) -> list[PatchMeta]: ...

    def __getitem__(self, i: int | slice) -> PatchMeta | list[PatchMeta]:
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        item = self._items[i]
        if isinstance(item, bytes):  # a JSON text is never bytes once parsed
            item = self._items[i] = patch_meta(json.loads(item.decode("utf-8")))
        return item

    def __iter__(self) -> Iterator[PatchMeta]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Metas, list)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable contents, as a list's

    def __repr__(self) -> str:
        return f"Metas({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return Metas, (self._items,)  # texts not yet read cross as texts, dicts read (maybe changed) as dicts


def _fields(raw: RawSample) -> tuple[PatchMeta, int]:
    """The sample's ``.json`` (UTF-8, as wsishard writes it) and its label (``.cls``, else the json's ``label``,
    else -1), an int64."""
    try:
        meta = patch_meta(json.loads(raw["meta"].decode("utf-8")))
        if not isinstance(meta, dict):
            raise TypeError(f".json is {str(meta)[:60]}, not a JSON object")
        if not isinstance(meta.get("slide_id", ""), str):
            raise TypeError(f".json's slide_id is {str(meta['slide_id'])[:60]}, not text")
        label = int(raw["label"]) if raw["label"] is not None else int(meta.get("label", -1))
    except (ValueError, TypeError, AttributeError, RecursionError, OverflowError) as exc:
        raise _undecodable(raw, exc) from exc  # RecursionError: JSON nested too deep; OverflowError: a label of inf
    return meta, _in_range(raw, label)


def _in_range(raw: RawSample, label: int) -> int:
    """``label`` when a batch's int64 labels can hold it."""
    if label not in LABEL_RANGE:
        text = str(label) if len(str(label)) <= 24 else f"{str(label)[:12]}...({len(str(label))} digits)"
        raise ShardError(raw["shard"], f"sample {raw['key']} does not decode (label {text} is outside int64)")
    return label


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
    return ShardError(
        raw["shard"],
        f"sample {raw['key']} is {width}x{height} px, not {shape[1]}x{shape[0]} px (the manifest's patch size)",
    )


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
        _jpeg_into(raw, slot)
    else:
        _pil_into(raw, slot)


def _pil_into(raw: RawSample, slot: np.ndarray) -> None:
    """The image decoded by PIL (which decides: it decodes or raises) and copied into ``slot``."""
    image = _pil_rgb(raw, slot.shape)  # (h, w, 3) uint8
    if image.shape != slot.shape:
        raise _other_size(raw, image.shape[1], image.shape[0], slot.shape)
    slot[...] = image


@dataclass(frozen=True)
class DecodeIntoBatches:
    """Decode samples straight into uint8 batches of ``size``; a last incomplete one is kept unless ``drop_last``.

    Each batch's ``(size, h, w, 3)`` tensor is a buffer of a :class:`~wsishard.streaming.ring.BatchBuffers` ring
    (in shared memory inside a DataLoader worker, where the batch (a :class:`Handed`) carries a ``ticket`` that
    :class:`~wsishard.streaming.loader.ShardLoader` takes off and hands back at the loop's next batch), and every
    image is decoded into its own slot of it (:func:`decode_into`): no per-sample array, no stack, no copy on the
    way to the main process, no fresh pages per batch. ``image_hw`` is every image's ``(h, w)``: the manifest's
    patch size, never the first sample's. With ``lending.by_reference`` (set by ``ShardLoader`` for its workers, which
    complete the batch in the main process) a worker's batch names its buffer instead of carrying it
    (:class:`~wsishard.streaming.ring.Lent`): no ``"image"``, and ``"label"`` as a numpy array (a tensor would
    travel through a shared-memory file of its own).

    Error behaviour: a sample whose image or ``.json`` does not decode, or whose image header declares another
    size than ``image_hw``, raises :class:`~wsishard.errors.ShardError` with ``on_error="raise"`` and is dropped
    (logged) with ``"skip"``; its slot is then taken by the next sample, so it never shows in a batch. So does a
    sample whose context member (``context``: ``(K, size)`` of a build with context) is no image of that size or
    does not decode.
    """

    size: int
    image_hw: tuple[int, int]
    drop_last: bool = True
    on_error: ErrorMode = "raise"
    lending: Lending = field(default_factory=Lending)
    context: tuple[int, int] | None = None

    def __call__(self, src: Iterator[RawSample]) -> Iterator[Batch]:
        shared = torch.utils.data.get_worker_info() is not None
        ctx_shape = None if self.context is None else (self.size, self.context[0], self.context[1], self.context[1], 3)
        buffers = BatchBuffers(
            (self.size, *self.image_hw, 3), shared=shared, lending=self.lending, context_shape=ctx_shape
        )
        image: torch.Tensor | None = None  # (size, h, w, 3) uint8 being filled; None between batches
        lent: Lent | None = None
        slots = np.empty((0, *self.image_hw, 3), dtype=np.uint8)  # image's numpy view
        ctx_slots = np.empty((0,), dtype=np.uint8)  # (size, K, h', w', 3): the context's numpy view
        labels: list[int] = []
        metas: list[bytes] = []  # each sample's .json text: parsed in the main process, when read (Metas)
        keys: list[str] = []
        for raw in src:
            try:
                if image is None:
                    image, lent = buffers.take()
                    slots = image.numpy()
                    ctx_slots = buffers.context_of(image).numpy() if ctx_shape else ctx_slots
                label = checked_label(raw)
                decode_into(raw, slots[len(keys)])
                if ctx_shape:
                    decode_context_into(raw, ctx_slots[len(keys)], decode_into)
            except ShardError as exc:
                if self.on_error == "raise":
                    raise
                logger.warning("skipping %s", exc)
                continue
            labels.append(label)
            metas.append(raw["meta"])
            keys.append(raw["key"])
            if len(keys) == self.size:
                yield _batch(buffers, image, labels, metas, keys, lent)
                image, lent, labels, metas, keys = None, None, [], [], []
        if keys and image is not None and not self.drop_last:
            yield _batch(buffers, image, labels, metas, keys, lent, len(keys))


def checked_label(raw: RawSample) -> int:
    """The sample's label (``.cls``, else the JSON's ``label``, else -1), its ``.json`` checked (parsed; the dict is
    dropped: :class:`Metas` parses it again only where the training loop reads it).

    Raises:
        ShardError: the ``.json`` or ``.cls`` does not decode.
    """
    return _fields(raw)[1]


def _jpeg_into(raw: RawSample, slot: np.ndarray) -> None:
    """A JPEG of the slot's size ending with EOI (its header read by :func:`decode_into`) decoded
    into ``slot`` by libjpeg-turbo; if libjpeg-turbo refuses it (not 8-bit 3-channel, damaged), PIL decides."""
    try:
        imagecodecs.jpeg8_decode(raw["image"], out=slot)
    except (imagecodecs.Jpeg8Error, ValueError):
        _pil_into(raw, slot)


def _batch(
    buffers: BatchBuffers,
    full: torch.Tensor,
    labels: list[int],
    metas: list[bytes],
    keys: list[str],
    lent: Lent | None,
    n: int | None = None,
) -> Batch:
    """The batch of the first ``n`` (all) samples of the buffer whose images are ``full``, and their context."""
    image = full if n is None else full[:n]
    context = None if buffers.context_shape is None else buffers.context_of(full)[: len(keys)]
    if lent is None:
        made = Batch(image=image, label=torch.tensor(labels, dtype=torch.int64), meta=Metas(metas), key=keys)
        if context is not None:
            made["context"] = context
        return made
    sent, lent = buffers.hand_over(image, lent, context)
    # by reference (no image sent): the loader puts the image (and context) back and makes the labels (b,) a tensor
    label = np.array(labels, dtype=np.int64) if sent is None else torch.tensor(labels, dtype=torch.int64)
    batch = Handed(label=label, meta=Metas(metas), key=keys)
    batch.ticket = lent
    if sent is not None:
        batch["image"] = sent
        if context is not None:
            batch["context"] = context
    return batch  # type: ignore[return-value]


@dataclass(frozen=True)
class EncodedBatches:
    """Batch samples without decoding them, for ``loader(..., decode="device")``: each batch carries its samples'
    JPEG bytes (``"jpeg"``, a list) where :class:`DecodeIntoBatches` would carry pixels, and
    :class:`~wsishard.streaming.collate.GpuCollate` decodes them on the GPU. Every sample is checked as there (its
    ``.json``, its label, its image's header: a JPEG of ``image_hw``); one that is no such JPEG raises
    :class:`~wsishard.errors.ShardError` with ``on_error="raise"`` and is dropped (logged) with ``"skip"``."""

    size: int
    image_hw: tuple[int, int]
    drop_last: bool = True
    on_error: ErrorMode = "raise"

    def __call__(self, src: Iterator[RawSample]) -> Iterator[dict[str, Any]]:
        height, width = self.image_hw
        jpegs: list[bytes] = []
        labels: list[int] = []
        metas: list[bytes] = []
        keys: list[str] = []
        for raw in src:
            try:
                label = checked_label(raw)
                header = image_header(raw["image"])
                if header is None or header[0] != "jpg" or (header[2], header[1]) != (height, width):
                    raise ShardError(
                        raw["shard"],
                        f"sample {raw['key']} is no {width}x{height} JPEG: decode='device' decodes JPEG only",
                    )
            except ShardError as exc:
                if self.on_error == "raise":
                    raise
                logger.warning("skipping %s", exc)
                continue
            jpegs.append(bytes(raw["image"]))
            labels.append(label)
            metas.append(raw["meta"])
            keys.append(raw["key"])
            if len(keys) == self.size:
                yield _encoded(jpegs, labels, metas, keys)
                jpegs, labels, metas, keys = [], [], [], []
        if keys and not self.drop_last:
            yield _encoded(jpegs, labels, metas, keys)


def _encoded(jpegs: list[bytes], labels: list[int], metas: list[bytes], keys: list[str]) -> dict[str, Any]:
    return {"jpeg": jpegs, "label": torch.tensor(labels, dtype=torch.int64), "meta": Metas(metas), "key": keys}


def device_decoder() -> Callable[[list[bytes], torch.device], torch.Tensor]:
    """torchvision's batched ``decode_jpeg`` on CUDA, as ``(jpegs, device) -> (b, h, w, 3) uint8`` on ``device``.

    Raises:
        ValueError: no CUDA device, or no torchvision (imported here, on first use: it is no dependency).
    """
    if not torch.cuda.is_available():
        raise ValueError(
            "decode='device' decodes JPEGs on a CUDA GPU, and torch sees none here: use decode='worker' (the default)"
        )
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as exc:
        raise ValueError(
            f"decode='device' needs torchvision (the build matching torch {torch.__version__}): "
            f"pip install torchvision ({exc})"
        ) from exc

    def decode(jpegs: list[bytes], device: torch.device) -> torch.Tensor:
        data = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
        images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)  # b x (3, h, w) uint8
        return torch.stack(images).permute(0, 2, 3, 1)  # (b, h, w, 3) uint8 view

    return decode


def decode_mode(decode: str) -> str:
    """``decode`` checked: ``"worker"``, or ``"device"`` where it can run (:func:`device_decoder`).

    Raises:
        ValueError: another value, or ``"device"`` without CUDA or torchvision.
    """
    if decode not in ("worker", "device"):
        raise ValueError(f"decode must be 'worker' or 'device', got {decode!r}")
    if decode == "device":
        device_decoder()
    return decode
