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
    weighs the same in all), 0 for -1 (unlabelled: :func:`check_classes`); a mapping: its value (0 for a label it
    does not name) over the largest value (only ratios count)."""
    counts = np.asarray(counts, dtype=np.float64)
    if isinstance(weights, str):  # unlabelled samples (-1) are no class: weight 0
        return np.divide(1.0, counts, out=np.zeros_like(counts), where=(counts > 0) & (np.asarray(labels) != -1))
    assert isinstance(weights, Mapping)
    values = np.array([float(weights.get(int(label), 0.0)) for label in labels], dtype=np.float64)
    top = float(values.max()) if len(values) else 0.0
    return values / top if top > 0 else values  # relative: 1e308 each cannot overflow a shard's total


def check_classes(labels: np.ndarray, counts: np.ndarray, where: str) -> None:
    """``weights="class"`` over samples of ``labels`` counted ``counts`` (selected ones): logs (a warning) how many
    unlabelled samples (-1) it leaves out.

    Raises:
        ValueError: no sample has a label (naming ``where``).
    """
    labels, counts = np.asarray(labels), np.asarray(counts, dtype=np.int64)
    unlabelled, total = int(counts[labels == -1].sum()), int(counts.sum())
    if unlabelled == total:
        raise ValueError(
            f'weights="class" needs labels, and none of the {total} samples of {where} has one (-1: unlabelled); '
            "build with --labels or --roi-labels, or weigh by slide or by a function"
        )
    if unlabelled:
        logger.warning(
            'weights="class" leaves out %d of %d samples, unlabelled (-1): only labelled samples are drawn',
            unlabelled,
            total,
        )


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


def log_total(weights: np.ndarray) -> float:
    """log(sum(weights)), computed scaled (no overflow at 1e308 each, no loss at 1e-320); -inf for no weight."""
    w = np.asarray(weights, dtype=np.float64)
    top = float(w.max()) if len(w) else 0.0
    return float(np.log(top) + np.log(np.sum(w / top))) if top > 0 else -np.inf


def from_log_totals(logs: np.ndarray) -> np.ndarray:
    """Totals from their logs (:func:`log_total`), relative: the largest is 1 (all 0 where none has weight)."""
    logs = np.asarray(logs, dtype=np.float64)
    top = float(logs.max()) if len(logs) else -np.inf
    return np.exp(logs - top) if np.isfinite(top) else np.zeros_like(logs)
