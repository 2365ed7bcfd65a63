"""Broken shards and samples while streaming: ShardErrors that name the shard, and skip mode, which never yields
an incomplete sample and keeps every rank's batch count under DDP; pickle members are never unpickled.

Hostile and inconsistent data (issue 12, items 5, 7 and 11): the manifest fixes the image size, never the first
sample; a decompression bomb is refused from its header; shard names and member names from the data never become
paths. Each failure is a one-line ShardError (or ManifestError) naming the shard and the sample, skip mode drops
exactly the bad sample, and nothing half-read reaches a batch."""

from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm
from PIL import Image
from streamtools import COUNTS, keys_of, two_ranks

from wsishard.errors import ManifestError, ShardError
from wsishard.streaming.loader import loader
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


# ---- hostile and inconsistent data ---------------------------------------------------------------------------

PX = 32  # the outputs' patch size


def _epoch(root: str, **kw: object) -> list[dict]:
    return list(stream(root, batch_size=4, resampled=False, drop_last=False, shuffle=0, seed=0, **kw))


def _check_batches(batches: list[dict], out: sm.Output, expected_keys: list[str]) -> None:
    """Every sample of ``batches`` is complete and intact, of the manifest's size, and they are ``expected_keys``."""
    assert sorted(keys_of(batches)) == sorted(expected_keys)
    for b in batches:
        assert b["image"].shape == (len(b["key"]), PX, PX, 3)
        for key, image, label in zip(b["key"], b["image"], b["label"], strict=True):
            assert np.array_equal(image.numpy(), out.images[key]) and int(label) == out.labels[key]


