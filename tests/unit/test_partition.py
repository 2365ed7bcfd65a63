"""Pure tests of the shard assignment and epoch batch arithmetic (no I/O, no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from wsishard.errors import TopologyError
from wsishard.streaming.partition import (
    batch_budgets,
    deal,
    epoch_order,
    plan_epoch,
    resample_order,
    worker_shards,
)
from wsishard.streaming.world import World


def _random_case(rng: np.random.Generator) -> tuple[np.ndarray, int, int, int]:
    world_size, num_workers = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    n = int(rng.integers(world_size * num_workers, world_size * num_workers + 40))
    counts = rng.integers(0, 60, n) if rng.random() < 0.5 else np.full(n, int(rng.integers(1, 60)))
    return counts, world_size, num_workers, int(rng.integers(1, 17))


def _all_worlds(world_size: int, num_workers: int) -> list[World]:
    return [
        World(rank=r, world_size=world_size, worker=w, num_workers=num_workers)
        for r in range(world_size)
        for w in range(num_workers)
    ]


# ---- World and topology -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"world_size": 0}, "0"),
        ({"rank": 2, "world_size": 2}, "2"),
        ({"num_workers": -1}, "-1"),
        ({"worker": 3, "num_workers": 3}, "3"),
    ],
)
def test_world_validation_names_the_bad_value(kwargs: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        World(**kwargs)


def test_world_is_frozen_and_with_worker_keeps_rank() -> None:
    world = World(rank=1, world_size=4)
    assert world.with_worker(2, 3) == World(rank=1, world_size=4, worker=2, num_workers=3)
    assert world.with_worker(2, 3).total_workers == 12
    with pytest.raises(AttributeError):
        world.rank = 0  # type: ignore[misc]


def test_too_few_samples_for_the_readers_is_a_value_error() -> None:
    plan_epoch(np.ones(4), world_size=2, num_workers=2, batch_size=1, seed=0, epoch=0)  # one sample each: fine
    with pytest.raises(TopologyError, match="cannot give each") as info:
        plan_epoch(np.ones(3), world_size=2, num_workers=2, batch_size=1, seed=0, epoch=0)
    assert isinstance(info.value, ValueError)


# ---- the deal and the order -------------------------------------------------------------------------------


def test_deal_is_a_permutation_with_balanced_bins() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        counts, bins = rng.integers(0, 100, int(rng.integers(1, 50))), int(rng.integers(1, 9))
        order = deal(counts, bins, np.random.default_rng(1))
        assert sorted(order.tolist()) == list(range(len(counts)))
        totals = [counts[order[b::bins]].sum() for b in range(bins)]
        assert max(totals) - min(totals) <= counts.max()
        sizes = [len(order[b::bins]) for b in range(bins)]  # the islice shape: sizes differ by at most 1
        assert max(sizes) - min(sizes) <= 1


def test_equal_shards_divisible_by_ranks_give_equal_rank_totals() -> None:
    counts = np.full(24, 50)
    order = epoch_order(counts, world_size=4, num_workers=3, seed=0, epoch=5)
    assert {int(counts[order[r::4]].sum()) for r in range(4)} == {300}


def test_every_shard_goes_to_exactly_one_rank_and_worker() -> None:
    rng = np.random.default_rng(1)
    for epoch in range(200):
        counts, world_size, num_workers, _ = _random_case(rng)
        order = epoch_order(counts, world_size=world_size, num_workers=num_workers, seed=3, epoch=epoch)
        parts = [worker_shards(order, w).tolist() for w in _all_worlds(world_size, num_workers)]
        assert sorted(i for part in parts for i in part) == list(range(len(counts)))
        assert all(len(part) >= 1 for part in parts)


def test_split_is_rank_slice_then_worker_slice() -> None:
    order = np.arange(100, 117)
    world = World(rank=1, world_size=3, worker=1, num_workers=2)
    assert worker_shards(order, world).tolist() == list(range(100, 117))[1::3][1::2]


def test_ranks_and_workers_are_balanced_by_samples() -> None:
    rng = np.random.default_rng(2)
    for epoch in range(200):
        counts, world_size, num_workers, _ = _random_case(rng)
        order = epoch_order(counts, world_size=world_size, num_workers=num_workers, seed=0, epoch=epoch)
        ranks = [int(counts[order[r::world_size]].sum()) for r in range(world_size)]
        assert max(ranks) - min(ranks) <= counts.max()
        for r in range(world_size):
            mine = order[r::world_size]
            workers = [int(counts[mine[w::num_workers]].sum()) for w in range(num_workers)]
            assert max(workers) - min(workers) <= counts.max()


def test_order_is_seeded_and_changes_with_epoch_and_seed() -> None:
    counts = np.random.default_rng(0).integers(1, 50, 40)
    kw = {"world_size": 2, "num_workers": 2}
    first = epoch_order(counts, seed=1, epoch=0, **kw)
    assert np.array_equal(first, epoch_order(counts, seed=1, epoch=0, **kw))
    assert not np.array_equal(first, epoch_order(counts, seed=1, epoch=1, **kw))
    assert not np.array_equal(first, epoch_order(counts, seed=2, epoch=0, **kw))
    # not only the order within a rank: which rank reads a shard changes between epochs
    rank0 = [set(epoch_order(counts, seed=1, epoch=e, **kw)[0::2].tolist()) for e in range(4)]
    assert len({frozenset(s) for s in rank0}) > 1


def test_resample_order_depends_on_seed_rank_worker_and_pass() -> None:
    base = resample_order(50, seed=0, rank=0, worker=0, pass_index=0)
    assert sorted(base.tolist()) == list(range(50))
    assert np.array_equal(base, resample_order(50, seed=0, rank=0, worker=0, pass_index=0))
    for kw in ({"seed": 1}, {"rank": 1}, {"worker": 1}, {"pass_index": 1}):
        args = {"seed": 0, "rank": 0, "worker": 0, "pass_index": 0, **kw}
        assert not np.array_equal(base, resample_order(50, **args))


# ---- budgets and the epoch plan ---------------------------------------------------------------------------


def _reference_budgets(samples: np.ndarray, b: int, drop_last: bool) -> np.ndarray:
    """One batch at a time: cut a short last batch (smallest first), then the fullest worker's last batch."""
    full, rem = samples // b, samples % b
    budgets = full + ((rem > 0) & (not drop_last))
    target = budgets.sum(axis=1).min()
    for r in range(len(samples)):
        while budgets[r].sum() > target:
            short = [w for w in range(samples.shape[1]) if not drop_last and budgets[r, w] > full[r, w]]
            w = min(short, key=lambda w: rem[r, w]) if short else int(np.argmax(budgets[r]))
            budgets[r, w] -= 1
    return budgets


