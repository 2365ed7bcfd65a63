"""Pure, seeded planning: slides into groups, each group's blocks into shards, and each shard's write order.

No I/O. Groups come from the slide count and the seed alone (before any scan), and each group is planned from
its own slides alone, so the parts of a cluster build plan their groups without one another. The same inputs and
seed give the same plan; the plan alone fixes which samples land in which shard
and in what order, so extraction can run shards in any order, in any process, and redo any of them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

from wsishard.builder.options.buildopts import group_count
from wsishard.format import shard_index


class BlockList(Sequence[tuple[int, int]]):
    """A shard's planned blocks, ``(slide, block)`` in write order, kept as two integer arrays (a group's plan
    makes thousands of blocks: pairs are made only when iterated)."""

    __slots__ = ("block_ids", "slides")

    def __init__(self, slides: np.ndarray, block_ids: np.ndarray) -> None:
        self.slides = slides  # (n,) int64 slide indices
        self.block_ids = block_ids  # (n,) int64 block indices in their slides' block lists

    def __len__(self) -> int:
        return len(self.slides)

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> BlockList: ...
    def __getitem__(self, i: int | slice) -> tuple[int, int] | BlockList:
        if isinstance(i, slice):
            return BlockList(self.slides[i], self.block_ids[i])
        return int(self.slides[i]), int(self.block_ids[i])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return zip(self.slides.tolist(), self.block_ids.tolist(), strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockList):
            return np.array_equal(self.slides, other.slides) and np.array_equal(self.block_ids, other.block_ids)
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BlockList({list(self)!r})"


@dataclass(frozen=True)
class ShardPlan:
    """One shard: its index (:func:`~wsishard.format.shard_index`: its group and its number in the group), its
    group, and its blocks in write order.

    Attributes:
        blocks: ``(slide, block)`` pairs (a :class:`BlockList` from the planner) with ``slide`` an index into the
            planned slides and ``block`` an index into that slide's block list.
        patches: planned patch count (before any slide fails during extraction).
    """

    index: int
    group: int
    blocks: Sequence[tuple[int, int]]
    patches: int


@dataclass(frozen=True)
class Plan:
    groups: tuple[tuple[int, ...], ...]  # slide indices per group
    shards: tuple[ShardPlan, ...]


def make_groups(n_slides: int, group_slides: int, seed: int) -> list[list[int]]:
    """Shuffle slides with the seed and cut them into groups of at most ``group_slides`` (sizes within one).

    Known before any slide is scanned, from the slide count and the seed alone: every part of a cluster build
    computes the same groups and scans only its own. A group's slides that yield no patches plan no blocks.

    Args:
        n_slides: slides, indexed by their position in the sorted input list.
    """
    if n_slides <= 0:
        return []
    order = np.random.default_rng((seed, 0x6A01)).permutation(n_slides)
    n_groups = group_count(n_slides, group_slides)
    return [sorted(chunk.tolist()) for chunk in np.array_split(order, n_groups)]


def _flatten(block_sizes: Mapping[int, Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A group's blocks as flat arrays, slides in index order, each (n_blocks,): the slide's position among the
    group's slides, the block's index in its slide, its patches; and the slide indices, (n_slides,)."""
    ids = sorted(block_sizes)
    counts = np.array([len(block_sizes[s]) for s in ids], dtype=np.int64)
    sizes = np.fromiter(itertools.chain.from_iterable(block_sizes[s] for s in ids), np.int64, int(counts.sum()))
    col = np.repeat(np.arange(len(ids)), counts)
    block = np.arange(len(sizes)) - np.repeat(np.cumsum(counts) - counts, counts)
    return col, block, sizes, np.array(ids, dtype=np.int64)


def _small_sort(keys: np.ndarray, top: int) -> np.ndarray:
    """Stable argsort of non-negative integer keys below ``top`` (a radix sort when they fit in 16 bits)."""
    return np.argsort(keys.astype(np.int16 if top < 1 << 15 else np.int64), kind="stable")