def _jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose SOF header declares ``width`` x ``height`` px (a decompression bomb, cheaply)."""
    data = bytearray(sm.encode(np.full((16, 16, 3), 128, dtype=np.uint8)))
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC1, 0xC2):  # walk the marker segments to the frame header
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    data[pos + 5 : pos + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _png_declaring(width: int, height: int) -> bytes:
    """A small PNG whose IHDR declares ``width`` x ``height`` px (CRC fixed up)."""
    data = bytearray(sm.encode(np.zeros((16, 16, 3), dtype=np.uint8), "png"))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


# ---- item 5: the manifest, not the first sample, fixes the image size ---------------------------------------


def test_a_larger_first_sample_is_the_one_blamed_and_the_only_one_skipped(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), (8, 8), size_px=PX)
    first = out.keys[out.manifest.shards[0].name][0]
    sm.rewrite_member(out, 0, first, "jpg", lambda _: sm.encode(np.zeros((2 * PX, 2 * PX, 3), dtype=np.uint8)))
    with pytest.raises(ShardError) as info:
        _epoch(out.root)
    assert info.value.shard.endswith(out.manifest.shards[0].name)
    assert first in info.value.reason and f"{2 * PX}x{2 * PX}" in info.value.reason
    assert "\n" not in str(info.value)
    batches = _epoch(out.root, on_error="skip")
    _check_batches(batches, out, [k for k in out.shard_of if k != first])
    assert [len(b["key"]) for b in batches] == [4, 4, 4, 3]


def test_a_smaller_sample_in_a_worker_is_a_shard_error_naming_it(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), (6, 6), size_px=PX)
    odd = out.keys[out.manifest.shards[1].name][3]
    sm.rewrite_member(out, 1, odd, "jpg", lambda _: sm.encode(np.zeros((PX // 2, PX, 3), dtype=np.uint8)))
    ds = stream(out.root, batch_size=4, resampled=False, drop_last=False, shuffle=0, seed=0)
    with pytest.raises(ShardError) as info:
        list(loader(ds, num_workers=2))
    assert odd in info.value.reason and info.value.shard.endswith(out.manifest.shards[1].name)


def test_sources_with_different_patch_sizes_are_refused_at_stream_time(tmp_path: Path) -> None:
    a = sm.make_output(str(tmp_path / "a"), (4,), size_px=PX)
    b = sm.make_output(str(tmp_path / "b"), (4,), size_px=PX * 2, slide_prefix="other")
    with pytest.raises(ManifestError, match="patch") as info:
        stream([a.root, b.root], batch_size=2)
    assert str(PX) in str(info.value) and str(2 * PX) in str(info.value)
    assert len(keys_of(stream([a.root, a.root], batch_size=2, resampled=False))) == 8  # same size: fine


def test_a_manifest_without_a_patch_size_is_refused_at_stream_time(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), (4,), size_px=PX)
    data = json.loads(Path(out.root, "manifest.json").read_text())
    del data["options"]["patch"]
    Path(out.root, "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="patch_size_px"):
        stream(out.root, batch_size=2)


# ---- item 7: decompression bombs are refused from their header --------------------------------------------


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_a_decompression_bomb_is_a_shard_error_and_skip_mode_skips_it(tmp_path: Path, ext: str) -> None:
    out = sm.make_output(str(tmp_path / "o"), (5, 5), size_px=PX, image_format=ext)
    bomb_key = out.keys[out.manifest.shards[1].name][2]
    bomb = _jpeg_declaring(30000, 30000) if ext == "jpg" else _png_declaring(30000, 30000)
    with pytest.raises(Image.DecompressionBombError):  # what PIL alone does with it
        Image.open(io.BytesIO(bomb))
    sm.rewrite_member(out, 1, bomb_key, ext, lambda _: bomb)
    with pytest.raises(ShardError) as info:
        _epoch(out.root)
    assert info.value.shard.endswith(out.manifest.shards[1].name)
    assert bomb_key in info.value.reason and "30000x30000" in info.value.reason
    _check_batches(_epoch(out.root, on_error="skip"), out, [k for k in out.shard_of if k != bomb_key])


# ---- item 11: names from the data never become paths ----------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "../../x.tar",
        "/etc/x.tar",
        "s3://other/x.tar",
        "sub/shard-000001.tar",
        "https://user:hunter22secret@host/shard-000001.tar",
    ],
)
def test_a_shard_name_that_is_a_path_is_refused_at_stream_time(tmp_path: Path, name: str) -> None:
    out = sm.make_output(str(tmp_path / "o"), (4, 4), size_px=PX)
    data = json.loads(Path(out.root, "manifest.json").read_text())
    data["shards"][1]["name"] = name
    Path(out.root, "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError) as info:
        stream(out.root, batch_size=2)
    assert "shard" in info.value.reason and "\n" not in str(info.value)
    assert "hunter22secret" not in str(info.value)
    if "hunter22" not in name:
        assert repr(name) in info.value.reason


@pytest.mark.parametrize(
    "key",
    [
        "../../evil",
        "sub/slide0_x0_y0",
        "slide0_x0_y0/../../evil",
        "/abs/slide0_x0_y0",
        "evil",
        "slide0_x0",
        "slide0_x1_y2_z3",
        "_slide0_x0_y0",
    ],
)
def test_a_member_name_outside_the_key_grammar_is_a_broken_sample(tmp_path: Path, key: str) -> None:
    out = sm.make_output(str(tmp_path / "o"), (5, 5), size_px=PX)
    donor = out.keys[out.manifest.shards[0].name][1]

    def insert(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        copies = [(f"{key}.{name.split('.', 1)[1]}", data) for name, data in members if name.startswith(donor + ".")]
        return members[:6] + copies + members[6:]  # after the second sample

    sm.rewrite_shard(out, 0, insert)
    assert out.manifest.shards[0].samples == 6  # the manifest counts it: only its name is wrong
    with pytest.raises(ShardError) as info:
        _epoch(out.root)
    assert info.value.shard.endswith(out.manifest.shards[0].name) and repr(key) in info.value.reason
    _check_batches(_epoch(out.root, on_error="skip"), out, list(out.shard_of))


# ---- issue 28, item 10: a label that does not fit a batch's int64 labels ----------------------------------


@pytest.mark.parametrize(
    ("ext", "value"),
    [("cls", b"18446744073709551616"), ("cls", b"-9223372036854775809"), ("json", 2**70), ("json", -1e23)],
)
def test_a_label_outside_int64_is_a_shard_error_naming_the_sample(tmp_path: Path, ext: str, value: object) -> None:
    out = sm.make_output(str(tmp_path / "o"), (5, 5), size_px=PX, labelled=ext == "cls")
    bad = out.keys[out.manifest.shards[1].name][3]
    if ext == "cls":
        sm.rewrite_member(out, 1, bad, "cls", lambda _: value)  # type: ignore[arg-type,return-value]
    else:
        sm.rewrite_member(out, 1, bad, "json", lambda data: json.dumps({**json.loads(data), "label": value}).encode())
    with pytest.raises(ShardError) as info:
        _epoch(out.root)
    assert info.value.shard.endswith(out.manifest.shards[1].name)
    assert bad in info.value.reason and "outside int64" in info.value.reason and "\n" not in str(info.value)
    _check_batches(_epoch(out.root, on_error="skip"), out, [k for k in out.shard_of if k != bad])


def test_resampled_skip_goes_past_a_broken_shard(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review of the merged planner: a resampled reader gave up at its first broken shard ("all 1 shards of this
    worker failed") under on_error="skip", however many good shards it had."""
    bad = sm.make_output(str(tmp_path / "o"), (6, 6, 6))
    _break("truncated", bad, 1)
    ds = stream(bad.root, batch_size=2, resampled=True, shuffle=0, seed=0, on_error="skip")
    batches = list(itertools.islice(iter(ds), 30))  # 60 samples: passes over the 12 good ones and more
    assert len(batches) == 30 and "skipping" in caplog.text
    assert {bad.shard_of[k] for k in keys_of(batches)} >= {bad.manifest.shards[0].name, bad.manifest.shards[2].name}
