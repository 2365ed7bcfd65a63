"""Context patches in the stream (issue 30, stream side): ``batch["context"]`` byte for byte through the loader (0
and 2 workers, both ways a worker's buffer reaches the main process), resume, epoch and resampled modes, select=,
S3, broken context members refused, builds without context, mixed builds refused, GpuCollate's context transformed
as its image."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import contextmaker as cm
import numpy as np
import pytest
import shardmaker as sm
import torch

from wsishard.augment.stain import StainOptions
from wsishard.errors import ManifestError, ShardError
from wsishard.shards.summary import index_build
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.loader import loader
from wsishard.streaming.sources import stream

pytest_plugins = ("servers",)
COUNTS = (7, 5, 9, 6)


@pytest.fixture(scope="module")
def ctx_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[sm.Output, dict[str, np.ndarray]]:
    """Four shards of 16 px jpg patches with two context scales of 24 px each (read-only)."""
    out = sm.make_output(str(tmp_path_factory.mktemp("ctx") / "out"), COUNTS)
    return out, cm.add_context(out, (2.0, 8.0), 24)


def _check(batches: Any, out: sm.Output, context: dict[str, np.ndarray]) -> list[str]:
    """Every batch's context equals its samples' decoded members (checked before the next batch is taken); the keys."""
    keys = []
    for batch in batches:
        assert batch["context"].dtype == torch.uint8 and batch["context"].shape == (len(batch["key"]), 2, 24, 24, 3)
        for i, key in enumerate(batch["key"]):
            assert np.array_equal(batch["context"][i].numpy(), context[key]), key
            assert np.array_equal(batch["image"][i].numpy(), out.images[key]), key
        keys += batch["key"]
    return keys


@pytest.mark.parametrize(("workers", "pin"), [(0, False), (2, False), (2, True)])
def test_the_batch_context_is_the_decoded_members_in_sample_order(
    ctx_out: tuple[sm.Output, dict[str, np.ndarray]], workers: int, pin: bool
) -> None:
    out, context = ctx_out
    ds = stream(out.root, batch_size=4, resampled=False, seed=3, shuffle=5, drop_last=False)
    keys = _check(loader(ds, num_workers=workers, pin_memory=pin), out, context)
    assert sorted(keys) == sorted(context)  # the whole epoch, every sample once


def test_iterating_the_stream_without_a_loader_and_resampled_mode_carry_the_context(
    ctx_out: tuple[sm.Output, dict[str, np.ndarray]],
) -> None:
    out, context = ctx_out
    _check(stream(out.root, batch_size=3, resampled=False, seed=0, shuffle=0), out, context)
    resampled = loader(stream(out.root, batch_size=5, resampled=True, seed=1), num_workers=2)
    assert len(_check(itertools.islice(resampled, 8), out, context)) == 40


def test_a_resumed_loader_gives_the_same_context(ctx_out: tuple[sm.Output, dict[str, np.ndarray]]) -> None:
    out, _ = ctx_out

    def make() -> Any:
        return loader(stream(out.root, batch_size=3, resampled=False, seed=5, shuffle=4), num_workers=2)

    whole = [(b["key"], b["context"].clone()) for b in make()]
    first = make()
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [(b["key"], b["context"].clone()) for b in resumed]
    assert len(rest) == len(whole) - 3 > 0
    for (keys, ctx), (want_keys, want) in zip(rest, whole[3:], strict=True):
        assert keys == want_keys and torch.equal(ctx, want)


def test_an_epoch_resumed_on_another_topology_gives_the_rest_with_its_context(
    ctx_out: tuple[sm.Output, dict[str, np.ndarray]],
) -> None:
    out, context = ctx_out
    first = loader(stream(out.root, batch_size=3, resampled=False, seed=5, shuffle=4), num_workers=2)
    it = iter(first)
    seen = [k for _ in range(3) for k in next(it)["key"]]
    state = first.state_dict()
    resumed = loader(stream(out.root, batch_size=3, resampled=False, seed=5, shuffle=4), num_workers=1)
    resumed.load_state_dict([state])  # two workers' epoch finished by one: the remainders dealt again
    rest = _check(resumed, out, context)
    assert rest and not set(rest) & set(seen)


def _index_checked(out: sm.Output, context: dict[str, np.ndarray], batches: Any) -> list[str]:
    keys = []
    for batch in batches:
        for i, key in enumerate(batch["key"]):
            assert np.array_equal(batch["context"][i].numpy(), context[key])
        keys += batch["key"]
    return keys


def test_select_weights_and_pad_last_read_the_context_of_the_samples_they_keep(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), COUNTS, slides=3)
    context = cm.add_context(out, (4.0,), 16)
    index_build(out.root)
    ds = stream(out.root, batch_size=2, resampled=False, select=lambda c: c["label"] == 1, shuffle=3)
    keys = _index_checked(out, context, loader(ds, num_workers=2))
    assert keys and all(out.labels[k] == 1 for k in keys)
    padded = stream(out.root, batch_size=4, resampled=False, pad_last=True, shuffle=3)
    assert set(_index_checked(out, context, loader(padded, num_workers=2))) == set(context)
    weighted = stream(out.root, batch_size=4, resampled=True, weights={0: 0.0, 1: 1.0, 2: 0.0}, seed=2)
    keys = _index_checked(out, context, itertools.islice(loader(weighted, num_workers=2), 6))
    assert len(keys) == 24 and all(out.labels[k] == 1 for k in keys)


def test_the_plain_webdataset_recipe_reads_the_context_members(
    ctx_out: tuple[sm.Output, dict[str, np.ndarray]],
) -> None:
    import webdataset as wds

    import wsishard

    out, context = ctx_out

    def wanted(name: str) -> bool:
        return wsishard.is_sample_member(name) or wsishard.is_context_member(name)

    ds = (
        wds.WebDataset(wsishard.shard_urls(out.root), shardshuffle=False, select_files=wanted)
        .decode("torchrgb8")
        .to_tuple("__key__", "jpg", "ctx1.jpg", "json")
    )
    seen = 0
    for key, image, ctx1, meta in ds:
        assert torch.equal(ctx1.permute(1, 2, 0), torch.from_numpy(context[key][1]))
        assert image.shape == (3, 16, 16) and meta["context"][1]["mpp"] == 8.0
        seen += 1
    assert seen == sum(COUNTS)
    assert not wsishard.is_context_member("slide0_x0_y0.ctx0.pyd") and not wsishard.is_sample_member("a.ctx0.pyd")


def test_a_context_build_streams_from_s3(
    ctx_out: tuple[sm.Output, dict[str, np.ndarray]], s3: Any, s3_bucket: str
) -> None:
    out, context = ctx_out
    url = f"s3://{s3_bucket}/out"
    s3.upload(out.root, url)
    ds = stream(url, batch_size=4, resampled=False, seed=0, storage_options=s3.storage_options, drop_last=False)
    assert sorted(_check(loader(ds, num_workers=2), out, context)) == sorted(context)


def test_a_build_without_context_or_context_false_gives_no_context(
    ctx_out: tuple[sm.Output, dict[str, np.ndarray]], stream_out: sm.Output
) -> None:
    plain = next(iter(loader(stream(stream_out.root, batch_size=4, seed=0), num_workers=0)))
    assert "context" not in plain
    skipped = next(iter(loader(stream(ctx_out[0].root, batch_size=4, seed=0, context=False), num_workers=2)))
    assert "context" not in skipped and skipped["image"].shape == (4, 16, 16, 3)


def _break(out: sm.Output, key_index: int, ext: str, change: Any) -> str:
    key = out.keys[out.manifest.shards[1].name][key_index]
    sm.rewrite_member(out, 1, key, ext, change)
    sm.refresh_record(out, 1)
    return key


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda data: data[: len(data) // 2], "does not decode"),
        (lambda data: sm.encode(np.zeros((16, 16, 3), np.uint8)), "is 16x16 px, not 24x24 px"),
        (lambda data: b"no image at all", "does not decode"),
    ],
)
def test_a_broken_context_member_is_refused_naming_the_shard(tmp_path: Path, change: Any, reason: str) -> None:
    out = sm.make_output(str(tmp_path / "o"), COUNTS)
    cm.add_context(out, (2.0,), 24)
    key = _break(out, 2, "ctx0.jpg", change)
    with pytest.raises(ShardError, match=reason) as err:
        list(loader(stream(out.root, batch_size=2, resampled=False, shuffle=0), num_workers=2))
    assert err.value.shard.endswith(out.manifest.shards[1].name) and key in err.value.reason
    skipping = stream(out.root, batch_size=2, resampled=False, shuffle=0, on_error="skip", drop_last=False)
    kept = [k for b in loader(skipping, num_workers=0) for k in b["key"]]
    assert key not in kept and len(kept) == sum(COUNTS) - 1  # only the broken sample left out
    unread = stream(out.root, batch_size=2, resampled=False, shuffle=0, drop_last=False, context=False)
    assert sum(len(b["key"]) for b in unread) == sum(COUNTS)  # context=False never reads the broken member


def test_a_missing_context_member_is_refused(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), COUNTS)
    cm.add_context(out, (2.0,), 24)
    key = out.keys[out.manifest.shards[2].name][1]
    sm.rewrite_shard(out, 2, lambda members: [(n, d) for n, d in members if n != f"{key}.ctx0.jpg"])
    with pytest.raises(ShardError, match=f"sample {key} lacks its context member ctx0.jpg"):
        list(stream(out.root, batch_size=2, resampled=False, shuffle=0))


def test_mixed_context_builds_are_refused_naming_both(tmp_path: Path) -> None:
    one = sm.make_output(str(tmp_path / "one"), (4, 4))
    cm.add_context(one, (2.0,), 16)
    two = sm.make_output(str(tmp_path / "two"), (4, 4), seed=1, slide_prefix="b")
    cm.add_context(two, (2.0, 8.0), 16)
    none = sm.make_output(str(tmp_path / "none"), (4, 4), seed=2, slide_prefix="c")
    bigger = sm.make_output(str(tmp_path / "bigger"), (4, 4), seed=3, slide_prefix="d")
    cm.add_context(bigger, (2.0,), 32)
    for other, says in ((two, r"\[2.0, 8.0\] at 16 px"), (none, "no context"), (bigger, r"\[2.0\] at 32 px")):
        with pytest.raises(ManifestError, match="different context") as err:
            stream([one.root, other.root], batch_size=2)
        assert one.root in str(err.value) and other.root in str(err.value)
        assert "[2.0] at 16 px" in str(err.value) and err.match(says)
        mixed = stream([one.root, other.root], batch_size=2, context=False, resampled=False)
        assert "context" not in next(iter(mixed))


def test_decode_on_the_device_refuses_a_stream_with_context(ctx_out: tuple[sm.Output, dict[str, np.ndarray]]) -> None:
    with pytest.raises(ValueError, match="decode='device' decodes the main patches only"):
        loader(stream(ctx_out[0].root, batch_size=2), num_workers=0, decode="device")


@pytest.mark.parametrize(
    "options",
    [{}, {"channels_last": True, "dtype": torch.bfloat16}, {"stain": StainOptions(hed_scale=0.05, brightness=0.2)}],
)
def test_gpu_collate_transforms_the_context_as_its_image(tmp_path: Path, options: dict[str, Any]) -> None:
    out = sm.make_output(str(tmp_path / "o"), (8, 8), size_px=16, image_format="png")
    cm.add_context(out, (2.0, 4.0), 16, member=lambda key, k, image: image)  # each scale a copy of the image
    ds = stream(out.root, batch_size=8, resampled=False, seed=0, shuffle=0)
    collate = GpuCollate("cpu", mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4), augment=True, seed=7, **options)
    plain = GpuCollate("cpu", mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4), seed=7, **options)
    moved = 0
    for batch in loader(ds, num_workers=0):
        got = collate(batch)
        assert got["context"].shape == (8, 2, 3, 16, 16) and got["context"].dtype == got["image"].dtype
        for k in range(2):
            assert torch.equal(got["context"][:, k], got["image"])
        plain.batches = collate.batches - 1
        moved += int(not torch.equal(plain(batch)["image"], got["image"]))
    assert moved == 2  # the augmentation did move the patches: the agreement above is no identity's


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"context_mpp": 2.0}, "context_mpp is 2.0, not a list"),
        ({"context_mpp": [2.0, -1]}, "not a list of at most 64 mpp values > 0"),
        ({"context_mpp": [True]}, "not a list"),
        ({"context_mpp": [2.0] * 65}, "at most 64"),
        ({"context_mpp": [2.0], "context_size": "big"}, "context_size is 'big'"),
        ({"context_mpp": [2.0], "context_size": 0}, "context_size is 0"),
    ],
)
def test_a_manifest_with_a_bad_context_record_is_refused(tmp_path: Path, options: dict[str, Any], says: str) -> None:
    out = sm.make_output(str(tmp_path / "o"), (4,))
    cm.set_options(out, **options)
    with pytest.raises(ManifestError, match=says):
        stream(out.root, batch_size=2)
    assert "context" not in next(iter(stream(out.root, batch_size=2, context=False)))


def test_context_size_defaults_to_the_patch_size(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), (4, 4))
    context = cm.add_context(out, (2.0,), 16)
    cm.set_options(out, context_size=None)  # a build that records no size: its context patches are patch-sized
    batch = next(iter(stream(out.root, batch_size=4, resampled=False, shuffle=0)))
    assert batch["context"].shape == (4, 1, 16, 16, 3)
    assert all(np.array_equal(batch["context"][i, 0].numpy(), context[k][0]) for i, k in enumerate(batch["key"]))
