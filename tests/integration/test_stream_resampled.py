"""Resampled (endless) streaming in one process: seeded reproducibility, unseeded runs, disjoint readers."""

from __future__ import annotations

import collections
import itertools

import shardmaker as sm
from streamtools import COUNTS, keys_of, two_ranks

from wsishard.streaming.sources import stream
from wsishard.streaming.world import World


def test_resampled_is_endless_and_reproducible_with_a_seed(stream_out: sm.Output) -> None:
    take = 3 * sum(COUNTS) // 4  # three times the data
    a = keys_of(list(itertools.islice(stream(stream_out.root, batch_size=4, seed=5, shuffle=10), take)))
    b = keys_of(list(itertools.islice(stream(stream_out.root, batch_size=4, seed=5, shuffle=10), take)))
    assert a == b and len(a) == 4 * take
    c = keys_of(list(itertools.islice(stream(stream_out.root, batch_size=4, seed=6, shuffle=10), take)))
    assert a != c
    plain = keys_of(list(itertools.islice(stream(stream_out.root, batch_size=2, seed=5, shuffle=0), sum(COUNTS))))
    assert collections.Counter(plain) == collections.Counter(2 * list(stream_out.shard_of))  # whole passes, reshuffled


def test_resampled_without_seed_differs_between_runs_but_not_in_assignment(stream_out: sm.Output) -> None:
    ds1, ds2 = two_ranks(stream_out.root, batch_size=4), two_ranks(stream_out.root, batch_size=4)
    assert ds1.base_seed != ds2.base_seed and ds1.plan_seed == ds2.plan_seed
    world = World(rank=1, world_size=2)
    a = keys_of(list(itertools.islice(ds1.pipeline(world, 0), 10)))
    b = keys_of(list(itertools.islice(ds2.pipeline(world, 0), 10)))
    assert a != b
    assert {stream_out.shard_of[k] for k in a} == {stream_out.shard_of[k] for k in b}  # same shards, other order


def test_resampled_ranks_and_workers_read_disjoint_shards(stream_out: sm.Output) -> None:
    ds = two_ranks(stream_out.root, batch_size=2, seed=0)
    owners: dict[str, tuple[int, int]] = {}
    for r, w in itertools.product(range(2), range(2)):
        world = World(rank=r, world_size=2, worker=w, num_workers=2)
        for key in keys_of(list(itertools.islice(ds.pipeline(world, 0), 15))):
            assert owners.setdefault(stream_out.shard_of[key], (r, w)) == (r, w)
    assert len(set(owners.values())) == 4
