"""Epoch-mode streaming in one process: sources, every sample once with its pixels, label and metadata, simulated
ranks and workers with equal batch counts, and epoch counting."""

from __future__ import annotations

import collections
import itertools
import os
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm
import torch
from streamtools import COUNTS, keys_of, two_ranks

from wsishard.errors import ManifestError
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World


def test_missing_manifest_is_a_manifest_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError):
        stream(str(tmp_path), batch_size=2)


def test_folder_manifest_path_and_several_sources(stream_out: sm.Output, tmp_path: Path) -> None:
    other = sm.make_output(str(tmp_path / "b"), (4, 4), slide_prefix="other", seed=1)
    for source in (stream_out.root, os.path.join(stream_out.root, "manifest.json"), Path(stream_out.root)):
        assert len(stream(source, batch_size=2).shards) == len(COUNTS)
    ds = stream([stream_out.root, other.root], batch_size=3, resampled=False, drop_last=False, seed=0)
    assert sorted(keys_of(list(ds))) == sorted([*stream_out.shard_of, *other.shard_of])


def test_epoch_single_process_sees_every_sample_once_with_its_label_and_meta(stream_out: sm.Output) -> None:
    ds = stream(stream_out.root, batch_size=4, resampled=False, drop_last=False, shuffle=20, seed=0)
    batches = list(ds)
    keys = keys_of(batches)
    assert sorted(keys) == sorted(stream_out.shard_of) and len(keys) == sum(COUNTS)
    for b in batches:
        assert b["image"].dtype == torch.uint8 and b["image"].shape[1:] == (16, 16, 3)
        assert b["label"].tolist() == [stream_out.labels[k] for k in b["key"]]
        assert [m["slide_id"] for m in b["meta"]] == [k.split("_x")[0] for k in b["key"]]


def test_png_decodes_to_the_exact_pixels_and_unlabelled_is_minus_one(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (5, 3), image_format="png", labelled=False)
    batch = next(iter(stream(png.root, batch_size=8, resampled=False, shuffle=0, seed=0)))
    for key, image in zip(batch["key"], batch["image"], strict=True):
        assert np.array_equal(image.numpy(), png.images[key])
    assert batch["label"].tolist() == [-1] * 8


def test_simulated_ranks_and_workers_are_disjoint_with_equal_batches(stream_out: sm.Output) -> None:
    ds = two_ranks(stream_out.root, batch_size=3, resampled=False, shuffle=8, seed=4)
    for epoch in range(3):
        plan = ds.plan(epoch, num_workers=2)
        per_rank, seen = collections.Counter(), []
        for r, w in itertools.product(range(2), range(2)):
            batches = list(ds.pipeline(World(rank=r, world_size=2, worker=w, num_workers=2), epoch))
            assert len(batches) == plan.budgets[r, w]
            assert all(len(b["key"]) == 3 for b in batches)  # drop_last: fixed shape
            shards = {stream_out.shard_of[k] for k in keys_of(batches)}
            assert shards <= {
                os.path.basename(ds.shards[i].url)
                for i in plan.shards_of(World(rank=r, world_size=2, worker=w, num_workers=2))
            }
            per_rank[r] += len(batches)
            seen += keys_of(batches)
        assert per_rank[0] == per_rank[1] == plan.batches_per_rank
        assert len(seen) == len(set(seen)) == 2 * plan.batches_per_rank * 3


def test_each_iteration_is_a_new_epoch_and_set_epoch_replays(stream_out: sm.Output) -> None:
    ds = stream(stream_out.root, batch_size=4, resampled=False, shuffle=0, seed=1)
    first, second = keys_of(list(ds)), keys_of(list(ds))
    assert first != second
    ds.set_epoch(0)
    assert keys_of(list(ds)) == first
    assert keys_of(list(ds)) == second  # counting goes on from the epoch that was set


def test_a_dataloader_of_the_users_own_gives_an_exact_padded_epoch(stream_out: sm.Output) -> None:
    """torch's own DataLoader over the stream (no wsishard loader): each worker its share, every sample once, plain
    batches (no key of the loader's)."""
    from torch.utils.data import DataLoader

    ds = stream(stream_out.root, batch_size=4, resampled=False, pad_last=True, shuffle=8, seed=2)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda b: b))
    valid = [k for b in batches for k, v in zip(b["key"], b["valid"].tolist(), strict=True) if v]
    assert sorted(valid) == sorted(stream_out.shard_of)
    assert len(batches) == ds.batches_per_rank(2) and all(set(b) <= BATCH_KEYS for b in batches)


def test_ranks_with_different_worker_counts_plan_one_epoch(stream_out: sm.Output) -> None:
    """Rank 0 with 1 worker, rank 1 with 3 (as loader() gathers them under torch.distributed): both ranks plan the
    same epoch, so they yield the same batches and no sample twice (each assuming its own count on every rank, rank 0
    planned 12 batches and rank 1 11)."""
    ds = two_ranks(stream_out.root, batch_size=3, resampled=False, shuffle=8, seed=4)
    ds.workers_by_rank = (1, 3)
    worlds = [World(rank=0, world_size=2)] + [World(rank=1, world_size=2, worker=w, num_workers=3) for w in range(3)]
    per_rank, keys = collections.Counter(), []
    for world in worlds:
        batches = list(ds.pipeline(world, 0))
        per_rank[world.rank] += len(batches)
        keys += keys_of(batches)
    assert per_rank[0] == per_rank[1] == ds.batches_per_rank(1) == 12
    assert len(keys) == len(set(keys)) == 2 * 12 * 3


BATCH_KEYS = {"image", "label", "meta", "key", "valid", "context"}