def _deal(col: np.ndarray, sizes: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """The shard (0..n-1) of each block (arrays as :func:`_flatten` makes them).

    Each slide's blocks, largest first (equal sizes in random order), are dealt in rounds of ``n`` to ``n``
    distinct shards, alternately forwards and backwards (a snake: it evens out sizes within the slide), so a
    slide's block counts per shard differ by at most one and a slide with at least ``n`` blocks lands in every
    shard. Then each slide's deal is turned (its shards shifted cyclically): slides visited in a random order, each
    takes the turn that puts its heaviest shards on the lightest so far (the least sum of squared shard patch
    counts; ties at random), which balances shard patch counts to within about a block. Above 64 shards a slide's
    turn is where the previous slide's deal stopped instead (block counts balanced).
    """
    n_slides, top = int(col[-1]) + 1, int(sizes.max()) + 1
    perm = rng.permutation(len(sizes))
    order = perm[_small_sort((col * top + top - 1 - sizes)[perm], n_slides * top)]  # by slide, largest first
    counts = np.bincount(col, minlength=n_slides)
    rnd, pos = np.divmod(np.arange(len(sizes)) - np.repeat(np.cumsum(counts) - counts, counts), n)
    base = np.where(rnd % 2 == 0, pos, n - 1 - pos)  # (n_blocks,) shard before the turn, in sorted order
    if n > 64:
        turn = np.cumsum(counts) - counts
    else:
        per = np.bincount(col * n + base, weights=sizes[order], minlength=n_slides * n).reshape(n_slides, n)
        shifted = per[:, (np.arange(n)[None, :] - np.arange(n)[:, None]) % n]  # (slides, turn, shard) patches
        ties = rng.random((n_slides, n))
        load, turn = np.zeros(n), np.zeros(n_slides, dtype=np.int64)
        for i in rng.permutation(n_slides).tolist():
            t = int(np.argmin(shifted[i] @ load + ties[i]))  # least sum of squares after it (integers + ties)
            turn[i] = t
            load += shifted[i, t]
    shard = np.empty(len(sizes), dtype=np.int64)
    shard[order] = (base + turn[col]) % n
    return shard


def interleave(blocks: list[tuple[int, int]], rng: np.random.Generator) -> list[tuple[int, int]]:
    """Order one shard's blocks by the rule of :func:`_interleave`."""
    ids, col = np.unique(np.array([s for s, _ in blocks], dtype=np.int64), return_inverse=True)
    block = np.array([b for _, b in blocks], dtype=np.int64)
    order = _interleave(np.zeros(len(blocks), dtype=np.int64), col, block, 1, len(ids), rng)
    return [blocks[i] for i in order.tolist()]


def _interleave(
    shard: np.ndarray, col: np.ndarray, block: np.ndarray, n: int, n_slides: int, rng: np.random.Generator
) -> np.ndarray:
    """The write order of a group's blocks (a permutation, by shard), given each block's shard and slide position.

    In its shard, a slide with ``c`` blocks there takes the places ``(j + u) / c``, ``j = 0 .. c-1`` (its blocks
    in the slide's own block order, ``u`` uniform per slide and shard), and blocks are written by place: every
    slide spread evenly over the shard. That order (:func:`~wsishard.builder.scan.grid.blocks`: neighbours close) lets
    a worker reuse the tiles two neighbouring blocks share (:class:`~wsishard.slide.tilecache.TileCache`); which blocks
    a shard gets is the deal's, and the stream's shuffle buffer mixes the samples. Between two blocks of a slide
    then comes a block of every slide with at least as many blocks, so only a shard's largest slide, when no other
    has as many, can have neighbours: then its blocks are put into distinct gaps between the others' (first the
    gaps between two blocks of one slide, then gaps spread evenly; all gaps, as evenly as they go, when it holds
    more than half). No two consecutive blocks come from one slide whenever such an order exists, and otherwise
    the fewest do.
    """
    cell = shard * n_slides + col
    counts = np.bincount(cell, minlength=n * n_slides)
    grouped = np.lexsort((block, cell))  # blocks by cell, in the slide's block order within each
    rank = np.empty(len(cell), dtype=np.int64)
    rank[grouped] = np.arange(len(cell)) - (np.cumsum(counts) - counts)[cell[grouped]]
    place = 2.0 * shard + (rank + rng.random(len(counts))[cell]) / counts[cell]  # each shard its own [2k, 2k + 1)
    # places never tie (ranks differ within a cell, and u across cells), so any sort gives this order; by cell, places
    # are runs already in order, which a stable (merge) sort takes far faster than a sort of them shuffled
    order = grouped[np.argsort(place[grouped], kind="stable")]
    bad = (col[order][1:] == col[order][:-1]) & (shard[order][1:] == shard[order][:-1])
    if not bad.any():
        return order
    cuts = np.cumsum(np.bincount(shard, minlength=n))[:-1]
    parts = np.split(order, cuts)
    for k in np.unique(shard[order][1:][bad]).tolist():
        parts[k] = _separate(parts[k], col, rng)
    return np.concatenate(parts)


def _separate(order: np.ndarray, col: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One shard's spread order with its largest slide's blocks moved into distinct gaps between the others'."""
    slides = col[order]
    big = int(np.argmax(np.bincount(slides)))
    mine, rest = order[slides == big], order[slides != big]
    gaps, c = len(rest) + 1, len(mine)  # gaps: before, between and after the others
    if c >= gaps:
        at = (np.arange(c) * gaps) // c  # every gap, the extra blocks spread
    else:
        same = col[rest][1:] == col[rest][:-1]
        need = np.flatnonzero(same) + 1  # gaps between two blocks of one slide
        free = np.flatnonzero(np.concatenate(([True], ~same, [True])))  # the other gaps, in order
        more = c - len(need)
        spread = free[((np.arange(more) + rng.random()) * len(free) / more).astype(np.int64)]
        at = np.sort(np.concatenate((need, spread)))
    return np.insert(rest, at, mine)


def _deal_within_cap(col: np.ndarray, sizes: np.ndarray, cap: int, seed: int, group: int) -> tuple[np.ndarray, int]:
    """Each block's shard and the shard count: as few shards as keep every shard at or under ``cap`` patches
    (from ``ceil(total / cap)`` up, one more at a time; one block per shard at the last)."""
    n_shards = max(1, math.ceil(int(sizes.sum()) / cap))
    while True:
        rng = np.random.default_rng((seed, 0x6A02, group, n_shards))
        if n_shards >= len(sizes):
            return rng.permutation(len(sizes)), len(sizes)
        shard = _deal(col, sizes, n_shards, rng)
        if np.bincount(shard, weights=sizes, minlength=n_shards).max() <= cap:
            return shard, n_shards
        n_shards += 1


def plan_group(
    group: int, block_sizes: Mapping[int, Sequence[int]], *, samples_per_shard: int, seed: int
) -> list[ShardPlan]:
    """Plan one group's shards from its own slides alone (so any part plans it the same way).

    Blocks are dealt to shards by :func:`_deal` and ordered in each shard by :func:`_interleave`.

    Args:
        group: the group's index (:func:`make_groups`); its shards are named from it (:func:`shard_index`).
        block_sizes: per slide of the group (by slide index), the patch count of each of its blocks.
        samples_per_shard: at most this many patches per shard (when it is at least the largest block).
        seed: the build's seed.
    """
    sizes = {s: b for s, b in block_sizes.items() if len(b)}
    if not sizes:
        return []
    col, block, patches, ids = _flatten(sizes)
    shard, n = _deal_within_cap(col, patches, samples_per_shard, seed, group)
    order = _interleave(shard, col, block, n, len(ids), np.random.default_rng((seed, 0x6A03, group)))
    slides, block_ids = ids[col[order]], block[order]  # (n_blocks,) each, in write order
    ends = np.cumsum(np.bincount(shard, minlength=n)).tolist()
    totals = np.bincount(shard, weights=patches, minlength=n).astype(np.int64).tolist()
    return [
        ShardPlan(shard_index(group, k), group, BlockList(slides[a:b], block_ids[a:b]), total)
        for k, (a, b, total) in enumerate(zip([0, *ends[:-1]], ends, totals, strict=True))
    ]


def make_plan(block_sizes: Sequence[Sequence[int]], *, samples_per_shard: int, group_slides: int, seed: int) -> Plan:
    """Plan a whole build at once (the build plans group by group: :func:`make_groups`, :func:`plan_group`).

    Args:
        block_sizes: per slide, the patch count of each of its blocks (in the slide's block order).
    """
    groups = make_groups(len(block_sizes), group_slides, seed)
    shards = [
        sp
        for g, members in enumerate(groups)
        for sp in plan_group(g, {s: block_sizes[s] for s in members}, samples_per_shard=samples_per_shard, seed=seed)
    ]
    return Plan(groups=tuple(tuple(g) for g in groups), shards=tuple(shards))


def assign_parts(group_weights: Sequence[int], n_parts: int) -> list[int]:
    """Deal groups to ``n_parts`` parts (0-based), heaviest group first to the lightest part.

    The weights are what is known before scanning (the group's bytes of slide files, or its slide count).
    Deterministic: every machine of a cluster build computes the same assignment without talking to the others;
    it shares out the work and never changes the output. Only the first ``n_groups`` parts can get a group (before
    the t-th group is dealt, one of parts 0..t is still empty and beats every later empty part), so only those are
    held: memory by the groups, whatever ``n_parts`` (``--part 1/99999999999999999999``).
    """
    weights = np.asarray(group_weights, dtype=np.int64).reshape(-1)  # (n_groups,)
    lightest = [(0, p) for p in range(min(n_parts, len(weights)))]  # (load, part): a heap, lightest (lowest) first
    part = [0] * len(weights)
    for g, w in zip(np.argsort(-weights, kind="stable").tolist(), (-np.sort(-weights)).tolist(), strict=True):
        load, p = heapq.heappop(lightest)
        part[g] = p
        heapq.heappush(lightest, (load + w, p))
    return part


def part_groups(groups: Sequence[Sequence[int]], sizes: Sequence[int], part: tuple[int, int] | None) -> list[int]:
    """The groups part ``part`` (``(i, n)``, 1-based; None: the whole build) builds, in group order.

    Groups are weighed by the bytes of their slide files (``sizes``, per slide; by their slide counts when no
    size is known), which is all that is known before scanning.
    """
    if part is None:
        return list(range(len(groups)))
    lengths = np.fromiter(map(len, groups), np.int64, len(groups))  # (n_groups,)
    members = np.fromiter(itertools.chain.from_iterable(groups), np.int64, int(lengths.sum()))
    ends = np.cumsum(np.r_[0, np.asarray(sizes, dtype=np.int64)[members]])[np.cumsum(lengths)]
    weights = ends - np.r_[0, ends[:-1]]  # (n_groups,) bytes of each group's slide files
    if not weights.any():
        weights = lengths
    return [g for g, p in enumerate(assign_parts(weights.tolist(), part[1])) if p == part[0] - 1]


def empty_part_reason(part: tuple[int, int], n_slides: int, n_groups: int, group_slides: int) -> str:
    """Why part ``part`` got no slides: a part builds whole groups, and there are fewer groups than parts."""
    fits = max(1, -(-n_slides // part[1]))  # ceil: the --group-slides that gives every part a group
    return (
        f"part {part[0]}/{part[1]} got no group of slides, so it builds nothing: the {n_slides} slides make "
        f"{n_groups} group{'s' if n_groups != 1 else ''} of at most --group-slides {group_slides} slides, a part "
        f"builds whole groups, and the groups went to the other parts (--group-slides {fits} gives each of "
        f"{part[1]} parts a group)"
    )
