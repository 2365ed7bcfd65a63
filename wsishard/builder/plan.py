"""Pure, seeded planning: slides into groups, each group's blocks into shards, and each shard's write order.

No I/O. Groups come from the slide count and the seed alone (before any scan), and each group is planned from
its own slides alone, so the parts of a cluster build plan their groups without one another. The same inputs and
seed give the same plan; the plan alone fixes which samples land in which shard
and in what order, so extraction can run shards in any order, in any process, and redo any of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wsishard.format import shard_index


@dataclass(frozen=True)
class ShardPlan:
    """One shard: its index (:func:`~wsishard.format.shard_index`: its group and its number in the group), its
    group, and its blocks in write order.

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
    n_groups = math.ceil(n_slides / group_slides)
    return [sorted(chunk.tolist()) for chunk in np.array_split(order, n_groups)]


def assign_blocks(
    block_sizes: Mapping[int, Sequence[int]], n_shards: int, rng: np.random.Generator
) -> list[list[tuple[int, int]]]:
    """Deal a group's blocks to ``n_shards`` shards: each slide spread evenly, shard patch counts balanced.

    Slides are visited in a random order and each slide's blocks in a random order; a block goes to the shard
    holding the fewest blocks of its slide so far, then the fewest patches, then a random one. So every slide
    with at least ``n_shards`` blocks lands in every shard of its group.
    """
    shards: list[list[tuple[int, int]]] = [[] for _ in range(n_shards)]
    load = [0] * n_shards
    slides = sorted(block_sizes)
    for s in (slides[i] for i in rng.permutation(len(slides))):
        mine = [0] * n_shards
        order = rng.permutation(len(block_sizes[s])).tolist()
        ties = rng.random((len(order), n_shards)).tolist()  # the draws one per block would give, at once
        for b, tie in zip(order, ties, strict=True):
            k = min(range(n_shards), key=lambda k: (mine[k], load[k], tie[k]))
            shards[k].append((s, b))
            load[k] += int(block_sizes[s][b])
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
    stacks = [queues[s] for s in sorted(queues)]
    counts = [len(q) for q in stacks]
    slides = range(len(stacks))
    order: list[tuple[int, int]] = []
    prev, remaining, live = -1, len(blocks), len(stacks)
    for u in rng.random(len(blocks)).tolist():  # plain Python per block: numpy's per-call cost dominated here
        big = max(slides, key=counts.__getitem__)  # the first of the largest, as argmax
        if (2 * counts[big] > remaining and big != prev) or live == 1:
            pick = big
        else:
            pick, target = -1, u * (remaining - (counts[prev] if prev >= 0 else 0))
            for i in slides:
                if i != prev and counts[i]:
                    pick, target = i, target - counts[i]
                    if target < 0:
                        break
        order.append(stacks[pick].pop())
        counts[pick] -= 1
        live -= counts[pick] == 0
        prev, remaining = pick, remaining - 1
    return order


def _deal_within_cap(block_sizes: Mapping[int, Sequence[int]], total: int, cap: int, seed: int,
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


def plan_group(group: int, block_sizes: Mapping[int, Sequence[int]], *, samples_per_shard: int,
               seed: int) -> list[ShardPlan]:  # fmt: skip
    """Plan one group's shards from its own slides alone (so any part plans it the same way).

    Args:
        group: the group's index (:func:`make_groups`); its shards are named from it (:func:`shard_index`).
        block_sizes: per slide of the group (by slide index), the patch count of each of its blocks.
        samples_per_shard: at most this many patches per shard (when it is at least the largest block).
        seed: the build's seed.
    """
    sizes = {s: b for s, b in block_sizes.items() if len(b)}
    if not sizes:
        return []
    rng = np.random.default_rng((seed, 0x6A03, group))
    total = sum(int(sum(b)) for b in sizes.values())
    shards: list[ShardPlan] = []
    for blocks in _deal_within_cap(sizes, total, samples_per_shard, seed, group):
        if blocks:
            ordered = tuple(interleave(blocks, rng))
            patches = sum(sizes[s][b] for s, b in ordered)
            shards.append(ShardPlan(shard_index(group, len(shards)), group, ordered, patches))
    return shards


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
    it shares out the work and never changes the output.
    """
    load = [0] * n_parts
    part = [0] * len(group_weights)
    for g in sorted(range(len(group_weights)), key=lambda g: (-group_weights[g], g)):
        p = min(range(n_parts), key=lambda p: (load[p], p))
        part[g] = p
        load[p] += group_weights[g]
    return part


def part_groups(groups: Sequence[Sequence[int]], sizes: Sequence[int], part: tuple[int, int] | None) -> list[int]:
    """The groups part ``part`` (``(i, n)``, 1-based; None: the whole build) builds, in group order.

    Groups are weighed by the bytes of their slide files (``sizes``, per slide; by their slide counts when no
    size is known), which is all that is known before scanning.
    """
    if part is None:
        return list(range(len(groups)))
    weights = [sum(sizes[s] for s in g) for g in groups]
    if not any(weights):
        weights = [len(g) for g in groups]
    return [g for g, p in enumerate(assign_parts(weights, part[1])) if p == part[0] - 1]
