"""A slide's level-0 resolution: from its own properties, an override, or a default; never guessed."""

from __future__ import annotations

import math
from collections.abc import Mapping

import openslide

from wsishard.errors import MissingMppError


def slide_mpp(properties: Mapping[str, str]) -> float | None:
    """Level-0 microns per pixel from OpenSlide's properties (mean of x and y), or None when absent/invalid."""
    values = []
    for key in (openslide.PROPERTY_NAME_MPP_X, openslide.PROPERTY_NAME_MPP_Y):
        try:
            value = float(properties[key])
        except (KeyError, ValueError):
            continue
        if math.isfinite(value) and value > 0:
            values.append(value)
    return sum(values) / len(values) if values else None


def resolve_mpp(path: str, properties: Mapping[str, str], override: float | None,
                default: float | None) -> tuple[float, str]:  # fmt: skip
    """The slide's level-0 mpp and where it came from: ``csv`` override, ``openslide``, or ``default``.

    Raises:
        MissingMppError: the slide reports none and neither an override nor a default covers it.
    """
    if override is not None:
        return float(override), "csv"
    mpp = slide_mpp(properties)
    if mpp is not None:
        return mpp, "openslide"
    if default is not None:
        return float(default), "default"
    raise MissingMppError(path, "no microns-per-pixel in the slide; give --mpp-csv or --default-mpp")
