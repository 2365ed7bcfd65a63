"""Balanced deals and batch budgets: the arithmetic the stream planner (:mod:`wsishard.streaming.planner`) deals
pieces and caps readers with. Pure numpy, no I/O, no global state.

A *balanced deal* orders items so that bin ``b``'s items, ``order[b::bins]``, have count totals within the largest
item's count of each other: items are dealt in rounds, the largest of a round to the least-loaded bin. The *budgets*
cap each (rank, worker) reader's batches so that every rank yields the same number, dropping as few samples as
possible: a rank drops its surplus over the smallest rank plus, with ``drop_last``, each worker's last incomplete
batch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["batch_budgets", "deal"]


def deal(counts: np.ndarray, bins: int, rng: np.random.Generator) -> np.ndarray:
    """Order items so that ``order[b::bins]`` (bin ``b``'s items) have balanced count totals.

    Items are taken in a random order in rounds of ``bins``; within a round the largest item goes to the
    least-loaded bin. Bin totals then differ by at most ``max(counts)``. Bin labels are shuffled at the
    end (the bins that got an item in a last, incomplete round come first, as ``[b::bins]`` requires).

    Args:
        counts: (n,) non-negative sample counts.
        bins: number of bins (ranks or workers), >= 1.
        rng: source of the random order; consumed deterministically.

    Returns:
        (n,) permutation of ``range(n)``.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n = len(counts)
    perm = rng.permutation(n)
    columns: list[list[int]] = [[] for _ in range(bins)]
    totals = np.zeros(bins, dtype=np.int64)
    receivers = np.arange(0)
    for start in range(0, n, bins):
        chunk = perm[start : start + bins]
        chunk = chunk[np.argsort(-counts[chunk], kind="stable")]  # largest first
        receivers = np.argsort(totals, kind="stable")[: len(chunk)]  # least loaded first
        for b, item in zip(receivers.tolist(), chunk.tolist(), strict=True):
            columns[b].append(item)
        totals[receivers] += counts[chunk]
    last = receivers.tolist() if n % bins else []
    taken = set(last)
    rest = [b for b in range(bins) if b not in taken]
    labels = [last[i] for i in rng.permutation(len(last))] + [rest[i] for i in rng.permutation(len(rest))]
    out = [columns[b][k] for k in range(-(-n // bins)) for b in labels if k < len(columns[b])]
    return np.asarray(out, dtype=np.int64)


def _waterfill(loads: np.ndarray, k: int) -> np.ndarray:
    """Remove ``k`` units from the largest of ``loads``, leaving them as level as possible."""
    out = loads.astype(np.int64).copy()
    if k <= 0:
        return out
    order = np.argsort(-out, kind="stable")
    lo, hi = 0, int(out.max())  # find the level L: above-L excess >= k > above-(L+1) excess
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.maximum(out - mid, 0).sum()) >= k:
            lo = mid
        else:
            hi = mid - 1
    level = lo + 1
    k -= int(np.maximum(out - level, 0).sum())
    out = np.minimum(out, level)
    at_level = [i for i in order.tolist() if out[i] == level]
    out[at_level[:k]] -= 1
    return out


def _trim_rank(samples: np.ndarray, batch_size: int, target: int, drop_last: bool) -> np.ndarray:
    """Budgets for one rank's workers: at most each worker's batches, summing to ``target``."""
    full, rem = samples // batch_size, samples % batch_size
    budgets = full + ((rem > 0) & (not drop_last))
    excess = int(budgets.sum()) - target
    if not drop_last:  # a short last batch holds the fewest samples: cut those first, smallest first
        partial = [i for i in np.argsort(rem, kind="stable").tolist() if rem[i] > 0]
        cut = partial[: max(excess, 0)]
        budgets[cut] -= 1
        excess -= len(cut)
    return _waterfill(budgets, excess)


def batch_budgets(samples: np.ndarray, *, batch_size: int, drop_last: bool = True) -> np.ndarray:
    """Per-(rank, worker) batch caps giving every rank the same batch count, dropping the fewest samples.

    Args:
        samples: (world_size, num_workers) samples each worker would read.
        batch_size: samples per batch.
        drop_last: whether a worker drops its last incomplete batch.

    Returns:
        (world_size, num_workers) budgets; every row sums to the same total.
    """
    samples = np.asarray(samples, dtype=np.int64)
    most = samples // batch_size + ((samples % batch_size > 0) & (not drop_last))
    target = int(most.sum(axis=1).min())
    return np.stack([_trim_rank(row, batch_size, target, drop_last) for row in samples])
