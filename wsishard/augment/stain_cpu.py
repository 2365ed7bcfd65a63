"""The stain operations of ``GpuCollate(stain=...)`` on a CPU device in one C pass (``stain_apply`` of
``wsishard/_native.c``), for the options it covers (:func:`fusable`): Macenko or none, HED jitter, brightness,
contrast and saturation.

Each of these is a per-sample map of a pixel that :mod:`wsishard.augment.stain` computes with batched tensor ops:
Macenko is ``exp(A ln(v + 1) + k)`` capped at 1, HED jitter ``exp(M ln(x) + c)`` with ``M`` Ruifrok and Johnston's
matrix, the sample's scales and its inverse folded into one 3x3 (``c`` the shifts), brightness a factor, contrast and
saturation blends. The C pass reads each uint8 value's start (``ln(v + 1)``, ``ln(v / 255)`` or ``v / 255``) from a
256-entry table the torch path's own float32 ops compute, applies the two 3x3 maps in log space with the clips of the
torch path between them, ``exp``, then the blends (contrast towards the sample's grey mean: a second pass over the
sample while it is in cache) and ``(x - mean) / std``, in float32, writing the output in its layout. The per-sample
parameters are the torch path's (the same draws of :func:`~wsishard.augment.stain.hed_draws` and
:func:`~wsishard.augment.stain.colour_draws`, the same :func:`~wsishard.augment.stain.macenko_map`), so a
resumed run augments as before. It differs from the torch path by float32 rounding only
(``tests/unit/test_stain_native.py`` holds it to that). Reinhard (CIELAB statistics) and hue stay on the torch path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from wsishard._native import stain_apply as _stain_apply
from wsishard.augment import stain as stain_ops
from wsishard.augment.stain import StainOptions

__all__ = ["fusable", "stain_pass"]

_PARAMS = 27  # per sample: a1 (3x3), k1 (3), a2 (3x3), k2 (3), brightness, contrast, saturation
_LOG_FLOOR = math.log(1e-6)  # the HED jitter's clip of intensities before its log (stain.hed_jitter)
_NO_FLOOR = -87.0  # no clip: float32's exp is 0 (below its smallest normal) from here on


def fusable(options: StainOptions) -> bool:
    """Whether the C pass covers ``options`` (not Reinhard, no hue)."""
    return options.normalize in (None, "macenko") and options.hue == 0.0


def _table(options: StainOptions, logs: bool) -> np.ndarray:
    """(256,) float32: each uint8 value as the torch path starts from it (its float32 ops on ``v / 255``)."""
    x = torch.arange(256, dtype=torch.uint8).float().div_(255)
    if options.normalize == "macenko":
        x = torch.log1p(x * 255.0)  # stain.macenko's
    elif logs:
        x = torch.log(x.clamp(min=1e-6))  # stain.hed_jitter's
    return x.numpy()


def _parameters(options: StainOptions, seed: int, batch: int, b: int, slide_rows: torch.Tensor | None) -> np.ndarray:
    """(b, 27) float32 per-sample parameters (the layout of ``stain_params`` in ``_native.c``)."""
    p = np.zeros((b, _PARAMS), dtype=np.float64)
    eye = np.eye(3).ravel()
    p[:, 0:9] = p[:, 12:21] = eye
    p[:, 24:27] = 1.0
    if options.normalize == "macenko":
        table = options.slides.to("cpu")  # type: ignore[union-attr]  # checked by StainOptions
        if slide_rows is None:
            raise ValueError("normalize='macenko' needs each sample's slide id (the batch's meta)")
        rows = slide_rows.cpu()
        a, k = stain_ops.macenko_map(table.matrix[rows], table.max_conc[rows], options.target, table.pinv[rows])
        p[:, 0:9], p[:, 9:12] = a.reshape(b, 9).double().numpy(), k.reshape(b, 3).double().numpy()
    if options.hed_scale or options.hed_shift:
        scale, shift = stain_ops.hed_draws(options, seed, batch, b)
        to_hed, to_log = (m.numpy() for m in stain_ops.hed_matrices())
        p[:, 12:21] = (to_log[None] @ (scale[:, :, None] * to_hed[None])).reshape(b, 9)  # to_log diag(s) to_hed
        p[:, 21:24] = shift @ to_log.T
    if options.brightness or options.contrast or options.saturation:
        p[:, 24:27] = stain_ops.colour_draws(options, seed, batch, b)[:, :3]
    return p.astype(np.float32)


def stain_pass(
    image: torch.Tensor,
    out: torch.Tensor,
    options: StainOptions,
    *,
    seed: int,
    batch: int,
    slide_rows: torch.Tensor | None,
    codes: Sequence[int],
    mean: Sequence[float],
    std: Sequence[float],
    channels_last: bool,
) -> None:
    """``options`` (:func:`fusable`) on a CPU uint8 batch into ``out``, as ``GpuCollate``'s torch path computes it.

    Args:
        image: (b, h, w, 3) uint8 on the CPU.
        out: (b, 3, h, w) float32 on the CPU, contiguous or ``channels_last``: written whole.
        seed, batch: the collate's seed and this batch's number (the random parameters follow them).
        slide_rows: (b,) each sample's row of ``options.slides`` (Macenko).
        codes: each sample's dihedral code (``collate.dihedral``), applied first.
        mean, std: per-channel normalisation, after the stain.
        channels_last: ``out`` is in ``torch.channels_last`` memory format (else contiguous).
    """
    b, h, w, _ = image.shape
    logs = options.normalize == "macenko" or bool(options.hed_scale or options.hed_shift)
    lo = _LOG_FLOOR if options.hed_scale or options.hed_shift else _NO_FLOOR
    params = _parameters(options, seed, batch, b, slide_rows)
    dst = (out.permute(0, 2, 3, 1) if channels_last else out).numpy()  # (b, h, w, 3) / (b, 3, h, w), C order
    src = image if image.is_contiguous() else image.contiguous()
    norm = np.array([*mean, *std], dtype=np.float32)
    _stain_apply(src.numpy(), dst, _table(options, logs), params, bytes(codes), norm, b, h, w, logs, lo, channels_last)
