"""The stream planner: every mode of a stream is a plan of *pieces* per reader, from counts alone.

Pure numpy, no I/O, no torch, no webdataset: from the shards' sample counts (selected counts where ``select=``
chose), their total weights (``weights=``, already scaled by ``proportions=``), the world (workers per rank), the
seed, the epoch and the resume position, it returns what each reader (rank, worker) reads and how many batches it
yields. Every process computes the same plan, so readers agree without communicating::

    shard 0 ──┐  a Piece: (shard, its items [skip, skip + take) of the shuffled order, every step-th from phase)
    shard 1 ──┼─> deal ─> rank 0: worker 0 [p3, p0]   worker 1 [p5]       budget: 4 batches per rank
    shard 2 ──┤          rank 1: worker 0 [p1, p4]   (1 worker on rank 1)
    ...     ──┘

A piece's *items* are the shard's samples (in shard order), or in a weighted epoch ``items`` draws of them by
weight, with replacement (:func:`~wsishard.streaming.draws.draw_counts`, seeded by the piece). A reader reads the
piece's shard once, sequentially, shuffles its items with a buffer seeded by the piece
(:func:`~wsishard.streaming.draws.shuffled`) and yields those of
``[skip, skip + take)`` whose offset ``k`` has ``k % step == phase``. What a reader has yielded is then a count,
and what it had left is again a list of pieces (:func:`remainder`): an epoch resumed on any topology deals the
old readers' remainders to the new ones, and a resume of a resume replays the history (:func:`plan_epoch`).

Modes: an exact epoch (every item once; ``pad_last``: the last batches filled with repeats, every rank the same
number), a weighted epoch of ``epoch_size`` draws (counts per shard drawn by the shards' weights), resampled
passes (:func:`reader_pass`: a reader's shards in a new order each pass, weighted visits drawing their expected
share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from wsishard.errors import TopologyError
from wsishard.streaming.draws import EPOCH_DRAWS, SHUFFLE, VISIT_DRAWS, shares
from wsishard.streaming.partition import batch_budgets, deal


class Where(Protocol):
    """A reader's place (a :class:`~wsishard.streaming.world.World`, which imports torch: not imported here)."""

    @property
    def rank(self) -> int: ...

    @property
    def worker(self) -> int: ...


Topology = tuple[int, ...]  # DataLoader workers of each rank (1 without workers)


@dataclass(frozen=True)
class Piece:
    """Items ``[skip, skip + take)`` of shard ``shard``'s shuffled items, those at offsets ``k % step == phase``.

    ``items``: the shard's samples (``draws`` False: all its selected samples), or that many weighted draws.
    ``seed``: the shuffle's (and the draws') seed words.
    """

    shard: int
    items: int
    seed: tuple[int, ...]
    draws: bool = False
    skip: int = 0
    take: int = -1  # -1: to the end of the items
    phase: int = 0
    step: int = 1

    @property
    def span(self) -> int:
        """Items of the shuffled order this piece spans, ``[skip, skip + span)``."""
        return self.items - self.skip if self.take < 0 else self.take

    @property
    def count(self) -> int:
        """Items this piece yields."""
        return len(range(self.phase, self.span, self.step))

    def after(self, yielded: int) -> Piece | None:
        """What is left once ``yielded`` of its items were yielded (None: nothing)."""
        cut = self.phase + self.step * yielded
        if yielded >= self.count:
            return None
        return replace(self, skip=self.skip + cut, take=self.span - cut, phase=0)

    def split(self, phase: int, step: int) -> Piece:
        """The items ``m`` of this piece (counted in its yield order) with ``m % step == phase``."""
        return replace(self, phase=self.phase + self.step * phase, step=self.step * step)


@dataclass(frozen=True)
class Reader:
    """One reader's (rank, worker) work: its pieces in order, its batch budget and how many real items it yields
    (``real``; with ``pad_last`` the rest of ``budget`` batches are repeats)."""

    pieces: tuple[Piece, ...]
    budget: int
    real: int

    @property
    def items(self) -> int:
        return sum(p.count for p in self.pieces)

    def passed(self, batches: int, batch_size: int, items: int | None = None) -> int:
        """Its items passed after ``batches`` batches: theirs, or ``items`` (more after a skip), at most ``real``."""
        done = min(batches * batch_size, self.real)
        return done if items is None else max(done, min(items, self.real))


