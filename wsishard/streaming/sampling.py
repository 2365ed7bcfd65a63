"""What ``select=`` and ``weights=`` mean per sample: checked masks and weights, label, slide and source weights.

Pure numpy, no I/O, no global state: every function takes counts and weights and returns the same answer in every
process. How weighted draws are made (resampled visits, weighted epochs) is the planner's
(:mod:`wsishard.streaming.planner`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np

Table = Mapping[str, np.ndarray]  # a shard index's columns, as select= and weight functions see them
Select = Callable[[Table], np.ndarray]
WeightFunction = Callable[[Table], np.ndarray]
Weights = Literal["class", "slide"] | Mapping[int, float] | WeightFunction
logger = logging.getLogger("wsishard.streaming.dataset")  # the stream's own logger: users filter one name


def checked_mask(mask: object, n: int, where: str) -> np.ndarray:
    """``select``'s answer as an (n,) bool array.

    Raises:
        ValueError: not a boolean array of ``n`` values (naming ``where``).
    """
    arr = np.asarray(mask)
    if arr.shape != (n,) or arr.dtype != np.bool_:
        raise ValueError(
            f"select= must return a bool array of {n} values (one per sample) for {where}, got "
            f"{arr.dtype} of shape {arr.shape}"
        )
    return arr


def checked_weights(weights: object, n: int, where: str) -> np.ndarray:
    """A weight function's answer as an (n,) float64 array.

    Raises:
        ValueError: not ``n`` finite non-negative numbers (naming ``where``).
    """
    try:
        arr = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"weights= must return {n} numbers for {where} ({exc})") from exc
    if arr.shape != (n,) or not np.all(np.isfinite(arr)) or (n and arr.min() < 0):
        raise ValueError(
            f"weights= must return {n} finite weights >= 0 for {where}, got shape {arr.shape}"
            f"{'' if arr.shape != (n,) else ' with negative or non-finite values'}"
        )
    return arr


def label_weights(labels: np.ndarray, counts: np.ndarray, weights: Weights) -> np.ndarray:
    """(L,) weight of one sample of each label in ``labels``: ``"class"``: 1 / the label's count (each label then
    weighs the same in all); a mapping: its value (0 for a label it does not name)."""
    counts = np.asarray(counts, dtype=np.float64)
    if isinstance(weights, str):
        return np.divide(1.0, counts, out=np.zeros_like(counts), where=counts > 0)
    assert isinstance(weights, Mapping)
    return np.array([float(weights.get(int(label), 0.0)) for label in labels], dtype=np.float64)


def check_mapping(weights: Mapping[int, float]) -> None:
    """Raises ValueError unless every value is a finite weight >= 0 and one is > 0."""
    values = np.array(list(weights.values()), dtype=np.float64)
    if not len(values) or not np.all(np.isfinite(values)) or values.min() < 0 or values.max() <= 0:
        raise ValueError(f"weights= as a mapping needs finite label weights >= 0, one > 0, got {dict(weights)!r}")


def inverse(counts: np.ndarray) -> np.ndarray:
    """1 / counts, 0 where a count is 0 (``"slide"`` weights: each slide then weighs the same in all)."""
    counts = np.asarray(counts, dtype=np.float64)
    return np.divide(1.0, counts, out=np.zeros_like(counts), where=counts > 0)


def csr_totals(ptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(len(ptr) - 1,) sums of ``values[ptr[s]:ptr[s + 1]]`` (0 for an empty range)."""
    cum = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=np.float64))])
    return np.asarray(cum[ptr[1:]] - cum[ptr[:-1]])


def proportion_scales(totals: Sequence[float] | np.ndarray, proportions: Sequence[float] | None) -> np.ndarray:
    """Per source, the factor its weights are multiplied by so that source ``i`` holds ``proportions[i]`` of the
    total weight (None: sources keep their own totals).

    Raises:
        ValueError: a proportion < 0 or not finite, none > 0, another count than sources, or a source with a
            positive proportion and no weight to scale.
    """
    totals_a = np.asarray(totals, dtype=np.float64)
    if proportions is None:
        return np.ones_like(totals_a)
    props = np.asarray(proportions, dtype=np.float64)
    if props.shape != totals_a.shape or not np.all(np.isfinite(props)) or props.min() < 0 or props.sum() <= 0:
        raise ValueError(
            f"proportions= needs one finite value >= 0 per source ({len(totals_a)}), one > 0, got {list(proportions)!r}"
        )
    if np.any((props > 0) & (totals_a <= 0)):
        raise ValueError("proportions=: a source given a share has no sample with a weight (all selected out?)")
    return np.divide(props / props.sum(), totals_a, out=np.zeros_like(props), where=totals_a > 0)
