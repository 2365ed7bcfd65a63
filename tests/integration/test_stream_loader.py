"""Streaming through DataLoader workers: exact pixels, epochs covered and reshuffled, errors from workers, fewer
shards than readers split by sample, too few samples caught in the main process, pickling, the monitored loader."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm
from streamtools import keys_of, two_ranks

from wsishard.errors import ShardError, TopologyError
from wsishard.streaming.loader import loader
from wsishard.streaming.monitor import MonitoredLoader
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World


def test_worker_batches_carry_the_exact_pixels(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (5, 3, 4, 6), image_format="png")
    dl = loader(stream(png.root, batch_size=3, resampled=False, seed=0, shuffle=4), num_workers=2)
    seen = 0
    for batch in dl:
        for key, image, label in zip(batch["key"], batch["image"], batch["label"].tolist(), strict=True):
            assert np.array_equal(image.numpy(), png.images[key]) and label == png.labels[key]
            seen += 1
    assert seen == 3 * dl.dataset.batches_per_rank(num_workers=2)


def test_a_one_shard_build_streams_through_any_number_of_workers_without_sharing_a_sample(tmp_path: Path) -> None:
    one = sm.make_output(str(tmp_path / "one"), (30,))
    dl = loader(stream(one.root, batch_size=2, resampled=True, seed=0, shuffle=4), num_workers=4)
    batches = list(itertools.islice(dl, 40))
    by_worker = [set(keys_of(batches[w::4])) for w in range(4)]  # the DataLoader takes workers' batches in turn
    assert set().union(*by_worker) == set(one.shard_of)  # every sample reached, in 10 passes
    assert all(a.isdisjoint(b) for a, b in itertools.combinations(by_worker, 2))  # each reader its own slice


def test_a_one_shard_epoch_over_two_ranks_and_two_workers_is_exact(tmp_path: Path) -> None:
    one = sm.make_output(str(tmp_path / "one"), (31,))
    runs = []
    for rank in range(2):
        ds = stream(one.root, batch_size=3, resampled=False, seed=1, shuffle=4, world=World(rank=rank, world_size=2))
        runs.append(list(loader(ds, num_workers=2)))
        assert len(runs[-1]) == ds.batches_per_rank(2) > 0
    assert len(runs[0]) == len(runs[1])  # equal batches on every rank: DDP never waits for a rank that ran out
    keys = keys_of(runs[0]) + keys_of(runs[1])
    assert len(keys) == len(set(keys)) and set(keys) <= set(one.shard_of)  # no sample twice
    assert 31 - len(keys) < 2 * 2 * 3  # at most each reader's last incomplete batch dropped


def test_too_few_samples_for_the_readers_raise_in_the_main_process(tmp_path: Path) -> None:
    tiny = sm.make_output(str(tmp_path / "o"), (2, 1))
    with pytest.raises(TopologyError, match=r"3 sample\(s\) in 2 shard\(s\) cannot give each of 1 rank\(s\) x 4"):
        loader(stream(tiny.root, batch_size=2), num_workers=4)
    with pytest.raises(TopologyError, match="give no batch of 2 per rank"):
        loader(two_ranks(tiny.root, batch_size=2, resampled=False), num_workers=1)
    with pytest.raises(ValueError, match="batch_size"):
        loader(stream(tiny.root, batch_size=2), num_workers=1, batch_size=4)


@pytest.mark.parametrize("persistent", [False, True])
def test_loader_workers_cover_the_epoch_and_reshuffle_each_epoch(stream_out: sm.Output, persistent: bool) -> None:
    ds = stream(stream_out.root, batch_size=3, resampled=False, seed=0, shuffle=10)
    dl = loader(ds, num_workers=2, persistent_workers=persistent)
    epochs = [keys_of(list(dl)) for _ in range(2)]
    for epoch, keys in enumerate(epochs):
        assert len(keys) == len(set(keys)) == 3 * ds.batches_per_rank(num_workers=2, epoch=epoch)
    assert epochs[0] != epochs[1]
    if not persistent:
        ds.set_epoch(0)
        assert keys_of(list(dl)) == epochs[0]


def test_worker_errors_come_back_as_shard_errors(tmp_path: Path) -> None:
    bad = sm.make_output(str(tmp_path / "o"), (6, 6, 6, 6))
    sm.truncate(bad.path(2), 0.5)
    dl = loader(stream(bad.root, batch_size=2, resampled=False, seed=0), num_workers=2)
    with pytest.raises(ShardError) as info:
        list(dl)
    assert info.value.shard.endswith(bad.manifest.shards[2].name)


def test_stream_and_stages_pickle(stream_out: sm.Output) -> None:
    ds = stream(stream_out.root, batch_size=2, seed=0)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.base_seed == ds.base_seed
    pickle.dumps(ds.pipeline(World(), 0).pipeline)


def test_monitored_loader_reports_throughput_and_wait(stream_out: sm.Output) -> None:
    reports: list[dict] = []
    ds = stream(stream_out.root, batch_size=2, seed=0)
    mon = MonitoredLoader(itertools.islice(ds, 9), every=4, rank=0, on_report=reports.append)
    assert sum(1 for _ in mon) == 9
    assert [r["steps"] for r in reports] == [4, 4]  # the first batch is start-up, not a window step
    for r in reports:
        assert r["samples_per_s"] == pytest.approx(2 * r["batches_per_s"])
        assert 0.0 <= r["data_wait_fraction"] <= 1.0
    assert mon.summary()["steps"] == 8
    with pytest.raises(ValueError, match="0"):
        MonitoredLoader([], every=0)
