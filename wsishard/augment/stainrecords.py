"""Which recorded stains can normalise: the checks :class:`~wsishard.augment.stain.StainTarget` and
:class:`~wsishard.augment.stain.StainTable` hold a Macenko matrix and its maximum concentrations to.

A stain is usable when its ``matrix`` is 3 rows (R, G, B) of 2 finite, non-negative numbers whose columns (H, E) are
unit vectors (as the build writes them, length 1 within :data:`UNIT_TOLERANCE`) pointing apart (their angle at least
:data:`MIN_ANGLE_DEG`), and its ``max_conc`` is 2 numbers in :data:`CONC_RANGE`. Anything else, whether a zero or NaN
matrix, H and E the same vector, or a maximum of 0, NaN or inf, maps every pixel of a sample to one colour, to NaN,
or fails inside torch's pseudo-inverse. The checks are plain Python: they read the numbers as the record holds them.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence
from typing import Any

from wsishard.manifest import SlideRecord

__all__ = [
    "CONC_RANGE",
    "MIN_ANGLE_DEG",
    "UNIT_TOLERANCE",
    "pair",
    "pairs",
    "record_problem",
    "stain_problem",
    "table_rows",
    "unusable_line",
    "usable_fitted",
]

logger = logging.getLogger(__name__)
Stain = tuple[Any, Any]  # (matrix (3, 2), max_conc (2,)) as nested sequences of numbers

UNIT_TOLERANCE = 0.05  # a column's length may differ from 1 by this much (the build writes 4 decimals)
MIN_ANGLE_DEG = 1.0  # H and E closer than this are one stain: no concentration of either can be told apart
CONC_RANGE = (0.01, 100.0)  # a maximum concentration (optical density units; real slides about 0.3 to 3)


def stain_problem(matrix: Any, max_conc: Any) -> str | None:
    """Why ``matrix`` (3, 2) and ``max_conc`` (2,) cannot normalise, naming the field and its value; None when they
    can (the module's rules)."""
    rows = _numbers(matrix, (3, 2))
    if rows is None:
        return f"matrix is {_short(matrix)}, not 3 rows (R, G, B) of 2 numbers (H, E)"
    if not all(math.isfinite(v) and v >= 0 for row in rows for v in row):
        return f"matrix is {_short(matrix)}: not every value finite and >= 0"
    columns = [[row[j] for row in rows] for j in range(2)]
    lengths = [math.hypot(*col) for col in columns]
    if not all(abs(length - 1.0) <= UNIT_TOLERANCE for length in lengths):
        shown = ", ".join(f"{length:.4g}" for length in lengths)
        return f"matrix is {_short(matrix)}: its columns (H, E) are not unit vectors (lengths {shown})"
    cosine = sum(h * e for h, e in zip(*columns, strict=True)) / (lengths[0] * lengths[1])
    if math.degrees(math.acos(min(1.0, cosine))) < MIN_ANGLE_DEG:
        return f"matrix is {_short(matrix)}: its H and E columns are the same vector"
    conc = _numbers([max_conc], (1, 2))
    lo, hi = CONC_RANGE
    if conc is None or not all(lo <= v <= hi for v in conc[0]):  # NaN fails both comparisons
        return f"max_conc is {_short(max_conc)}, not 2 numbers (H, E) from {lo:g} to {hi:g}"
    return None


def pairs(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, float], ...]:
    """A checked matrix as a tuple of (H, E) rows of floats (:class:`~wsishard.augment.stain.StainTarget`'s)."""
    return tuple(pair(r) for r in rows)


def pair(values: Sequence[float]) -> tuple[float, float]:
    """A checked ``max_conc`` (or matrix row) as a pair of floats."""
    a, b = values
    return float(a), float(b)


def _numbers(value: Any, shape: tuple[int, int]) -> list[list[float]] | None:
    """``value`` as ``shape[0]`` rows of ``shape[1]`` floats (real numbers only, no bools or text; a numpy array
    as its ``tolist()``), or None."""
    value = _listed(value)
    if not _sequence(value) or len(value) != shape[0]:
        return None
    rows = []
    for row in map(_listed, value):
        if not _sequence(row) or len(row) != shape[1]:
            return None
        if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in row):
            return None
        rows.append([_float(v) for v in row])
    return rows


def _listed(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) and not isinstance(value, str | bytes) else value


def _float(value: numbers.Real) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer past float's range (JSON allows 4300 digits)
        return math.inf


def _sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _short(value: Any) -> str:
    """``value``'s repr cut to 80 characters (a record's value can be any JSON)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def record_problem(stain: Any) -> str | None:
    """Why a slide record's ``stain`` field cannot normalise (:func:`stain_problem`, or not a stain record at all);
    None when it can."""
    if not isinstance(stain, dict):
        return f"stain is {_short(stain)}, not a stain record"
    return stain_problem(stain.get("matrix"), stain.get("max_conc"))


def usable_fitted(records: Sequence[SlideRecord]) -> list[dict[str, Any]]:
    """The ``stain`` fields of ``records`` fitted by the build and usable; those left out are logged (one line)."""
    fitted = {r.slide_id: r.stain for r in records if isinstance(r.stain, dict) and r.stain.get("source") == "fitted"}
    unusable = {slide: p for slide, stain in fitted.items() if (p := record_problem(stain)) is not None}
    if unusable:
        logger.warning("StainTarget.of_build: %s", unusable_line(unusable, len(fitted), "left out"))
    return [stain for slide, stain in fitted.items() if slide not in unusable]


def table_rows(records: Sequence[SlideRecord], reference: Stain) -> tuple[list[str], list[Stain], dict[str, str]]:
    """Each slide with a recorded stain (records whose ``stain`` is empty have none: failed slides, older builds),
    its stain as ``(matrix, max_conc)`` lists, and ``{slide_id: problem}`` of those whose stain cannot normalise:
    they get ``reference`` in its place, as the build records for a slide it cannot fit."""
    ids: list[str] = []
    stains: list[Stain] = []
    unusable: dict[str, str] = {}
    for record in records:
        if not record.stain:
            continue
        problem = record_problem(record.stain)
        if problem is not None:
            unusable[record.slide_id] = problem
        ids.append(record.slide_id)
        stains.append(reference if problem is not None else (record.stain["matrix"], record.stain["max_conc"]))
    return ids, stains, unusable


def unusable_line(unusable: dict[str, str], slides: int, fate: str = "normalised as the reference H&E instead") -> str:
    """One log line: how many of ``slides`` slides have an unusable stain, the first three named with the field."""
    named = "; ".join(f"slide {slide!r}: {problem}" for slide, problem in list(unusable.items())[:3])
    more = f"; and {len(unusable) - 3} more" if len(unusable) > 3 else ""
    return f"{len(unusable)} of {slides} slides have a recorded stain that cannot normalise, {fate} ({named}{more})"
