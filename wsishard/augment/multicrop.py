"""Multi-crop views on the training device (``GpuCollate(crops=MultiCrop(...))``), as DINOv2's pretraining uses.

Every image of a batch gives ``global_crops`` large and ``local_crops`` small views. Each view is a random-resized
crop with torchvision's ``RandomResizedCrop`` rules (an area fraction drawn from ``scale``, an aspect ratio drawn
log-uniformly from (3/4, 4/3), a uniform position; after 10 tries that do not fit, a centre crop), resized by
antialiased bilinear filtering (``torch.nn.functional.interpolate(..., antialias=True)``'s weights).

The resize runs batched. Each view's filter is separable: a ``(size, H)`` weight matrix for the rows and a
``(size, W)`` one for the columns. The matrices are zero outside the crop and hold that crop's antialiasing weights
inside it, so every view of every image comes from two batched matrix products, with no Python loop over the batch.
Each view then gets its own dihedral transform (with ``augment=True``) and, under ``stain=`` jitter options, its own
HED and colour jitter. Normalisation (Macenko, Reinhard) runs once per image, before cropping. The same torch code
runs on a CPU and a CUDA device.

Random parameters come from ``np.random.default_rng((seed, batch, tag, kind))`` (``kind`` 0 for the global views,
1 for the local ones): the collate's seed and batch number, as its other draws.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from wsishard.augment import stain as stain_ops

if TYPE_CHECKING:  # the collate imports this module
    from wsishard.streaming.collate import GpuCollate

__all__ = ["MultiCrop", "crop_boxes", "crop_codes", "resize_taps", "resized_crops", "views"]

_TAG_CROPS = 0xC407  # the views' random stream: np.random.default_rng((seed, batch, _TAG_CROPS, kind))
_RATIO = (3.0 / 4.0, 4.0 / 3.0)  # the aspect-ratio range (width / height), as torchvision's default
_TRIES = 10  # torchvision's tries before the centre-crop fallback
KINDS = ("global", "local")


@dataclass(frozen=True, kw_only=True)
class MultiCrop:
    """The multi-crop views ``GpuCollate(crops=...)`` makes of every image (DINOv2's defaults).

    Attributes:
        global_crops: global views per image (at least 1).
        global_size: side of a global view, in output pixels.
        global_scale: (min, max) fraction of the image's area a global view covers, in (0, 1].
        local_crops: local views per image (0: none).
        local_size: side of a local view, in output pixels.
        local_scale: (min, max) fraction of the image's area a local view covers, in (0, 1].

    Raises:
        ValueError: a count or size that is not an integer in range, or a scale that is not two fractions
            ``0 < min <= max <= 1``, naming the field and its value.
    """

    global_crops: int = 2
    global_size: int = 224
    global_scale: tuple[float, float] = (0.32, 1.0)
    local_crops: int = 8
    local_size: int = 96
    local_scale: tuple[float, float] = (0.05, 0.32)

    def __post_init__(self) -> None:
        for name, least in (("global_crops", 1), ("local_crops", 0), ("global_size", 1), ("local_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"MultiCrop {name} must be an integer >= {least}, got {value!r}")
        for name in ("global_scale", "local_scale"):
            value = getattr(self, name)
            if not _fractions(value):
                raise ValueError(f"MultiCrop {name} must be (min, max) with 0 < min <= max <= 1, got {value!r}")

    def kind(self, kind: str) -> tuple[int, int, tuple[float, float]]:
        """(crops, size, scale) of the ``"global"`` or ``"local"`` views."""
        return getattr(self, f"{kind}_crops"), getattr(self, f"{kind}_size"), getattr(self, f"{kind}_scale")


def _fractions(value: object) -> bool:
    """Whether ``value`` is two finite numbers ``0 < min <= max <= 1``."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return False
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        return False
    return 0.0 < value[0] <= value[1] <= 1.0


def crop_boxes(
    seed: int, batch: int, kind: int, n: int, b: int, height: int, width: int, scale: tuple[float, float]
) -> np.ndarray:
    """Random-resized-crop boxes of ``n`` views of ``b`` images of ``height`` x ``width`` pixels.

    torchvision's rules, vectorised: per view, up to 10 tries of an area ``U(scale) * height * width`` and an aspect
    ratio ``exp(U(log 3/4, log 4/3))``; the first try whose rounded box fits is placed uniformly; none fitting gives
    the centre crop of the image, its aspect ratio clamped to the range.

    Returns:
        (n, b, 4) int64: each view's top, left, height, width, in the image's pixels.
    """
    rng = np.random.default_rng((seed, batch, _TAG_CROPS, kind))
    area = height * width * rng.uniform(scale[0], scale[1], (n, b, _TRIES))
    aspect = np.exp(rng.uniform(math.log(_RATIO[0]), math.log(_RATIO[1]), (n, b, _TRIES)))
    w = np.round(np.sqrt(area * aspect)).astype(np.int64)  # (n, b, tries)
    h = np.round(np.sqrt(area / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.argmax(axis=-1)[..., None]  # (n, b, 1): the first try that fits (0 where none does)
    h, w = np.take_along_axis(h, first, -1)[..., 0], np.take_along_axis(w, first, -1)[..., 0]
    where = rng.uniform(0.0, 1.0, (2, n, b))
    top = np.floor(where[0] * (height - h + 1)).astype(np.int64)
    left = np.floor(where[1] * (width - w + 1)).astype(np.int64)
    boxes = np.stack([top, left, h, w], axis=-1)  # (n, b, 4)
    missed = ~fits.any(axis=-1)
    if missed.any():
        boxes[missed] = _centre_box(height, width)
    return boxes


def _centre_box(height: int, width: int) -> tuple[int, int, int, int]:
    """torchvision's fallback: the centre crop, its aspect ratio clamped to the range."""
    ratio = width / height
    if ratio < _RATIO[0]:
        w, h = width, round(width / _RATIO[0])
    elif ratio > _RATIO[1]:
        h, w = height, round(height * _RATIO[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def crop_codes(seed: int, batch: int, kind: int, n: int, b: int) -> np.ndarray:
    """(n, b) dihedral codes in [0, 8) of the views (drawn after the boxes, from the views' own stream)."""
    rng = np.random.default_rng((seed, batch, _TAG_CROPS, kind, 1))
    return rng.integers(0, 8, (n, b))


def resize_taps(start: np.ndarray, length: np.ndarray, size: int, extent: int) -> tuple[np.ndarray, np.ndarray]:
    """Each crop's antialiased bilinear resize along one axis, as ``k`` taps per output pixel (on the host: a few
    hundred kilobytes a batch, cheaper there than as many small device operations).

    ``interpolate(mode="bilinear", antialias=True, align_corners=False)``'s weights for ``length`` input pixels to
    ``size`` output pixels: output ``i`` centred at ``c = (i + 0.5) * length / size`` of the crop, a triangle filter
    widened by the scale when it shrinks, on pixels ``[floor(c - support + 0.5), floor(c + support + 0.5))`` of the
    crop, normalised to sum 1.

    Args:
        start: (m,) int64 each crop's first pixel along the axis, in the image's pixels.
        length: (m,) int64 each crop's length along the axis, in pixels.
        size: output pixels along the axis.
        extent: the image's pixels along the axis.

    Returns:
        (m, size, k) int64 image pixels and (m, size, k) float32 weights; a tap past the filter's end has weight 0
        (and a pixel inside the image).
    """
    scale = (length.astype(np.float64) / size).reshape(-1, 1, 1)  # (m, 1, 1) input pixels per output pixel
    support = np.maximum(scale, 1.0)  # the triangle's half-width, in input pixels
    k = math.ceil(2.0 * max(float(length.max()) / size, 1.0)) + 1  # taps enough for the widest filter
    centre = scale * (np.arange(size, dtype=np.float64).reshape(1, -1, 1) + 0.5)  # (m, size, 1)
    low = np.maximum(np.floor(centre - support + 0.5), 0.0)
    high = np.minimum(np.floor(centre + support + 0.5), length.reshape(-1, 1, 1))
    j = low + np.arange(k, dtype=np.float64)  # (m, size, k) pixels of the crop
    w = np.maximum(1.0 - np.abs((j - centre + 0.5) / support), 0.0) * (j < high)
    w /= w.sum(axis=-1, keepdims=True)
    pixel = np.minimum(j + start.reshape(-1, 1, 1), extent - 1).astype(np.int64)
    return pixel, w.astype(np.float32)


def _filter(
    start: np.ndarray,
    length: np.ndarray,
    flip: np.ndarray,
    block: np.ndarray,
    shape: tuple[int, int, int],
    dev: torch.device,
) -> torch.Tensor:
    """The sparse (CSR) matrix of one axis's taps for every view: view ``q``'s output pixel ``p`` (row ``q * size + p``,
    reversed where ``flip[q]``) takes its taps' weights of the input rows ``block[q] * extent + pixel``.

    ``shape``: (size, extent, input rows).
    """
    size, extent, rows = shape
    pixel, weight = resize_taps(start, length, size, extent)  # (views, size, k)
    pixel[flip], weight[flip] = pixel[flip, ::-1], weight[flip, ::-1]
    pixel += block.reshape(-1, 1, 1) * extent
    k = pixel.shape[-1]
    crow = np.arange(0, pixel.size + 1, k, dtype=np.int64)
    with warnings.catch_warnings():  # torch's one-time notice that sparse CSR support is in beta
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
        return torch.sparse_csr_tensor(
            torch.from_numpy(crow).to(dev),
            torch.from_numpy(pixel.reshape(-1)).to(dev),
            torch.from_numpy(weight.reshape(-1)).to(dev),
            (pixel.shape[0] * size, rows),
            check_invariants=False,
        )


def resized_crops(x: torch.Tensor, boxes: np.ndarray, size: int, codes: np.ndarray) -> torch.Tensor:
    """Every box of every image, resized to ``size`` x ``size`` and moved by its dihedral code: two sparse-by-dense
    matrix products (the rows' taps, then the columns'), every view of every image at once.

    A code's flips reverse the order of a filter's output pixels (free); its transpose picks the output's strides.

    Args:
        x: (b, h, w, 3) float32 images, channels last.
        boxes: (n, b, 4) int64 top, left, height, width of each view (:func:`crop_boxes`).
        size: output side, in pixels.
        codes: (n, b) int64 dihedral codes (:func:`~wsishard.streaming.collate.dihedral`'s).

    Returns:
        (n * b, 3, size, size) float32 on ``x``'s device, view-major (view ``v`` of image ``i`` at ``v * b + i``).
    """
    b, h, w, _ = x.shape
    n, dev = boxes.shape[0], x.device
    if n * b == 0:
        return x.new_empty((n * b, 3, size, size))
    code = codes.reshape(-1)  # view-major
    turn, flip_w, flip_h = (code & 1).astype(bool), (code & 2).astype(bool), (code & 4).astype(bool)
    # transposed: the result's rows are the columns' output, so each flip reverses the other filter
    flip_rows, flip_cols = np.where(turn, flip_w, flip_h), np.where(turn, flip_h, flip_w)
    mine = boxes.transpose(1, 0, 2).reshape(b * n, 4)  # image-major: the first product's rows follow x's images
    m, q = np.arange(b * n), np.arange(n * b)
    rows = _filter(mine[:, 0], mine[:, 2], flip_rows.reshape(n, b).T.reshape(-1), m // n, (size, h, b * h), dev)
    t = rows @ x.reshape(b * h, w * 3)  # (b * n * size, w * 3): each view's rows, filtered
    t = t.view(b * n, size, w, 3).transpose(1, 2).reshape(b * n * w, size * 3)  # (b * n * w, y * 3)
    flat = boxes.reshape(n * b, 4)
    cols = _filter(flat[:, 1], flat[:, 3], flip_cols, (q % b) * n + q // b, (size, w, b * n * w), dev)
    out = (cols @ t).view(n * b, size, size, 3)  # (view, x, y, 3)
    plain, turned = out.permute(0, 3, 2, 1), out.permute(0, 3, 1, 2)  # (view, 3, y, x), (view, 3, x, y)
    laid_out = torch.empty((n * b, 3, size, size), device=dev)  # written once, contiguous, by the choice
    turned_views = torch.from_numpy(turn).to(dev).view(-1, 1, 1, 1)
    return torch.where(turned_views, turned, plain, out=laid_out)


def views(collate: GpuCollate, image: torch.Tensor, slide_ids: Sequence[str] | None) -> dict[str, torch.Tensor]:
    """uint8 (b, h, w, 3) on any device -> ``{"global": (G, b, 3, S, S), "local": (L, b, 3, s, s)}``, normalized,
    in ``collate.dtype`` on ``collate.device``, with batch number ``collate.batches``'s random parameters."""
    crops = collate.crops
    if crops is None:
        raise ValueError("views need GpuCollate(crops=MultiCrop(...))")
    if image.dtype != torch.uint8 or image.dim() != 4 or image.shape[-1] != 3:
        raise ValueError(f"expected a uint8 (b, h, w, 3) batch, got {image.dtype} {tuple(image.shape)}")
    b, h, w, _ = image.shape
    x = image.to(collate.device, non_blocking=True).float().div_(255)  # (b, h, w, 3) float32 in [0, 1]
    options = collate.stain
    if options is not None and options.normalize is not None:  # once per image, before cropping
        x = _normalised(x, options, collate, slide_ids)
    out = {}
    for kind, name in enumerate(KINDS):
        n, size, scale = crops.kind(name)
        boxes = crop_boxes(collate.seed, collate.batches, kind, n, b, h, w, scale)
        codes = crop_codes(collate.seed, collate.batches, kind, n, b) if collate.augment else np.zeros((n, b), int)
        v = resized_crops(x, boxes, size, codes)
        if options is not None and options.jitters:
            jitter = replace(options, normalize=None, slides=None)
            seed = int(np.random.default_rng((collate.seed, _TAG_CROPS, kind, 2)).integers(2**63))
            v = stain_ops.apply(v.contiguous(), jitter, seed=seed, batch=collate.batches, slide_rows=None)
        fmt = torch.channels_last if collate.channels_last else torch.contiguous_format
        v = v.sub_(collate.mean).div_(collate.std).to(dtype=collate.dtype, memory_format=fmt)
        out[name] = v.view(n, b, 3, size, size)  # each view's (b, 3, s, s) in the asked memory format
    return out


def _normalised(
    x: torch.Tensor, options: stain_ops.StainOptions, collate: GpuCollate, slide_ids: Sequence[str] | None
) -> torch.Tensor:
    """The images' stain normalisation (Macenko or Reinhard, no jitter), on (b, h, w, 3) channels-last floats."""
    rows = None
    if options.normalize == "macenko":
        if slide_ids is None or len(slide_ids) != x.shape[0]:
            raise ValueError("normalize='macenko' needs each sample's slide id: call the collate on the batch")
        rows = options.slides.rows(slide_ids)  # type: ignore[union-attr]  # checked by StainOptions
    plain = replace(options, hed_scale=0.0, hed_shift=0.0, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0)
    y = stain_ops.apply(x.permute(0, 3, 1, 2).contiguous(), plain, seed=collate.seed, batch=0, slide_rows=rows)
    return y.permute(0, 2, 3, 1).contiguous()  # (b, h, w, 3)
