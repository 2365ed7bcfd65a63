"""The values an option or a per-slide table accepts: a level-0 mpp, an integer label, the target and context mpps.
Below the options and the tables alike, so that both check a value the same way."""

from __future__ import annotations

import math
from typing import Any

from wsishard.errors import OptionError

MAX_MPP = 1000.0  # microns per pixel; a level-0 mpp is above 0 and below this
MPP_RULE = f"a level-0 mpp > 0 and < {MAX_MPP:g}"
LABEL_RANGE = (0, 2**63 - 1)  # int64 tensors in the stream, where -1 marks an unlabelled sample


def valid_mpp(mpp: float) -> bool:
    """Whether ``mpp`` can be a slide's level-0 microns per pixel: finite, above 0 and below ``MAX_MPP``."""
    return isinstance(mpp, int | float) and math.isfinite(mpp) and 0 < mpp < MAX_MPP


def context_mpps(value: Any) -> tuple[float, ...]:
    """``--context-mpp``'s value in canonical (ascending) order: ``"8,2"`` or ``[8.0, 2.0]`` -> ``(2.0, 8.0)``.

    Raises:
        OptionError: (a ``ValueError``) not numbers, a value that is no mpp (<= 0, not finite, >= MAX_MPP), or one
            given twice.
    """
    items = value.split(",") if isinstance(value, str) else value
    try:
        mpps = [float(v) for v in items if not isinstance(v, bool)]
    except (TypeError, ValueError):
        raise OptionError(f"invalid context_mpp: {value!r} (need mpp values > 0, e.g. 2.0,8.0)") from None
    if not mpps and items:
        raise OptionError(f"invalid context_mpp: {value!r} (need mpp values > 0, e.g. 2.0,8.0)")
    for mpp in mpps:
        if not valid_mpp(mpp):
            raise OptionError(f"invalid context_mpp: {mpp!r} (need each UM > 0 and < {MAX_MPP:g})")
    if len(set(mpps)) != len(mpps):
        twice = next(m for m in mpps if mpps.count(m) > 1)
        raise OptionError(f"invalid context_mpp: {twice!r} is given twice")
    return tuple(sorted(mpps))


def target_mpps(value: Any) -> Any:
    """``--mpp``'s value in canonical form: one number as given (a build of one magnification, as always), several
    as a tuple of floats in ascending order (a multi-mpp build): ``[2, 0.5, 1]`` -> ``(0.5, 1.0, 2.0)``; ``[0.5]``
    -> ``0.5``.

    Raises:
        OptionError: (a ``ValueError``) an empty list, a value that is no number or not a finite UM > 0, or one
            given twice, naming it.
    """
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not items:
        raise OptionError(f"invalid target_mpp: {value!r} (need one mpp or more, e.g. 0.5 1.0 2.0)")
    for mpp in items:
        if isinstance(mpp, bool) or not isinstance(mpp, int | float) or not (math.isfinite(mpp) and mpp > 0):
            raise OptionError(f"invalid target_mpp: {mpp!r} (need a finite UM > 0)")
    mpps = [float(m) for m in items]
    if len(set(mpps)) != len(mpps):
        twice = next(m for m in mpps if mpps.count(m) > 1)
        raise OptionError(f"invalid target_mpp: {twice!r} is given twice")
    return items[0] if len(items) == 1 else tuple(sorted(mpps))  # one value as given, as before


def valid_label(label: int) -> bool:
    """Whether ``label`` can be written as ``.cls`` and read back into an int64 tensor, apart from -1 (and any
    negative label), which the stream uses for unlabelled samples."""
    return isinstance(label, int) and not isinstance(label, bool) and LABEL_RANGE[0] <= label <= LABEL_RANGE[1]
