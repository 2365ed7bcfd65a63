"""Pure, seeded planning: groups, block-to-shard assignment, interleaving."""

from __future__ import annotations

import itertools

import numpy as np

from wsishard.builder.plan import interleave, make_groups, make_plan


def _sizes(n_slides: int, blocks: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 17, size=blocks).tolist() for _ in range(n_slides)]


def test_every_block_planned_exactly_once() -> None:
    sizes = _sizes(40, 12)
    plan = make_plan(sizes, samples_per_shard=300, group_slides=16, seed=3)
    planned = [blk for sp in plan.shards for blk in sp.blocks]
    expected = [(s, b) for s in range(40) for b in range(12)]
    assert sorted(planned) == expected
    assert [sp.index for sp in plan.shards] == list(range(len(plan.shards)))


def test_groups_are_bounded_balanced_and_cover_all_slides() -> None:
    counts = [int(x) for x in np.random.default_rng(1).integers(50, 500, size=70)]
    groups = make_groups(counts, group_slides=16, seed=0)
    assert sorted(itertools.chain(*groups)) == list(range(70))
    assert all(len(g) <= 16 for g in groups)
    loads = [sum(counts[s] for s in g) for g in groups]
    assert max(loads) - min(loads) <= max(counts)


def test_slides_without_patches_are_left_out() -> None:
    assert make_groups([0, 5, 0, 3], group_slides=8, seed=0) == [[1, 3]] or make_groups(
        [0, 5, 0, 3], group_slides=8, seed=0
    ) == [[3, 1]]


def test_plan_is_reproducible_and_seed_dependent() -> None:
    sizes = _sizes(24, 10)
    a = make_plan(sizes, samples_per_shard=200, group_slides=32, seed=7)
    b = make_plan(sizes, samples_per_shard=200, group_slides=32, seed=7)
    c = make_plan(sizes, samples_per_shard=200, group_slides=32, seed=8)
    assert a == b
    assert a != c


def test_shards_mix_slides_and_are_balanced() -> None:
    sizes = _sizes(24, 20)
    plan = make_plan(sizes, samples_per_shard=600, group_slides=32, seed=0)
    assert len(plan.shards) >= 4
    for sp in plan.shards:
        slides = [s for s, _ in sp.blocks]
        assert len(set(slides)) >= 0.75 * 24  # most of the group's slides in every shard
        runs = max(len(list(g)) for _, g in itertools.groupby(slides))
        assert runs == 1  # consecutive blocks always come from different slides
    patches = [sp.patches for sp in plan.shards]
    assert max(patches) - min(patches) <= 0.1 * np.mean(patches)  # balanced to within a few blocks


def test_interleave_avoids_neighbours_whenever_possible() -> None:
    rng = np.random.default_rng(5)
    for _ in range(500):
        n = int(rng.integers(1, 30))
        blocks = [(int(rng.integers(0, 5)), i) for i in range(n)]
        order = interleave(blocks, np.random.default_rng(int(rng.integers(1 << 30))))
        assert sorted(order) == sorted(blocks)
        counts = np.bincount([s for s, _ in blocks])
        neighbours = sum(a[0] == b[0] for a, b in itertools.pairwise(order))
        if counts.max() <= (n + 1) // 2:
            assert neighbours == 0
        else:  # one slide dominates: the fewest neighbours possible
            assert neighbours == 2 * counts.max() - n - 1


def test_shards_never_exceed_the_sample_cap() -> None:
    for seed in range(5):
        sizes = _sizes(13, 9, seed)
        for cap in (16, 25, 40, 300):
            plan = make_plan(sizes, samples_per_shard=cap, group_slides=4, seed=seed)
            assert max(sp.patches for sp in plan.shards) <= cap
            assert sum(sp.patches for sp in plan.shards) == sum(map(sum, sizes))