def test_budgets_match_a_one_at_a_time_reference() -> None:
    rng = np.random.default_rng(3)
    for _ in range(500):
        samples = rng.integers(0, 80, (int(rng.integers(1, 6)), int(rng.integers(1, 5))))
        b, drop_last = int(rng.integers(1, 12)), bool(rng.integers(2))
        got = batch_budgets(samples, batch_size=b, drop_last=drop_last)
        want = _reference_budgets(samples, b, drop_last)
        assert np.array_equal(got.sum(axis=1), want.sum(axis=1))
        assert np.array_equal(np.sort(got, axis=1), np.sort(want, axis=1))  # equally level
        assert np.minimum(got * b, samples).sum() == np.minimum(want * b, samples).sum()


def test_plan_gives_equal_batches_per_rank_and_bounded_drop() -> None:
    rng = np.random.default_rng(4)
    for epoch in range(300):
        counts, world_size, num_workers, b = _random_case(rng)
        drop_last = bool(epoch % 2)
        plan = plan_epoch(
            counts,
            world_size=world_size,
            num_workers=num_workers,
            batch_size=b,
            seed=9,
            epoch=epoch,
            drop_last=drop_last,
        )
        assert set(plan.budgets.sum(axis=1).tolist()) == {plan.batches_per_rank}
        most = plan.samples // b + ((plan.samples % b > 0) & (not drop_last))
        assert (plan.budgets <= most).all() and (plan.budgets >= 0).all()
        if drop_last:
            assert (plan.kept == plan.budgets * b).all()
        rank_samples = plan.samples.sum(axis=1)
        surplus = rank_samples - rank_samples.min()
        assert (surplus <= counts.max()).all()  # at most one shard's worth above the smallest rank
        partial = num_workers * (b - 1) if drop_last else num_workers * b
        assert (plan.dropped_per_rank <= surplus + partial).all()
        assert (plan.dropped_per_rank >= 0).all()


def test_smallest_rank_drops_only_short_batches() -> None:
    counts = np.array([13, 7, 9, 22, 5, 16, 11, 8, 19])
    plan = plan_epoch(counts, world_size=2, num_workers=2, batch_size=4, seed=0, epoch=0)
    smallest = int(np.argmin(plan.samples.sum(axis=1)))
    assert plan.dropped_per_rank[smallest] == int((plan.samples[smallest] % 4).sum())


def test_single_process_without_drop_last_keeps_every_sample() -> None:
    counts = np.array([13, 7, 9, 22, 5])
    for workers in (1, 2, 3):
        plan = plan_epoch(counts, world_size=1, num_workers=workers, batch_size=4, seed=0, epoch=0, drop_last=False)
        assert plan.dropped_per_rank.tolist() == [0]
        assert plan.kept.sum() == counts.sum()


def test_plan_accessors_agree_with_the_order() -> None:
    counts = np.arange(1, 13)
    plan = plan_epoch(counts, world_size=3, num_workers=2, batch_size=2, seed=1, epoch=2)
    for world in _all_worlds(3, 2):
        shards = plan.shards_of(world)
        assert int(counts[shards].sum()) == plan.samples[world.rank, world.worker]
        assert plan.budget_of(world) == plan.budgets[world.rank, world.worker]


def test_plan_scales_to_many_shards_and_ranks() -> None:
    counts = np.random.default_rng(5).integers(900, 1100, 20_000)
    plan = plan_epoch(counts, world_size=64, num_workers=8, batch_size=256, seed=0, epoch=0)
    assert set(plan.budgets.sum(axis=1).tolist()) == {plan.batches_per_rank}
    assert plan.dropped_per_rank.max() < counts.max() + 8 * 256
