"""Pure, seeded planning: groups, block-to-shard assignment, interleaving."""

from __future__ import annotations

import itertools
import pickle

import numpy as np

from wsishard.builder.plan.plan import (
    BlockList,
    assign_parts,
    interleave,
    make_groups,
    make_plan,
    part_groups,
    plan_group,
)
from wsishard.format import shard_index, shard_name, shard_order


def _sizes(n_slides: int, blocks: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 17, size=blocks).tolist() for _ in range(n_slides)]


def test_a_block_list_is_the_sequence_of_its_slide_and_block_pairs() -> None:
    pairs = [(7, 0), (3, 2), (7, 1), (5, 0)]
    blocks = BlockList(np.array([s for s, _ in pairs]), np.array([b for _, b in pairs]))
    assert list(blocks) == pairs and len(blocks) == 4 and blocks[1] == (3, 2) and blocks[-1] == (5, 0)
    assert all(type(v) is int for pair in blocks for v in pair)  # plain ints, as tuples of them would hold
    assert blocks[1:3] == pairs[1:3] and isinstance(blocks[1:3], BlockList)
    assert blocks == tuple(pairs) and blocks != pairs[:3] and blocks != [(7, 0), (3, 2), (7, 1), (5, 1)]
    assert pickle.loads(pickle.dumps(blocks)) == blocks


def test_every_block_planned_exactly_once() -> None:
    sizes = _sizes(40, 12)
    plan = make_plan(sizes, samples_per_shard=300, group_slides=16, seed=3)
    planned = [blk for sp in plan.shards for blk in sp.blocks]
    expected = [(s, b) for s in range(40) for b in range(12)]
    assert sorted(planned) == expected
    # shards are numbered within their group: (group, k), k = 0, 1, ... in every group
    keys = [(sp.index >> 20, sp.index & 0xFFFFF) for sp in plan.shards]
    assert [g for g, _ in keys] == [sp.group for sp in plan.shards] == sorted(g for g, _ in keys)
    for g in {sp.group for sp in plan.shards}:
        assert [k for gg, k in keys if gg == g] == list(range(sum(sp.group == g for sp in plan.shards)))
    assert [shard_order(shard_name(sp.index)) for sp in plan.shards] == keys


def test_groups_come_from_the_slide_count_and_seed_alone_and_are_even() -> None:
    groups = make_groups(70, group_slides=16, seed=0)
    assert sorted(itertools.chain(*groups)) == list(range(70))
    assert [len(g) for g in groups] == [14] * 5  # ceil(70 / 16) = 5 groups, sizes within one
    assert make_groups(70, group_slides=16, seed=0) == groups
    assert make_groups(70, group_slides=16, seed=1) != groups
    assert [len(g) for g in make_groups(33, group_slides=32, seed=0)] == [17, 16]
    assert make_groups(0, group_slides=32, seed=0) == []


def test_a_group_is_planned_from_its_own_slides_alone() -> None:
    """What makes the parts of a cluster build independent: a group's shards do not depend on other groups."""
    sizes = _sizes(40, 12)
    plan = make_plan(sizes, samples_per_shard=300, group_slides=16, seed=3)
    for g, members in enumerate(plan.groups):
        alone = plan_group(g, {s: sizes[s] for s in members}, samples_per_shard=300, seed=3)
        assert tuple(alone) == tuple(sp for sp in plan.shards if sp.group == g)
    assert plan_group(5, {1: [], 2: []}, samples_per_shard=300, seed=3) == []  # slides without patches: no shard


def test_parts_take_every_group_once_balanced_by_bytes() -> None:
    groups = make_groups(100, group_slides=8, seed=0)
    sizes = [int(x) for x in np.random.default_rng(2).integers(10**8, 3 * 10**9, size=100)]
    for n in (1, 2, 3, 7):
        parts = [part_groups(groups, sizes, (i, n)) for i in range(1, n + 1)]
        assert sorted(itertools.chain(*parts)) == list(range(len(groups)))
        loads = [sum(sizes[s] for g in p for s in groups[g]) for p in parts]
        biggest = max(sum(sizes[s] for s in g) for g in groups)
        assert max(loads) - min(loads) <= biggest
    assert part_groups(groups, [0] * 100, (1, 3)) == [g for g, p in enumerate(assign_parts([8] * 13, 3)) if p == 0]
    assert part_groups(groups, sizes, None) == list(range(len(groups)))


