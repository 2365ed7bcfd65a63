"""Who reads what: shard assignment and batch arithmetic for two-level (rank x worker) sharding.

Pure numpy, no I/O, no global state: every function takes the shard counts, the topology, a seed and an
epoch and returns the same answer in every process, so ranks and workers agree without communicating.

The assignment is expressed as one ordered shard list per epoch, split exactly as webdataset's
``split_by_node`` and ``split_by_worker`` split a list: rank ``r`` of ``W`` reads ``order[r::W]`` and worker
``w`` of ``K`` reads that rank's list ``[w::K]``. The order is a seeded *balanced deal*: shards are dealt in
rounds, the largest shard of a round to the least-loaded rank, so rank totals differ by at most the largest
shard's sample count (and likewise for the workers of a rank).

With fewer shards than readers (``W * K``: a validation set, a pilot, one site's slides), the same split is made
on samples instead (:func:`reader_slices`): sample ``j`` of the order's shards, counted across them, goes to rank
``j % W`` and to that rank's worker ``(j // W) % K``; each reader then reads every shard and keeps its own
:class:`Slice` of it. Readers still never share a sample.

Epoch mode then caps each worker's batch count (its *budget*) so that every rank yields exactly the same
number of batches, ``batches_per_rank``, dropping as few samples as possible: a rank drops its surplus over
the smallest rank (at most the largest shard's count) plus, with ``drop_last``, each worker's last
incomplete batch (fewer than ``batch_size`` samples per worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wsishard.errors import TopologyError

if TYPE_CHECKING:  # world.py imports torch; this module stays pure (the planner imports it)
    from wsishard.streaming.world import World

__all__ = [
    "EpochPlan",
    "Slice",
    "batch_budgets",
    "deal",
    "epoch_order",
    "plan_epoch",
    "reader_slices",
    "resample_order",
    "resume_position",
    "worker_shards",
]


@dataclass(frozen=True)
class Slice:
    """What one reader keeps of one shard: its samples ``k`` (in shard order) with ``k % step == phase``.

    ``step`` 1 is the whole shard (the shard-level split).
    """

    shard: int
    phase: int = 0
    step: int = 1

    def size(self, counts: np.ndarray) -> int:
        """Samples kept, given the shards' (n,) sample counts."""
        return len(range(self.phase, int(counts[self.shard]), self.step))

    def keeps(self, k: int) -> bool:
        """Whether sample ``k`` of the shard (0-based, in shard order) is this reader's."""
        return k % self.step == self.phase


def reader_slices(order: np.ndarray, counts: np.ndarray, world: World) -> list[Slice]:
    """What ``world``'s (rank, worker) reads of the shards in ``order``, in order.

    With at least one shard per reader, whole shards: ``order[rank::W][worker::K]``, as webdataset's
    ``split_by_node`` and ``split_by_worker`` split a shard list. With fewer, samples: sample ``j`` of the shards
    in ``order``, counted across them, goes to rank ``j % W`` and to its worker ``(j // W) % K``.
    """
    readers = world.total_workers
    if len(order) >= readers:
        return [Slice(int(s)) for s in worker_shards(order, world)]
    reader = world.rank + world.world_size * world.worker  # j % readers == reader: rank j % W, worker (j // W) % K
    offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, dtype=np.int64)[order])[:-1]])
    return [
        Slice(int(s), int((reader - o) % readers), readers)
        for s, o in zip(order.tolist(), offsets.tolist(), strict=True)
    ]


def slice_sizes(slices: list[Slice], counts: np.ndarray) -> np.ndarray:
    """(len(slices),) samples each slice keeps."""
    return np.asarray([sl.size(counts) for sl in slices], dtype=np.int64)


def check_readers(counts: np.ndarray, world_size: int, num_workers: int) -> None:
    """Raise unless every (rank, worker) gets at least one sample (whole shards, or its slice of them).

    Raises:
        TopologyError: fewer samples than ``world_size * num_workers`` readers; the message says so.
    """
    readers = world_size * max(num_workers, 1)
    total = int(np.asarray(counts).sum())
    if total < readers:
        raise TopologyError(
            f"{total} sample(s) in {len(counts)} shard(s) cannot give each of {world_size} rank(s) x "
            f"{max(num_workers, 1)} worker(s) a sample; use fewer DataLoader workers or fewer ranks"
        )


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


def epoch_order(counts: np.ndarray, *, world_size: int, num_workers: int, seed: int, epoch: int) -> np.ndarray:
    """The shard order of one epoch: ``order[r::W][w::K]`` are the shards of rank ``r``, worker ``w``.

    Args:
        counts: (n,) samples per shard, from the manifest.
        world_size: number of ranks ``W``.
        num_workers: DataLoader workers per rank ``K`` (1 without workers).
        seed: non-negative base seed shared by all ranks.
        epoch: epoch number; each epoch deals the shards differently.

    Returns:
        (n,) permutation of shard indices.
    """
    counts = np.asarray(counts, dtype=np.int64)
    rng = np.random.default_rng((seed, epoch))
    by_rank = deal(counts, world_size, rng)
    out = np.empty_like(by_rank)
    for r in range(world_size):
        mine = by_rank[r::world_size]
        out[r::world_size] = mine[deal(counts[mine], num_workers, rng)]
    return out


