"""Pure, seeded planning: slides into groups, each group's blocks into shards, and each shard's write order.

No I/O. The same inputs and seed give the same plan; the plan alone fixes which samples land in which shard
and in what order, so extraction can run shards in any order, in any process, and redo any of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardPlan:
    """One shard: its global index, its group, and its blocks in write order.

    Attributes:
        blocks: ((slide, block), ...) with ``slide`` an index into the planned slides and ``block`` an index into
            that slide's block list.
        patches: planned patch count (before any slide fails during extraction).
    """

    index: int
    group: int
    blocks: tuple[tuple[int, int], ...]
    patches: int


@dataclass(frozen=True)
class Plan:
    groups: tuple[tuple[int, ...], ...]  # slide indices per group
    shards: tuple[ShardPlan, ...]


def make_groups(patch_counts: Sequence[int], group_slides: int, seed: int) -> list[list[int]]:
    """Shuffle slides with the seed and cut them into groups of at most ``group_slides``, balanced by patches.

    Args:
        patch_counts: patches per slide, indexed like the slides (slides with none are left out).
    """
    slides = [i for i, n in enumerate(patch_counts) if n > 0]
    if not slides:
        return []
    rng = np.random.default_rng((seed, 0x6A01))
    shuffled = [slides[i] for i in rng.permutation(len(slides))]
    n_groups = math.ceil(len(shuffled) / group_slides)
    cap = math.ceil(len(shuffled) / n_groups)
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    load = [0] * n_groups
    for s in sorted(shuffled, key=lambda s: -patch_counts[s]):  # stable: ties keep the shuffled order
        g = min((g for g in range(n_groups) if len(groups[g]) < cap), key=lambda g: (load[g], g))
        groups[g].append(s)
        load[g] += patch_counts[s]
    return [sorted(g, key=shuffled.index) for g in groups]


def assign_blocks(
    block_sizes: dict[int, Sequence[int]], n_shards: int, rng: np.random.Generator
) -> list[list[tuple[int, int]]]:
    """Deal a group's blocks to ``n_shards`` shards: each slide spread evenly, shard patch counts balanced.

    Slides are visited in a random order and each slide's blocks in a random order; a block goes to the shard
    holding the fewest blocks of its slide so far, then the fewest patches, then a random one. So every slide
    with at least ``n_shards`` blocks lands in every shard of its group.
    """
    shards: list[list[tuple[int, int]]] = [[] for _ in range(n_shards)]
    load = np.zeros(n_shards, dtype=np.int64)
    slides = sorted(block_sizes)
    for s in (slides[i] for i in rng.permutation(len(slides))):
        mine = np.zeros(n_shards, dtype=np.int64)
        for b in rng.permutation(len(block_sizes[s])).tolist():
            k = int(np.lexsort((rng.random(n_shards), load, mine))[0])
            shards[k].append((s, b))
            load[k] += block_sizes[s][b]
            mine[k] += 1
    return shards


def interleave(blocks: list[tuple[int, int]], rng: np.random.Generator) -> list[tuple[int, int]]:
    """Order a shard's blocks so that consecutive blocks come from different slides wherever possible.

    Each step picks a slide at random (weighted by its remaining blocks) among those other than the previous
    one, except that a slide holding more than half of what remains must go now: that keeps an order with no
    two neighbours from one slide possible whenever one exists.
    """
    queues: dict[int, list[tuple[int, int]]] = {}
    for blk in (blocks[i] for i in rng.permutation(len(blocks))):
        queues.setdefault(blk[0], []).append(blk)
    order: list[tuple[int, int]] = []
    prev = -1
    remaining = len(blocks)
    while remaining:
        slides = sorted(queues)
        counts = np.array([len(queues[s]) for s in slides])
        big = int(np.argmax(counts))
        if (2 * counts[big] > remaining and slides[big] != prev) or len(slides) == 1:
            pick = slides[big]
        else:
            weights = np.where(np.array(slides) == prev, 0, counts).astype(float)
            pick = slides[int(rng.choice(len(slides), p=weights / weights.sum()))]
        order.append(queues[pick].pop())
        if not queues[pick]:
            del queues[pick]
        prev, remaining = pick, remaining - 1
    return order


def _deal_within_cap(block_sizes: dict[int, Sequence[int]], total: int, cap: int, seed: int,
                     group: int) -> list[list[tuple[int, int]]]:  # fmt: skip
    """Deal blocks to as few shards as keep every shard at or under ``cap`` patches (when blocks allow it)."""
    n_blocks = sum(len(b) for b in block_sizes.values())
    n_shards = max(1, math.ceil(total / cap))
    while True:
        rng = np.random.default_rng((seed, 0x6A02, group, n_shards))
        shards = assign_blocks(block_sizes, n_shards, rng)
        heaviest = max(sum(block_sizes[s][b] for s, b in shard) for shard in shards)
        if heaviest <= cap or n_shards >= n_blocks:
            return shards
        n_shards += 1


def make_plan(block_sizes: Sequence[Sequence[int]], *, samples_per_shard: int, group_slides: int, seed: int) -> Plan:
    """Plan the whole build.

    Args:
        block_sizes: per slide, the patch count of each of its blocks (in the slide's block order).
        samples_per_shard: at most this many patches per shard (when it is at least the largest block).
        group_slides: slides per group (the unit that shards mix over).
        seed: the build's seed.
    """
    counts = [int(sum(b)) for b in block_sizes]
    groups = make_groups(counts, group_slides, seed)
    shards: list[ShardPlan] = []
    for g, members in enumerate(groups):
        rng = np.random.default_rng((seed, 0x6A03, g))
        total = sum(counts[s] for s in members)
        for blocks in _deal_within_cap({s: block_sizes[s] for s in members}, total, samples_per_shard, seed, g):
            if not blocks:
                continue
            ordered = tuple(interleave(blocks, rng))
            shards.append(ShardPlan(len(shards), g, ordered, sum(block_sizes[s][b] for s, b in ordered)))
    return Plan(groups=tuple(tuple(g) for g in groups), shards=tuple(shards))


def assign_parts(group_patches: Sequence[int], n_parts: int) -> list[int]:
    """Deal groups to ``n_parts`` parts (0-based), largest group first to the lightest part: balanced by patches.

    Deterministic: every machine of a cluster build computes the same assignment without talking to the others.
    """
    load = [0] * n_parts
    part = [0] * len(group_patches)
    for g in sorted(range(len(group_patches)), key=lambda g: (-group_patches[g], g)):
        p = min(range(n_parts), key=lambda p: (load[p], p))
        part[g] = p
        load[p] += group_patches[g]
    return part
