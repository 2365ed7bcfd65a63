"""The streaming pipeline in one process (simulated ranks and workers) and through DataLoader workers."""

from __future__ import annotations

import collections
import io
import itertools
import os
import pickle
import tarfile
from pathlib import Path

import fsspec
import numpy as np
import pytest
import shardmaker as sm
import torch
import webdataset as wds
from PIL import Image

from wsishard.errors import ManifestError, ShardError, TopologyError
from wsishard.shards.reader import tar_members
from wsishard.storage.opener import StreamOpener
from wsishard.streaming.dataset import ShardStream, StreamConfig, loader, stream
from wsishard.streaming.decode import DecodeIntoBatches, decode_into, decode_sample
from wsishard.streaming.monitor import MonitoredLoader
from wsishard.streaming.plain import register_gopen_schemes
from wsishard.streaming.stages import RawSample, ShardRef, SplitByNode, SplitByWorker, read_shard
from wsishard.streaming.world import World, detect_world

COUNTS = (10, 7, 12, 5, 9, 14, 6, 11)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> sm.Output:
    return sm.make_output(str(tmp_path_factory.mktemp("out")), COUNTS)


def _keys(batches: list) -> list[str]:
    return [k for b in batches for k in b["key"]]


def _two_ranks(source: str, **kw: object) -> ShardStream:
    return stream(source, world=World(rank=0, world_size=2), **kw)  # type: ignore[arg-type]


# ---- options and sources ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "bad"), [({"batch_size": 0}, "0"), ({"batch_size": 2, "shuffle": -5}, "-5"),
                                         ({"batch_size": 2, "seed": -1}, "-1"),
                                         ({"batch_size": 2, "on_error": "ignore"}, "ignore")])  # fmt: skip
def test_config_validation_names_the_bad_value(kw: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        StreamConfig(**kw)


def test_missing_manifest_is_a_manifest_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError):
        stream(str(tmp_path), batch_size=2)


def test_folder_manifest_path_and_several_sources(out: sm.Output, tmp_path: Path) -> None:
    other = sm.make_output(str(tmp_path / "b"), (4, 4), slide_prefix="other", seed=1)
    for source in (out.root, os.path.join(out.root, "manifest.json"), Path(out.root)):
        assert len(stream(source, batch_size=2).shards) == len(COUNTS)
    ds = stream([out.root, other.root], batch_size=3, resampled=False, drop_last=False, seed=0)
    assert sorted(_keys(list(ds))) == sorted([*out.shard_of, *other.shard_of])


# ---- epoch mode -------------------------------------------------------------------------------------------


def test_epoch_single_process_sees_every_sample_once_with_its_label_and_meta(out: sm.Output) -> None:
    ds = stream(out.root, batch_size=4, resampled=False, drop_last=False, shuffle=20, seed=0)
    batches = list(ds)
    keys = _keys(batches)
    assert sorted(keys) == sorted(out.shard_of) and len(keys) == sum(COUNTS)
    for b in batches:
        assert b["image"].dtype == torch.uint8 and b["image"].shape[1:] == (16, 16, 3)
        assert b["label"].tolist() == [out.labels[k] for k in b["key"]]
        assert [m["slide_id"] for m in b["meta"]] == [k.split("_x")[0] for k in b["key"]]


def test_simulated_ranks_and_workers_are_disjoint_with_equal_batches(out: sm.Output) -> None:
    ds = _two_ranks(out.root, batch_size=3, resampled=False, shuffle=8, seed=4)
    for epoch in range(3):
        plan = ds.plan(epoch, num_workers=2)
        per_rank, seen = collections.Counter(), []
        for r, w in itertools.product(range(2), range(2)):
            batches = list(ds.pipeline(World(rank=r, world_size=2, worker=w, num_workers=2), epoch))
            assert len(batches) == plan.budgets[r, w]
            assert all(len(b["key"]) == 3 for b in batches)  # drop_last: fixed shape
            shards = {out.shard_of[k] for k in _keys(batches)}
            assert shards <= {os.path.basename(ds.shards[i].url) for i in plan.shards_of(World(
                rank=r, world_size=2, worker=w, num_workers=2))}  # fmt: skip
            per_rank[r] += len(batches)
            seen += _keys(batches)
        assert per_rank[0] == per_rank[1] == plan.batches_per_rank
        assert len(seen) == len(set(seen)) == 2 * plan.batches_per_rank * 3


