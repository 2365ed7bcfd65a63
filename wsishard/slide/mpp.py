"""A slide's level-0 resolution: from its own properties, an override, or a default; never guessed."""

from __future__ import annotations

import math
from collections.abc import Mapping

from wsishard.errors import MissingMppError

# openslide.PROPERTY_NAME_MPP_X and _Y, spelt out: importing OpenSlide is left to the readers (CLI start-up)
_MPP_KEYS = ("openslide.mpp-x", "openslide.mpp-y")


def slide_mpp(properties: Mapping[str, str]) -> float | None:
    """Level-0 microns per pixel from OpenSlide's properties (mean of x and y), or None when absent/invalid."""
    values = []
    for key in _MPP_KEYS:
        try:
            value = float(properties[key])
        except (KeyError, ValueError):
            continue
        if math.isfinite(value) and value > 0:
            values.append(value)
    return sum(values) / len(values) if values else None


MIN_MPP = 0.02  # finer than any light microscope resolves (about 0.2 um): an mpp below this is wrong
MAX_SLIDE_MM = 200.0  # longer than any glass slide (75 x 50 mm at most): an mpp making a slide longer is wrong
_SCREEN_MPP_UM = 20.0  # a whole-number dpi this coarse (1270 dpi or less) is an image program's, not a scanner's


def implausible_mpp(mpp: float, size_px: tuple[int, int]) -> str | None:
    """Why a level-0 mpp a slide claims cannot be a microscope scanner's (``size_px``: level-0 width, height), or
    None: a whole-number dpi of a screen or printer (72 dpi: 352.8 um/px), a slide longer than any glass, or an mpp
    finer than a light microscope resolves."""
    dpi, long_mm = 25400.0 / mpp, max(size_px) * mpp / 1000.0
    if mpp >= _SCREEN_MPP_UM and abs(dpi - round(dpi)) < 0.01:
        return (
            f"this slide's resolution metadata looks wrong ({round(dpi)} dpi: {mpp:.1f} um/px, an image "
            "program's default, not a microscope's)"
        )
    if mpp < MIN_MPP:
        return f"this slide's resolution metadata looks wrong ({mpp:.3g} um/px is finer than a microscope resolves)"
    if long_mm > MAX_SLIDE_MM:
        return (
            f"this slide's resolution metadata looks wrong ({mpp:.4g} um/px makes its {max(size_px)} px "
            f"{long_mm:,.0f} mm long; a glass slide is at most 75 mm)"
        )
    return None


def resolve_mpp(
    path: str,
    properties: Mapping[str, str],
    override: float | None,
    default: float | None,
    size_px: tuple[int, int] | None = None,
) -> tuple[float, str]:
    """The slide's level-0 mpp and where it came from: ``csv`` override, ``openslide``, or ``default``.

    With ``size_px`` (level-0 width, height), an mpp the slide claims that :func:`implausible_mpp` refuses counts
    as none: ``default`` then applies.

    Raises:
        MissingMppError: the slide reports none (or an implausible one) and neither an override nor a default
            covers it.
    """
    if override is not None:
        return float(override), "csv"
    mpp = slide_mpp(properties)
    wrong = implausible_mpp(mpp, size_px) if mpp is not None and size_px is not None else None
    if mpp is not None and wrong is None:
        return mpp, "openslide"
    if default is not None:
        return float(default), "default"
    if wrong is not None:
        raise MissingMppError(path, f"{wrong}; give its mpp with --mpp-csv or --default-mpp")
    raise MissingMppError(path, "no microns-per-pixel in the slide; give --mpp-csv or --default-mpp")