def worker_shards(order: np.ndarray, world: World) -> np.ndarray:
    """Shard indices of ``world``'s (rank, worker): ``order[rank::world_size][worker::num_workers]``."""
    return np.asarray(order)[world.rank :: world.world_size][world.worker :: world.num_workers]


def resample_order(num_shards: int, *, seed: int, rank: int, worker: int, pass_index: int) -> np.ndarray:
    """A worker's shard order for one pass of resampled mode: a permutation seeded by all four values."""
    return np.random.default_rng((seed, rank, worker, pass_index)).permutation(num_shards)


def resume_position(
    kept: list[int], samples: int, *, seed: int | None = None, rank: int = 0, worker: int = 0
) -> tuple[int, int]:
    """Where a reader's stream is after ``samples`` samples: ``(position, offset)``, the shard at ``position`` in
    its stream and the samples of that shard already yielded.

    Epoch mode (``seed`` None): the reader's shards in order, ``kept`` samples each. Resampled mode: endless
    passes, pass ``p`` ordered by :func:`resample_order` with (``seed``, ``rank``, ``worker``, ``p``), positions
    counted on across passes. Only manifest counts are used, so the cost does not grow with ``samples``.
    """
    kept_a = np.asarray(kept, dtype=np.int64)
    base, rest, per_pass = 0, samples, int(kept_a.sum())
    if seed is not None and per_pass > 0:
        pass_index, rest = divmod(samples, per_pass)
        order = resample_order(len(kept_a), seed=seed, rank=rank, worker=worker, pass_index=pass_index)
        kept_a, base = kept_a[order], pass_index * len(order)
    ends = np.cumsum(kept_a)
    j = int(np.searchsorted(ends, rest, side="right"))
    return base + j, rest - (int(ends[j - 1]) if j else 0)


@dataclass(frozen=True, kw_only=True, eq=False)
class EpochPlan:
    """Who reads what in one epoch, and how many batches each worker yields.

    Attributes:
        order: (n,) shard order; rank ``r`` worker ``w`` reads ``order[r::W][w::K]`` (or its slices of them).
        counts: (n,) samples per shard.
        samples: (W, K) samples in each worker's shards.
        budgets: (W, K) batches each worker yields.
        kept: (W, K) samples each worker actually yields.
        batches_per_rank: batches every rank yields (the same on all ranks).
    """

    order: np.ndarray
    counts: np.ndarray
    samples: np.ndarray
    budgets: np.ndarray
    kept: np.ndarray
    batches_per_rank: int
    batch_size: int
    drop_last: bool

    @property
    def dropped_per_rank(self) -> np.ndarray:
        """(W,) samples each rank skips this epoch."""
        return np.asarray(self.samples.sum(axis=1) - self.kept.sum(axis=1))

    def shards_of(self, world: World) -> np.ndarray:
        """Shard indices read by ``world``'s (rank, worker) (all of them, in part, with fewer shards than readers)."""
        return np.asarray([sl.shard for sl in self.slices_of(world)], dtype=np.int64)

    def slices_of(self, world: World) -> list[Slice]:
        """What ``world``'s (rank, worker) reads: whole shards, or slices of them (:func:`reader_slices`)."""
        return reader_slices(self.order, self.counts, world)

    def budget_of(self, world: World) -> int:
        """Batches ``world``'s (rank, worker) yields."""
        return int(self.budgets[world.rank, world.worker])


def plan_epoch(
    counts: np.ndarray,
    *,
    world_size: int,
    num_workers: int,
    batch_size: int,
    seed: int,
    epoch: int,
    drop_last: bool = True,
) -> EpochPlan:
    """Plan one exact epoch: the balanced shard order, per-worker sample counts and batch budgets.

    Args:
        counts: (n,) samples per shard, from the manifest.
        world_size: ranks ``W``.
        num_workers: DataLoader workers per rank ``K`` (1 without workers); the same on every rank.
        batch_size: samples per batch.
        seed: non-negative base seed, the same on every rank.
        epoch: epoch number.
        drop_last: workers drop their last incomplete batch (fixed batch shape) instead of yielding it.

    Raises:
        TopologyError: fewer samples than ``W * K`` readers.
    """
    from wsishard.streaming.world import World  # here: world.py imports torch, the planner imports this module

    counts = np.asarray(counts, dtype=np.int64)
    check_readers(counts, world_size, num_workers)
    order = epoch_order(counts, world_size=world_size, num_workers=num_workers, seed=seed, epoch=epoch)
    samples = np.zeros((world_size, num_workers), dtype=np.int64)
    for r in range(world_size):
        for w in range(num_workers):
            world = World(rank=r, world_size=world_size, worker=w, num_workers=num_workers)
            samples[r, w] = slice_sizes(reader_slices(order, counts, world), counts).sum()
    budgets = batch_budgets(samples, batch_size=batch_size, drop_last=drop_last)
    kept = np.minimum(budgets * batch_size, samples)
    return EpochPlan(
        order=order,
        counts=counts,
        samples=samples,
        budgets=budgets,
        kept=kept,
        batches_per_rank=int(budgets[0].sum()),
        batch_size=batch_size,
        drop_last=drop_last,
    )