def test_a_part_count_past_the_groups_costs_memory_by_the_groups_not_the_parts() -> None:
    """Issue 42: ``--part 1/99999999999999999999`` (or ``SLURM_ARRAY_TASK_COUNT=10**12``) made ``assign_parts`` hold
    one entry per part: ``MemoryError`` or the OOM killer. A million parts for 13 groups is now 13 entries."""
    import tracemalloc

    groups = make_groups(100, group_slides=8, seed=0)
    weights = [int(x) for x in np.random.default_rng(2).integers(1, 10**9, size=len(groups))]
    tracemalloc.start()
    try:
        dealt = assign_parts(weights, 10**6)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # bytes: the groups' entries, not a million parts'
    assert sorted(dealt) == list(range(len(groups)))  # each group alone in one of the first parts
    assert dealt == assign_parts(weights, len(groups))  # the same deal as with just enough parts
    huge = 99_999_999_999_999_999_999
    assert assign_parts(weights, huge) == dealt
    assert part_groups(groups, [0] * 100, (1, huge)) == [0]
    assert part_groups(groups, [0] * 100, (huge, huge)) == []


def test_shard_index_packs_group_and_number() -> None:
    assert shard_name(shard_index(0, 0)) == "shard-000000-0000.tar"
    assert shard_name(shard_index(12, 3)) == "shard-000012-0003.tar"
    assert shard_order(shard_name(shard_index(1_234_567, 54_321))) == (1_234_567, 54_321)
    assert shard_order("shard-000042.tar") == (42, -1)  # a version-1 name


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


def test_a_shard_keeps_each_slides_block_order() -> None:
    """Within a shard a slide's blocks come in the slide's own order (neighbours close: tiles reused)."""
    for seed in range(4):
        plan = make_plan(_sizes(9, 40, seed), samples_per_shard=200, group_slides=9, seed=seed)
        assert len(plan.shards) >= 3
        for sp in plan.shards:
            for slide in {s for s, _ in sp.blocks}:
                mine = [b for s, b in sp.blocks if s == slide]
                assert mine == sorted(mine)


def test_shards_never_exceed_the_sample_cap() -> None:
    for seed in range(5):
        sizes = _sizes(13, 9, seed)
        for cap in (16, 25, 40, 300):
            plan = make_plan(sizes, samples_per_shard=cap, group_slides=4, seed=seed)
            assert max(sp.patches for sp in plan.shards) <= cap
            assert sum(sp.patches for sp in plan.shards) == sum(map(sum, sizes))


def test_each_slide_is_dealt_evenly_over_its_groups_shards() -> None:
    """A slide's block counts per shard differ by at most one: with at least as many blocks as shards it is in
    every shard of its group."""
    rng = np.random.default_rng(11)
    for trial in range(20):
        sizes = [rng.integers(1, 17, size=int(rng.integers(1, 60))).tolist() for _ in range(32)]
        shards = plan_group(trial, dict(enumerate(sizes)), samples_per_shard=int(rng.integers(200, 2000)), seed=trial)
        per = np.zeros((32, len(shards)), dtype=int)
        for k, sp in enumerate(shards):
            for s, _ in sp.blocks:
                per[s, k] += 1
        assert (per.max(axis=1) - per.min(axis=1) <= 1).all()
        assert all((per[s] > 0).all() for s in range(32) if len(sizes[s]) >= len(shards))


def test_shard_patch_counts_balance_to_within_two_blocks() -> None:
    """Full-ish 16-patch blocks of 32 slides of very different sizes: the fewest shards the cap allows, and shard
    patch counts within two blocks of each other."""
    rng = np.random.default_rng(12)
    for trial in range(20):
        sizes = {
            s: np.minimum(16, rng.integers(1, 30, size=int(rng.lognormal(4.5, 1.0)) + 1)).tolist() for s in range(32)
        }
        total = sum(map(sum, sizes.values()))
        cap = max(64, total // int(rng.integers(1, 12)) + 64)
        shards = plan_group(trial, sizes, samples_per_shard=cap, seed=trial)
        patches = [sp.patches for sp in shards]
        assert len(shards) == -(-total // cap)
        assert max(patches) - min(patches) <= 32