def test_each_iteration_is_a_new_epoch_and_set_epoch_replays(out: sm.Output) -> None:
    ds = stream(out.root, batch_size=4, resampled=False, shuffle=0, seed=1)
    first, second = _keys(list(ds)), _keys(list(ds))
    assert first != second
    ds.set_epoch(0)
    assert _keys(list(ds)) == first
    assert _keys(list(ds)) == second  # counting goes on from the epoch that was set


def test_epoch_skip_under_ddp_yields_the_planned_batches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = sm.make_output(str(tmp_path / "o"), COUNTS)
    sm.truncate(bad.path(5), 0.3)
    ds = _two_ranks(bad.root, batch_size=4, resampled=False, on_error="skip", seed=2)
    plan = ds.plan(0, num_workers=1)
    broken = next(r for r in range(2) if 5 in plan.shards_of(World(rank=r, world_size=2)))
    for rank in range(2):
        batches = list(ds.pipeline(World(rank=rank, world_size=2), 0))
        assert len(batches) == plan.batches_per_rank  # the rank that lost a shard tops up from its own
        assert all(len(b["key"]) == 4 for b in batches)
        keys = _keys(batches)
        assert (len(set(keys)) < len(keys)) == (rank == broken)  # only the top-up repeats samples
    assert "re-reading" in caplog.text


# ---- resampled mode ---------------------------------------------------------------------------------------


def test_resampled_is_endless_and_reproducible_with_a_seed(out: sm.Output) -> None:
    take = 3 * sum(COUNTS) // 4  # three times the data
    a = _keys(list(itertools.islice(stream(out.root, batch_size=4, seed=5, shuffle=10), take)))
    b = _keys(list(itertools.islice(stream(out.root, batch_size=4, seed=5, shuffle=10), take)))
    assert a == b and len(a) == 4 * take
    c = _keys(list(itertools.islice(stream(out.root, batch_size=4, seed=6, shuffle=10), take)))
    assert a != c
    plain = _keys(list(itertools.islice(stream(out.root, batch_size=2, seed=5, shuffle=0), sum(COUNTS))))
    assert collections.Counter(plain) == collections.Counter(2 * list(out.shard_of))  # whole passes, reshuffled


def test_resampled_without_seed_differs_between_runs_but_not_in_assignment(out: sm.Output) -> None:
    ds1, ds2 = _two_ranks(out.root, batch_size=4), _two_ranks(out.root, batch_size=4)
    assert ds1.base_seed != ds2.base_seed and ds1.plan_seed == ds2.plan_seed
    world = World(rank=1, world_size=2)
    a = _keys(list(itertools.islice(ds1.pipeline(world, 0), 10)))
    b = _keys(list(itertools.islice(ds2.pipeline(world, 0), 10)))
    assert a != b
    assert {out.shard_of[k] for k in a} == {out.shard_of[k] for k in b}  # same shards, other order


def test_resampled_ranks_and_workers_read_disjoint_shards(out: sm.Output) -> None:
    ds = _two_ranks(out.root, batch_size=2, seed=0)
    owners: dict[str, tuple[int, int]] = {}
    for r, w in itertools.product(range(2), range(2)):
        world = World(rank=r, world_size=2, worker=w, num_workers=2)
        for key in _keys(list(itertools.islice(ds.pipeline(world, 0), 15))):
            assert owners.setdefault(out.shard_of[key], (r, w)) == (r, w)
    assert len(set(owners.values())) == 4


def test_split_stages_match_webdataset_splitters(monkeypatch: pytest.MonkeyPatch) -> None:
    items = list(range(23))
    for rank, worker in itertools.product(range(3), range(2)):
        for name, value in (("RANK", rank), ("WORLD_SIZE", 3), ("WORKER", worker), ("NUM_WORKERS", 2)):
            monkeypatch.setenv(name, str(value))
        theirs = list(wds.split_by_worker(wds.split_by_node(iter(items))))
        ours = list(SplitByWorker(worker, 2)(SplitByNode(rank, 3)(iter(items))))
        assert ours == theirs


# ---- decoding and broken shards ---------------------------------------------------------------------------


