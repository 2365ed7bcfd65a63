"""Broken shards and samples while streaming: ShardErrors that name the shard, and skip mode, which never yields
an incomplete sample and keeps every rank's batch count under DDP; pickle members are never unpickled."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm
from streamtools import COUNTS, keys_of, two_ranks

from wsishard.errors import ShardError
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World


class _Boom:
    """Unpickling this writes a marker file: it must never happen."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


def test_pickle_members_are_never_unpickled(tmp_path: Path) -> None:
    marker = str(tmp_path / "unpickled")
    evil = pickle.dumps(_Boom(marker))
    bad = sm.make_output(str(tmp_path / "o"), (4, 4), extra_members={"pyd": evil, "pth": evil, "pickle": evil})
    keys = keys_of(list(stream(bad.root, batch_size=2, resampled=False, seed=0)))
    assert sorted(keys) == sorted(bad.shard_of)
    assert not os.path.exists(marker)


def _break(kind: str, out: sm.Output, index: int) -> None:
    if kind == "truncated":
        sm.truncate(out.path(index), 0.5)
    elif kind == "zeroed":
        sm.zero_bytes(out.path(index), sample_index=3)
    elif kind == "short":
        sm.set_count(out, index, out.manifest.shards[index].samples + 2)
    elif kind == "corrupt-jpeg":  # same tar, one image's bytes cut short
        keys = out.keys[out.manifest.shards[index].name]
        sm.rewrite_member(out, index, keys[2], "jpg", lambda data: data[: len(data) // 3])


@pytest.mark.parametrize("kind", ["truncated", "zeroed", "short", "corrupt-jpeg"])
def test_broken_shard_raises_shard_error_naming_it(tmp_path: Path, kind: str) -> None:
    bad = sm.make_output(str(tmp_path / "o"), (6, 6, 6))
    _break(kind, bad, 1)
    ds = stream(bad.root, batch_size=2, resampled=False, shuffle=0, seed=0)
    with pytest.raises(ShardError) as info:
        list(ds)
    assert info.value.shard.endswith(bad.manifest.shards[1].name)
    if kind in ("zeroed", "short"):
        assert "the manifest says" in info.value.reason


@pytest.mark.parametrize("kind", ["truncated", "zeroed", "short", "corrupt-jpeg"])
def test_skip_never_yields_an_incomplete_sample(tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    bad = sm.make_output(str(tmp_path / "o"), (6, 6, 6))
    _break(kind, bad, 1)
    ds = stream(bad.root, batch_size=1, resampled=False, drop_last=False, shuffle=0, seed=0, on_error="skip")
    batches = list(ds)
    keys = keys_of(batches)
    assert len(keys) == len(set(keys))
    good = [k for k in keys if bad.shard_of[k] != bad.manifest.shards[1].name]
    assert len(good) == 12  # the intact shards in full
    for b in batches:  # every yielded sample is complete: image, label and metadata
        assert b["image"].shape == (1, 16, 16, 3) and b["label"].item() == bad.labels[b["key"][0]]
        assert b["meta"][0]["slide_id"] == b["key"][0].split("_x")[0]
    assert "skipping" in caplog.text


def test_a_sample_of_another_size_raises_or_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = sm.make_output(str(tmp_path / "o"), (6, 6))
    odd = bad.keys[bad.manifest.shards[1].name][2]
    sm.rewrite_member(bad, 1, odd, "jpg", lambda _: sm.encode(np.zeros((16, 20, 3), dtype=np.uint8)))
    with pytest.raises(ShardError, match=f"sample {odd} is 20x16 px, not 16x16 px"):
        list(stream(bad.root, batch_size=4, resampled=False, drop_last=False, shuffle=0, seed=0))
    ds = stream(bad.root, batch_size=4, resampled=False, drop_last=False, shuffle=0, seed=0, on_error="skip")
    batches = list(ds)
    assert sorted(keys_of(batches)) == sorted(k for k in bad.shard_of if k != odd)
    assert [len(b["key"]) for b in batches] == [4, 4, 3]  # the slot of the skipped sample is reused
    for b in batches:
        assert b["image"].shape == (len(b["key"]), 16, 16, 3)
        for key, image in zip(b["key"], b["image"], strict=True):
            assert np.array_equal(image.numpy(), bad.images[key])
    assert "skipping" in caplog.text


def test_epoch_skip_under_ddp_yields_the_planned_batches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = sm.make_output(str(tmp_path / "o"), COUNTS)
    sm.truncate(bad.path(5), 0.3)
    ds = two_ranks(bad.root, batch_size=4, resampled=False, on_error="skip", seed=2)
    plan = ds.plan(0, num_workers=1)
    broken = next(r for r in range(2) if 5 in plan.shards_of(World(rank=r, world_size=2)))
    for rank in range(2):
        batches = list(ds.pipeline(World(rank=rank, world_size=2), 0))
        assert len(batches) == plan.batches_per_rank  # the rank that lost a shard tops up from its own
        assert all(len(b["key"]) == 4 for b in batches)
        keys = keys_of(batches)
        assert (len(set(keys)) < len(keys)) == (rank == broken)  # only the top-up repeats samples
    assert "re-reading" in caplog.text
