"""Fewer shards than readers: the split moves from shards to samples, as split_by_node/split_by_worker would."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import webdataset as wds

from wsishard.errors import TopologyError
from wsishard.streaming.partition import (
    Slice,
    check_readers,
    epoch_order,
    plan_epoch,
    reader_slices,
    worker_shards,
)
from wsishard.streaming.world import World


def _worlds(ranks: int, workers: int) -> list[World]:
    return [
        World(rank=r, world_size=ranks, worker=w, num_workers=workers)
        for r, w in itertools.product(range(ranks), range(workers))
    ]


def _kept(slices: list[Slice], counts: np.ndarray) -> set[tuple[int, int]]:
    return {(sl.shard, k) for sl in slices for k in range(int(counts[sl.shard])) if sl.keeps(k)}


@pytest.mark.parametrize(("counts", "ranks", "workers"), [((599,), 2, 2), ((10, 7, 12), 2, 2), ((5, 9), 3, 4)])
def test_every_sample_goes_to_exactly_one_reader_with_balanced_counts(
    counts: tuple[int, ...], ranks: int, workers: int
) -> None:
    counts_a = np.asarray(counts)
    order = epoch_order(counts_a, world_size=ranks, num_workers=workers, seed=3, epoch=1)
    kept = [_kept(reader_slices(order, counts_a, w), counts_a) for w in _worlds(ranks, workers)]
    assert sum(len(k) for k in kept) == sum(counts) == len(set().union(*kept))  # a partition of every sample
    assert max(map(len, kept)) - min(map(len, kept)) <= len(counts)  # within one sample per shard


def test_one_shard_is_split_by_sample_exactly_as_webdataset_splits_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = np.asarray([23])
    order = np.asarray([0])
    for world in _worlds(3, 2):
        for name, value in (("RANK", world.rank), ("WORLD_SIZE", 3), ("WORKER", world.worker), ("NUM_WORKERS", 2)):
            monkeypatch.setenv(name, str(value))
        theirs = list(wds.split_by_worker(wds.split_by_node(iter(range(23)))))
        assert sorted(k for _, k in _kept(reader_slices(order, counts, world), counts)) == theirs


def test_enough_shards_keep_the_shard_level_split() -> None:
    counts = np.asarray([4, 5, 6, 7, 8])
    order = np.asarray([3, 0, 4, 1, 2])
    for world in _worlds(2, 2):
        slices = reader_slices(order, counts, world)
        assert [sl.shard for sl in slices] == worker_shards(order, world).tolist()
        assert all(sl.step == 1 and sl.phase == 0 for sl in slices)


def test_an_epoch_with_fewer_shards_than_readers_has_equal_batches_and_no_repeats() -> None:
    counts = np.asarray([599])  # the two-slide build: one shard, 2 ranks x 2 workers
    plan = plan_epoch(counts, world_size=2, num_workers=2, batch_size=64, seed=0, epoch=0)
    assert plan.batches_per_rank == 4  # 150 (or 149) samples per reader: 2 batches of 64 each
    worlds = _worlds(2, 2)
    kept = [_kept(plan.slices_of(w), counts) for w in worlds]
    assert len(set().union(*kept)) == sum(map(len, kept)) == 599
    assert [plan.budget_of(w) for w in worlds] == [2, 2, 2, 2]


def test_too_few_samples_for_the_readers_is_an_error_that_says_so() -> None:
    check_readers(np.asarray([2, 2]), 2, 2)
    with pytest.raises(TopologyError, match=r"3 sample\(s\) in 2 shard\(s\) cannot give each of 2 rank\(s\) x 2"):
        check_readers(np.asarray([2, 1]), 2, 2)
    with pytest.raises(TopologyError):
        plan_epoch(np.asarray([2, 1]), world_size=2, num_workers=2, batch_size=1, seed=0, epoch=0)