def test_png_decodes_to_the_exact_pixels_and_unlabelled_is_minus_one(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (5, 3), image_format="png", labelled=False)
    batch = next(iter(stream(png.root, batch_size=8, resampled=False, shuffle=0, seed=0)))
    for key, image in zip(batch["key"], batch["image"], strict=True):
        assert np.array_equal(image.numpy(), png.images[key])
    assert batch["label"].tolist() == [-1] * 8


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
    keys = _keys(list(stream(bad.root, batch_size=2, resampled=False, seed=0)))
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
    keys = _keys(batches)
    assert len(keys) == len(set(keys))
    good = [k for k in keys if bad.shard_of[k] != bad.manifest.shards[1].name]
    assert len(good) == 12  # the intact shards in full
    for b in batches:  # every yielded sample is complete: image, label and metadata
        assert b["image"].shape == (1, 16, 16, 3) and b["label"].item() == bad.labels[b["key"][0]]
        assert b["meta"][0]["slide_id"] == b["key"][0].split("_x")[0]
    assert "skipping" in caplog.text


def _raw(data: bytes, ext: str = "jpg", key: str = "k") -> RawSample:
    return RawSample(key=key, shard="s.tar", image_ext=ext, image=data, meta=b'{"label": 3}', label=None)


def _encoded(image: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


_RNG_IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8))


@pytest.mark.parametrize(("fmt", "mode", "kw"), [
    ("JPEG", "RGB", {"quality": 90}), ("JPEG", "RGB", {"quality": 75, "subsampling": 0}),
    ("JPEG", "RGB", {"quality": 95, "progressive": True}), ("JPEG", "L", {}), ("JPEG", "CMYK", {}),
    ("PNG", "RGB", {}), ("PNG", "RGBA", {}), ("PNG", "P", {}), ("WEBP", "RGB", {"quality": 80}),
])  # fmt: skip
def test_decode_into_equals_pils_rgb_decode(fmt: str, mode: str, kw: dict) -> None:
    data = _encoded(_RNG_IMAGE.convert(mode), fmt, **kw)
    ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[fmt]
    reference = decode_sample(_raw(data, ext))["image"]  # PIL, converted to RGB
    assert reference.shape == (24, 40, 3)
    slot = np.full((24, 40, 3), 7, dtype=np.uint8)
    decode_into(_raw(data, ext), slot)
    assert int(np.abs(slot.astype(np.int16) - reference).max()) <= 1  # libjpeg-turbo both sides: in fact equal