@dataclass(frozen=True)
class Plan:
    """Every reader's work: ``readers[rank][worker]``; every rank yields ``batches_per_rank`` batches."""

    readers: tuple[tuple[Reader, ...], ...]
    batch_size: int

    @property
    def batches_per_rank(self) -> int:
        return sum(r.budget for r in self.readers[0]) if self.readers else 0

    @property
    def topology(self) -> Topology:
        return tuple(len(workers) for workers in self.readers)

    def reader(self, rank: int, worker: int) -> Reader:
        return self.readers[rank][worker]

    @property
    def budgets(self) -> np.ndarray:
        """(ranks, most workers) batches of each reader (0 for a worker a rank does not have)."""
        width = max(self.topology, default=0)
        return np.array([[r.budget for r in row] + [0] * (width - len(row)) for row in self.readers], dtype=np.int64)

    def shards_of(self, world: Where) -> np.ndarray:
        """The shards ``world``'s (rank, worker) reads (whole or in part), in order."""
        return np.array([p.shard for p in self.reader(world.rank, world.worker).pieces], dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What an epoch is made of: ``counts`` (n,) selected samples per shard; ``totals`` (n,) their weight (None:
    unweighted); ``epoch_size`` draws per epoch (weighted; default: the selected samples); the batching. ``seed``
    is shared by every rank (the deal, an epoch's draws and shuffles); ``stream_seed`` (default ``seed``) orders a
    resampled reader's passes, shuffles and visits."""

    counts: np.ndarray
    batch_size: int
    seed: int = 0
    stream_seed: int | None = None
    totals: np.ndarray | None = None
    epoch_size: int | None = None
    drop_last: bool = True
    pad_last: bool = False


@dataclass(frozen=True)
class Segment:
    """A stretch of an epoch on one topology: batches each of its readers had yielded when it stopped."""

    topology: Topology
    batches: tuple[tuple[int, ...], ...]  # [rank][worker]
    items: tuple[tuple[int | None, ...], ...] | None = None  # [rank][worker] plan items passed (None: the batches')


def fresh_pieces(spec: Spec, epoch: int) -> list[Piece]:
    """The epoch's pieces, one per shard with something to yield: its selected samples, or its weighted draws
    (``epoch_size`` draws over the shards by weight, with replacement)."""
    counts = np.asarray(spec.counts, dtype=np.int64)
    if spec.totals is None:
        items, draws = counts, False
    else:
        totals = np.where(counts > 0, np.asarray(spec.totals, dtype=np.float64), 0.0)
        if not len(totals) or totals.max() <= 0:
            raise ValueError("weights= gives every selected sample weight 0: nothing to draw")
        size = int(counts.sum()) if spec.epoch_size is None else spec.epoch_size
        rng = np.random.default_rng((spec.seed, epoch, EPOCH_DRAWS))
        items, draws = rng.multinomial(size, shares(totals)), True
    return [Piece(s, int(n), (spec.seed, epoch, s, SHUFFLE), draws) for s, n in enumerate(items.tolist()) if n > 0]


def reader_order(topology: Topology) -> list[tuple[int, int]]:
    """Every (rank, worker), ranks interleaved: reader ``j`` of this list is the ``j``-th to get a sample."""
    return [(r, w) for w in range(max(topology)) for r, k in enumerate(topology) if w < k]


def assign(pieces: Sequence[Piece], topology: Topology, rng: np.random.Generator) -> list[list[list[Piece]]]:
    """``pieces`` split over the readers, ``[rank][worker]``: whole pieces dealt with balanced counts
    (:func:`~wsishard.streaming.partition.deal`), or, with fewer pieces than readers, by item: item ``j`` of
    them (counted across the pieces) to the ``j % readers``-th of :func:`reader_order`."""
    out: list[list[list[Piece]]] = [[[] for _ in range(k)] for k in topology]
    order = reader_order(topology)
    if len(pieces) < len(order):
        offset = 0
        for piece in pieces:
            for j, (rank, worker) in enumerate(order):
                part = piece.split((j - offset) % len(order), len(order))
                if part.count:
                    out[rank][worker].append(part)
            offset += piece.count
        return out
    counts = np.array([p.count for p in pieces], dtype=np.int64)
    by_rank = deal(counts, len(topology), rng)
    for rank, workers in enumerate(topology):
        mine = by_rank[rank :: len(topology)]
        ordered = mine[deal(counts[mine], workers, rng)]
        for worker in range(workers):
            out[rank][worker] = [pieces[i] for i in ordered[worker::workers].tolist()]
    return out


def assign_even(pieces: Sequence[Piece], topology: Topology, rng: np.random.Generator) -> list[list[list[Piece]]]:
    """``pieces`` (taken in a random order) cut into one contiguous run of items per reader, the runs' sizes
    differing by at most one: the ``j``-th reader of :func:`reader_order` gets the ``j``-th run. At most one piece
    per reader is cut in two (then read by both)."""
    out: list[list[list[Piece]]] = [[[] for _ in range(k)] for k in topology]
    order = reader_order(topology)
    shuffled_pieces = [pieces[i] for i in rng.permutation(len(pieces)).tolist()]
    total, at = sum(p.count for p in pieces), 0
    for j, (rank, worker) in enumerate(order):
        size = total // len(order) + (j < total % len(order))
        out[rank][worker] = cut(shuffled_pieces, at, at + size)
        at += size
    return out


def budgets(items: list[list[int]], spec: Spec) -> list[list[int]]:
    """Batches of each reader, ``[rank][worker]``, every rank the same total: the fewest items dropped
    (:func:`~wsishard.streaming.partition.batch_budgets`), or with ``pad_last`` every item kept and the short
    ranks padded with batches of repeats, one per worker in turn."""
    size, width = spec.batch_size, max(len(row) for row in items)
    if not spec.pad_last:
        grid = np.array([row + [0] * (width - len(row)) for row in items], dtype=np.int64)
        caps = batch_budgets(grid, batch_size=size, drop_last=spec.drop_last)
        return [caps[r, : len(row)].tolist() for r, row in enumerate(items)]
    out = [[-(-n // size) for n in row] for row in items]
    target = max(sum(row) for row in out)
    for row in out:
        extra, k = target - sum(row), len(row)
        for w in range(k):
            row[w] += extra // k + (w < extra % k)
    return out


def make_plan(assigned: list[list[list[Piece]]], spec: Spec) -> Plan:
    """The :class:`Plan` of pieces already split over the readers."""
    items = [[sum(p.count for p in pieces) for pieces in row] for row in assigned]
    caps = budgets(items, spec)
    readers = tuple(
        tuple(
            Reader(tuple(pieces), cap, min(n, cap * spec.batch_size))
            for pieces, cap, n in zip(row, cap_row, n_row, strict=True)
        )
        for row, cap_row, n_row in zip(assigned, caps, items, strict=True)
    )
    return Plan(readers, spec.batch_size)


def remainder(
    plan: Plan, batches: Sequence[Sequence[int]], items: Sequence[Sequence[int | None]] | None = None
) -> list[Piece]:
    """What ``plan``'s readers had left to yield after ``batches[rank][worker]`` batches each, having passed
    ``items[rank][worker]`` of their items (None: the batches' items; more after a skip), in (rank, worker, piece)
    order: the rest of the piece each stopped in and the pieces after it, up to its ``real`` items.

    Raises:
        ValueError: a reader's batches beyond its budget.
    """
    left: list[Piece] = []
    for rank, row in enumerate(plan.readers):
        for worker, reader in enumerate(row):
            done = int(batches[rank][worker])
            if done > reader.budget:
                raise ValueError(f"rank {rank} worker {worker}: {done} batches, beyond its budget {reader.budget}")
            at = reader.passed(done, plan.batch_size, items[rank][worker] if items is not None else None)
            left += cut(reader.pieces, at, reader.real)
    return left


def cut(pieces: Sequence[Piece], start: int, end: int) -> list[Piece]:
    """The pieces' items ``[start, end)``, counted across them in order."""
    out, at = [], 0
    for piece in pieces:
        lo, hi = max(start, at), min(end, at + piece.count)
        if lo < hi:
            rest = piece.after(lo - at)
            assert rest is not None
            out.append(replace(rest, take=min(rest.span, rest.phase + rest.step * (hi - lo - 1) + 1)))
        at += piece.count
    return out


def check_readers(items: int, topology: Topology, shards: int) -> None:
    """Raise unless every reader can get an item.

    Raises:
        TopologyError: fewer items than readers.
    """
    readers = sum(topology)
    if items < readers:
        raise TopologyError(
            f"{items} sample(s) in {shards} shard(s) cannot give each of {len(topology)} rank(s) x "
            f"{max(topology)} worker(s) a sample; use fewer DataLoader workers or fewer ranks"
        )


def plan_epoch(spec: Spec, topology: Topology, epoch: int, history: Sequence[Segment] = ()) -> Plan:
    """Epoch ``epoch`` on ``topology``: a fresh plan, or, after the stretches ``history`` (each stopped after its
    readers' batches, on its own topology), what they had left dealt to ``topology``'s readers in even runs
    (:func:`assign_even`: only partial batches are then dropped).

    Raises:
        TopologyError: fewer items than readers (of a fresh epoch).
        ValueError: a segment's batches beyond its plan's budgets.
    """
    pieces = fresh_pieces(spec, epoch)
    check_readers(sum(p.count for p in pieces), topology, len(spec.counts))
    plan = make_plan(assign(pieces, topology if not history else history[0].topology, _rng(spec, epoch, 0)), spec)
    for i, segment in enumerate(history):
        if tuple(len(row) for row in segment.batches) != segment.topology:
            raise ValueError(f"resume history: segment {i} counts batches of other readers than {segment.topology}")
        following = history[i + 1].topology if i + 1 < len(history) else topology
        plan = make_plan(
            assign_even(remainder(plan, segment.batches, segment.items), following, _rng(spec, epoch, i + 1)), spec
        )
    return plan


def _rng(spec: Spec, epoch: int, segment: int) -> np.random.Generator:
    return np.random.default_rng((spec.seed, epoch, segment))


def reader_share(spec: Spec, topology: Topology, rank: int, worker: int) -> list[Piece]:
    """Resampled mode: reader (``rank``, ``worker``)'s share of the shards (epoch 0's deal: whole shards, or slices
    of them with fewer shards than readers), which its passes visit."""
    return assign(fresh_pieces(replace(spec, totals=None), 0), topology, _rng(spec, 0, 0))[rank][worker]


def reader_pass(spec: Spec, mine: Sequence[Piece], rank: int, worker: int, pass_index: int) -> list[Piece]:
    """Resampled mode: the pieces of pass ``pass_index`` of a reader with share ``mine`` (:func:`reader_share`), in
    a new order each pass; weighted, each visit draws its expected share of the pass (the shard's weight over the
    reader's mean weight per item), rounded up or down at random, among the shard's selected samples."""
    seed = spec.seed if spec.stream_seed is None else spec.stream_seed
    order = np.random.default_rng((seed, rank, worker, pass_index)).permutation(len(mine))
    expected = _expected(spec, mine) if spec.totals is not None else None
    out = []
    for j, i in enumerate(order.tolist()):
        position = pass_index * len(mine) + j
        own = (seed, rank, worker, position, SHUFFLE)
        # a shard split over readers: one order for all of them, each its own slice of it, the same every pass (the
        # slices stay disjoint however far apart the readers' passes are; the shuffle buffer reorders within them)
        shared = (spec.seed, mine[i].shard, SHUFFLE)
        piece = replace(mine[i], seed=own if mine[i].step == 1 else shared)
        if expected is not None:
            rng = np.random.default_rng((seed, rank, worker, position, VISIT_DRAWS))
            draws = int(np.floor(expected[i] + rng.random()))
            piece = Piece(piece.shard, draws, own, draws=True)  # draws of its own: readers sharing a shard differ
        out.append(piece)
    return out


def _expected(spec: Spec, mine: Sequence[Piece]) -> np.ndarray:
    """(len(mine),) expected draws per visit of each of a reader's pieces: a pass draws as many as they hold."""
    assert spec.totals is not None
    counts = np.asarray(spec.counts, dtype=np.float64)
    kept = np.array([p.count for p in mine], dtype=np.float64)
    weight = np.array([spec.totals[p.shard] * p.count / max(counts[p.shard], 1) for p in mine])
    return shares(weight) * kept.sum() if len(weight) and weight.max() > 0 else np.zeros(len(mine))


def resampled_start(spec: Spec, mine: Sequence[Piece], rank: int, worker: int, items: int) -> tuple[int, int]:
    """Where a resampled reader is after yielding ``items``: ``(pass, items of that pass already yielded)``."""
    if spec.totals is None:
        return divmod(items, max(sum(p.count for p in mine), 1))
    pass_index = 0
    while True:
        size = sum(p.count for p in reader_pass(spec, mine, rank, worker, pass_index))
        if items < size or (size == 0 and pass_index > 64):
            return pass_index, items
        items, pass_index = items - size, pass_index + 1
