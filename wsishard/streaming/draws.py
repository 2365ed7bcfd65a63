"""How a reader turns a planned piece into items: the weighted draws and the seeded shuffle buffer.

Pure functions of a piece and its shard's items (no I/O, no torch), shared by the planner, whose plans name the
items a reader yields by their offsets in this order, and by the reader stage that reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from wsishard.streaming.planner import Piece

T = TypeVar("T")
EPOCH_DRAWS, VISIT_DRAWS, SHUFFLE = 3, 4, 1  # seed words keeping random streams apart


def draw_counts(weights: np.ndarray, n: int, seed: tuple[int, ...]) -> np.ndarray:
    """(m,) times each of ``m`` samples is drawn in ``n`` draws with replacement, ``P(i) = w_i / sum(w)``."""
    weights = np.asarray(weights, dtype=np.float64)
    if n <= 0 or not len(weights) or weights.max() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    return np.random.default_rng((*seed, EPOCH_DRAWS)).multinomial(n, shares(weights))


def shares(weights: np.ndarray) -> np.ndarray:
    """``weights`` (finite, >= 0, one > 0) as probabilities, scaled by the largest first: extreme but finite
    weights (1e308, 1e-320) neither overflow nor vanish."""
    scaled = np.asarray(weights, dtype=np.float64) / float(np.max(weights))
    return scaled / scaled.sum()


def shuffled(src: Iterable[T], size: int, seed: tuple[int, ...]) -> Iterator[T]:
    """A shuffle buffer of ``size`` items over ``src``, seeded by ``seed`` (non-negative ints): the order it gives
    ``n`` items depends on ``n`` and ``seed`` alone, so a plan can name the items a reader yields by their offset."""
    if size <= 1:
        yield from src
        return
    rng = np.random.default_rng(seed)
    buf: list[T] = []
    draws, used = rng.random(1024), 0
    for item in src:
        buf.append(item)
        if len(buf) < size:
            continue
        if used == len(draws):
            draws, used = rng.random(1024), 0
        i = int(draws[used] * len(buf))
        used += 1
        buf[i], buf[-1] = buf[-1], buf[i]
        yield buf.pop()
    for i in rng.permutation(len(buf)).tolist():
        yield buf[i]


def piece_items(piece: Piece, items: Iterable[T], size: int) -> Iterator[T]:
    """What ``piece`` yields of its shard's ``items`` (in read order, repeated draws adjacent), its buffer ``size``."""
    order = shuffled(items, size, piece.seed)
    for k, item in enumerate(order):
        offset = k - piece.skip
        if offset >= piece.span:
            return
        if offset >= 0 and offset % piece.step == piece.phase:
            yield item