def test_decode_into_rejects_another_size_and_a_truncated_jpeg() -> None:
    data = _encoded(_RNG_IMAGE, "JPEG")
    with pytest.raises(ShardError, match="earlier samples are"):
        decode_into(_raw(data), np.empty((40, 24, 3), dtype=np.uint8))
    with pytest.raises(ShardError, match="does not decode"):  # libjpeg alone would return grey-filled pixels
        decode_into(_raw(data[: len(data) // 2]), np.empty((24, 40, 3), dtype=np.uint8))
    with pytest.raises(ShardError, match="does not decode"):
        decode_into(_raw(b"not an image at all\xff\xd9"), np.empty((24, 40, 3), dtype=np.uint8))


def test_a_sample_of_another_size_raises_or_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = sm.make_output(str(tmp_path / "o"), (6, 6))
    odd = bad.keys[bad.manifest.shards[1].name][2]
    sm.rewrite_member(bad, 1, odd, "jpg", lambda _: sm.encode(np.zeros((16, 20, 3), dtype=np.uint8)))
    with pytest.raises(ShardError, match="earlier samples are"):
        list(stream(bad.root, batch_size=4, resampled=False, drop_last=False, shuffle=0, seed=0))
    ds = stream(bad.root, batch_size=4, resampled=False, drop_last=False, shuffle=0, seed=0, on_error="skip")
    batches = list(ds)
    assert sorted(_keys(batches)) == sorted(k for k in bad.shard_of if k != odd)
    assert [len(b["key"]) for b in batches] == [4, 4, 3]  # the slot of the skipped sample is reused
    for b in batches:
        assert b["image"].shape == (len(b["key"]), 16, 16, 3)
        for key, image in zip(b["key"], b["image"], strict=True):
            assert np.array_equal(image.numpy(), bad.images[key])
    assert "skipping" in caplog.text


def test_batches_are_in_shared_memory_only_in_workers(out: sm.Output, monkeypatch: pytest.MonkeyPatch) -> None:
    task = ShardRef(url=out.path(0), samples=COUNTS[0])
    stage = DecodeIntoBatches(4, drop_last=False)
    plain = list(stage(read_shard(task, StreamOpener())))
    assert not any(b["image"].is_shared() for b in plain)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # as inside a DataLoader worker
    shared = list(stage(read_shard(task, StreamOpener())))
    assert all(b["image"].is_shared() for b in shared)  # handed over as a file descriptor, not copied
    for a, b in zip(plain, shared, strict=True):
        assert torch.equal(a["image"], b["image"]) and a["key"] == b["key"]
    assert [len(b["key"]) for b in plain] == [4, 4, 2]


def test_worker_batches_carry_the_exact_pixels(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (5, 3, 4, 6), image_format="png")
    dl = loader(stream(png.root, batch_size=3, resampled=False, seed=0, shuffle=4), num_workers=2)
    seen = 0
    for batch in dl:
        for key, image, label in zip(batch["key"], batch["image"], batch["label"].tolist(), strict=True):
            assert np.array_equal(image.numpy(), png.images[key]) and label == png.labels[key]
            seen += 1
    assert seen == 3 * dl.dataset.batches_per_rank(num_workers=2)


def test_read_shard_names_a_missing_shard(tmp_path: Path) -> None:
    task = ShardRef(url=str(tmp_path / "nope.tar"), samples=1)
    with pytest.raises(ShardError, match=r"nope\.tar"):
        list(read_shard(task, StreamOpener()))


# ---- the tar reader ---------------------------------------------------------------------------------------


def _tar(tmp_path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT,
         extra: list[tarfile.TarInfo] = ()) -> Path:  # fmt: skip
    path = tmp_path / f"t{fmt}.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        for info in extra:
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


class _Trickle(io.RawIOBase):
    """A raw file that returns at most ``step`` bytes per read (as a socket might)."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._pos, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        n = self._step if size < 0 else min(size, self._step)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out


def test_tar_members_match_tarfile_on_a_shard(out: sm.Output) -> None:
    data = Path(out.path(2)).read_bytes()
    with tarfile.open(out.path(2)) as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    assert list(tar_members(io.BytesIO(data), lambda _: True)) == expected
    assert list(tar_members(_Trickle(data, 700), lambda _: True)) == expected  # short reads
    jsons = list(tar_members(io.BytesIO(data), lambda name: name.endswith(".json")))
    assert jsons == [(n, d) for n, d in expected if n.endswith(".json")]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_tar_members_read_long_names_and_skip_what_is_not_a_file(tmp_path: Path, fmt: int) -> None:
    long_key = "d" * 60 + "/" + "k" * 90 if fmt == tarfile.USTAR_FORMAT else "é" * 70 + "k" * 90  # prefix / long
    members = [(f"{long_key}.jpg", b"x" * 1000), (f"{long_key}.json", b"{}"), ("short.cls", b"1")]
    folder, link = tarfile.TarInfo("a_dir"), tarfile.TarInfo("a_link.jpg")
    folder.type, link.type, link.linkname = tarfile.DIRTYPE, tarfile.SYMTYPE, "short.cls"
    path = _tar(tmp_path, members, fmt, extra=[folder, link])
    assert list(tar_members(path.open("rb"), lambda _: True)) == members


def _shard_of(tmp_path: Path, blob: bytes, samples: int) -> ShardRef:
    path = tmp_path / "s.tar"
    path.write_bytes(blob)
    return ShardRef(url=str(path), samples=samples)


def test_tar_damage_is_a_shard_error(out: sm.Output, tmp_path: Path) -> None:
    data = bytearray(Path(out.path(0)).read_bytes())
    n = COUNTS[0]
    assert len(list(read_shard(_shard_of(tmp_path, bytes(data), n), StreamOpener()))) == n
    with tarfile.open(out.path(0)) as tar:
        offsets = [m.offset for m in tar]
    flipped = bytearray(data)
    flipped[offsets[4] + 10] ^= 0x01  # a name byte of the fifth header: its checksum no longer holds
    cases = {"checksum": bytes(flipped), "cut short": bytes(data[: offsets[4] + 300]),
             "cut short ": bytes(data[: offsets[4] + 512 + 7])}  # fmt: skip
    for reason, blob in cases.items():
        with pytest.raises(ShardError, match=reason.strip()) as info:
            list(read_shard(_shard_of(tmp_path, blob, n), StreamOpener()))
        assert info.value.shard.endswith("s.tar")
    with pytest.raises(ShardError, match="the manifest says"):  # cut at a header: reads as a shorter shard
        list(read_shard(_shard_of(tmp_path, bytes(data[: offsets[6]]), n), StreamOpener()))
    with pytest.raises(ShardError, match="checksum"):  # not a tar at all
        list(read_shard(_shard_of(tmp_path, b"\x1f\x8b" + bytes(data[2:]), n), StreamOpener()))


# ---- through DataLoader workers ---------------------------------------------------------------------------


def test_too_few_shards_raise_in_the_main_process(tmp_path: Path) -> None:
    small = sm.make_output(str(tmp_path / "o"), (4, 4, 4))
    with pytest.raises(TopologyError, match="need at least 4"):
        loader(stream(small.root, batch_size=2), num_workers=4)
    with pytest.raises(TopologyError, match="need at least 4"):
        loader(_two_ranks(small.root, batch_size=2), num_workers=2)
    with pytest.raises(ValueError, match="batch_size"):
        loader(stream(small.root, batch_size=2), num_workers=1, batch_size=4)


@pytest.mark.parametrize("persistent", [False, True])
def test_loader_workers_cover_the_epoch_and_reshuffle_each_epoch(out: sm.Output, persistent: bool) -> None:
    ds = stream(out.root, batch_size=3, resampled=False, seed=0, shuffle=10)
    dl = loader(ds, num_workers=2, persistent_workers=persistent)
    epochs = [_keys(list(dl)) for _ in range(2)]
    for epoch, keys in enumerate(epochs):
        assert len(keys) == len(set(keys)) == 3 * ds.batches_per_rank(num_workers=2, epoch=epoch)
    assert epochs[0] != epochs[1]
    if not persistent:
        ds.set_epoch(0)
        assert _keys(list(dl)) == epochs[0]


def test_worker_errors_come_back_as_shard_errors(tmp_path: Path) -> None:
    bad = sm.make_output(str(tmp_path / "o"), (6, 6, 6, 6))
    sm.truncate(bad.path(2), 0.5)
    dl = loader(stream(bad.root, batch_size=2, resampled=False, seed=0), num_workers=2)
    with pytest.raises(ShardError) as info:
        list(dl)
    assert info.value.shard.endswith(bad.manifest.shards[2].name)


def test_stream_and_stages_pickle(out: sm.Output) -> None:
    ds = stream(out.root, batch_size=2, seed=0)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.base_seed == ds.base_seed
    pickle.dumps(ds.pipeline(World(), 0).pipeline)


def test_monitored_loader_reports_throughput_and_wait(out: sm.Output) -> None:
    reports: list[dict] = []
    ds = stream(out.root, batch_size=2, seed=0)
    mon = MonitoredLoader(itertools.islice(ds, 9), every=4, rank=0, on_report=reports.append)
    assert sum(1 for _ in mon) == 9
    assert [r["steps"] for r in reports] == [4, 4]  # the first batch is start-up, not a window step
    for r in reports:
        assert r["samples_per_s"] == pytest.approx(2 * r["batches_per_s"])
        assert 0.0 <= r["data_wait_fraction"] <= 1.0
    assert mon.summary()["steps"] == 8
    with pytest.raises(ValueError, match="0"):
        MonitoredLoader([], every=0)


# ---- topology detection and URL sources -------------------------------------------------------------------


def test_detect_world_reads_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert detect_world() == World(rank=1, world_size=3)
    monkeypatch.delenv("RANK")
    assert detect_world() == World()


def test_streams_from_an_fsspec_url_and_plain_webdataset_can_too(out: sm.Output) -> None:
    fs = fsspec.filesystem("memory")
    for name in [*out.keys, "manifest.json"]:
        fs.pipe(f"/wsishard-test/{name}", Path(out.root, name).read_bytes())
    keys = _keys(list(stream("memory://wsishard-test", batch_size=4, resampled=False, drop_last=False, seed=0)))
    assert sorted(keys) == sorted(out.shard_of)
    register_gopen_schemes(["memory"])
    first = next(iter(wds.WebDataset("memory://wsishard-test/shard-000000.tar", shardshuffle=False)))
    assert first["__key__"] == out.keys["shard-000000.tar"][0]
