"""select=, weights=, proportions= and pad_last= end to end: on hand-made outputs indexed after the fact, on a real
build's own index, on moto S3; 2 ranks x 2 workers simulated in one process (tests/distributed runs torchrun)."""

from __future__ import annotations

import collections
import functools
import itertools
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shardmaker as sm

from wsishard.errors import IndexFileError, ManifestError
from wsishard.shards.index import index_name, load_index
from wsishard.shards.reader import TarSamples
from wsishard.shards.summary import SUMMARY_NAME, Summary, index_build
from wsishard.streaming.dataset import ShardStream
from wsishard.streaming.loader import loader
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World

pytest_plugins = ("servers",)
COUNTS = (60, 45, 70, 50, 55, 40, 65, 35)  # 420 samples
LABELS = (0, 0, 0, 0, 1)  # five slides, samples dealt to them in turn: labels 80/20
TWO = [World(rank=r, world_size=2, worker=w, num_workers=2) for r in range(2) for w in range(2)]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> sm.Output:
    made = sm.make_output(str(tmp_path_factory.mktemp("sampling") / "out"), COUNTS, slides=5, slide_labels=LABELS)
    index_build(made.root)
    return made


def _keys(batches: Any) -> list[str]:
    return [k for b in batches for k in b["key"]]


def _draw(ds: ShardStream, world: World, samples: int) -> list[str]:
    """The first ``samples`` keys ``world``'s reader yields (its pipeline run here, as its worker would)."""
    batches = iter(ds.pipeline(world, 0))
    return _keys(itertools.islice(batches, samples // ds.config.batch_size))


def test_select_never_yields_outside_the_mask_in_either_mode(out: sm.Output) -> None:
    chosen = {k for keys in out.keys.values() for i, k in enumerate(keys) if i % 3 == 0 and out.labels[k] == 0}

    def select(t: dict[str, np.ndarray]) -> np.ndarray:
        return (t["position"] % 3 == 0) & (t["label"] == 0)

    epoch = stream(out.root, batch_size=4, resampled=False, select=select, pad_last=True, world=TWO[0])
    seen = [_keys(epoch.pipeline(w, 0)) for w in TWO]
    batches = [b for w in TWO for b in epoch.pipeline(w, 0)]
    valid = [k for b in batches for k, v in zip(b["key"], b["valid"].tolist(), strict=True) if v]
    assert sorted(valid) == sorted(chosen)  # every selected sample once, nothing else
    assert set(itertools.chain(*seen)) == chosen
    resampled = stream(out.root, batch_size=4, select=select, seed=3, world=TWO[0])
    assert set(itertools.chain(*(_draw(resampled, w, 200) for w in TWO))) <= chosen


def test_epoch_batches_count_only_selected_samples(out: sm.Output) -> None:
    def select(t: dict[str, np.ndarray]) -> np.ndarray:
        return t["label"] == 1

    ds = stream(out.root, batch_size=5, resampled=False, select=select, world=World(rank=0, world_size=1))
    assert int(ds.counts.sum()) == sum(v == 1 for v in out.labels.values()) == 84
    assert ds.batches_per_rank(0) == 84 // 5
    assert len(list(ds)) == ds.batches_per_rank(0)


def test_class_weights_balance_80_20_labels_over_2_ranks_x_2_workers(out: sm.Output) -> None:
    ds = stream(out.root, batch_size=25, weights="class", seed=11, shuffle=50, world=TWO[0])
    keys = list(itertools.chain(*(_draw(ds, w, 5_000) for w in TWO)))  # 20,000 samples
    share = sum(out.labels[k] for k in keys) / len(keys)
    assert len(keys) == 20_000 and abs(share - 0.5) < 0.02


def test_slide_weights_give_every_slide_its_share(out: sm.Output) -> None:
    ds = stream(out.root, batch_size=20, weights="slide", seed=2, world=TWO[0])
    keys = list(itertools.chain(*(_draw(ds, w, 3_000) for w in TWO)))
    per_slide = collections.Counter(k.split("_x")[0] for k in keys)
    assert len(per_slide) == 5 and all(abs(n / len(keys) - 0.2) < 0.02 for n in per_slide.values())


def test_a_mapping_and_a_function_weigh_samples(out: sm.Output) -> None:
    mapped = stream(out.root, batch_size=10, weights={1: 1.0}, seed=4, world=World(rank=0, world_size=1))
    assert {out.labels[k] for k in _draw(mapped, World(), 400)} == {1}
    fn = stream(
        out.root,
        batch_size=10,
        weights=lambda t: np.where(t["label"] == 1, 3.0, 1.0),
        seed=4,
        world=World(rank=0, world_size=1),
    )
    keys = _draw(fn, World(), 4_000)
    share = sum(out.labels[k] for k in keys) / len(keys)  # 84 x 3 against 336 x 1: 3/7 of the draws
    assert abs(share - 3 / 7) < 0.03


@pytest.mark.parametrize(
    ("one", "other"),
    [(3e307, 1e307), (1e308, 1e308 / 3), (3e-320, 1e-320), ({1: 1e308, 0: 1e308 / 3}, None)],
    ids=["near max", "at max", "subnormal", "mapping"],
)
def test_finite_extreme_weights_draw_by_their_ratios(out: sm.Output, one: Any, other: Any) -> None:
    """Issue 42: weights of 1e308 a sample overflowed a shard's total (``cannot convert float NaN to integer``)."""
    weights = one if other is None else (lambda t: np.where(t["label"] == 1, one, other))
    ds = stream(out.root, batch_size=10, weights=weights, seed=4, world=World(rank=0, world_size=1))
    keys = _draw(ds, World(), 4_000)
    share = sum(out.labels[k] for k in keys) / len(keys)  # 84 x 3 against 336 x 1: 3/7 of the draws
    assert len(keys) == 4_000 and abs(share - 3 / 7) < 0.03


def test_class_weights_leave_unlabelled_samples_out_and_say_how_many(tmp_path: Path, caplog: Any) -> None:
    """Issue 43: with 4 of 5 slides labelled, -1 was drawn as a class of its own (a third of the draws)."""
    part = sm.make_output(str(tmp_path / "part"), (60, 45, 70), slides=5, slide_labels=(0, 0, 0, 1, -1))
    index_build(part.root)
    with caplog.at_level(logging.WARNING, logger="wsishard.streaming.dataset"):
        ds = stream(part.root, batch_size=10, weights="class", seed=3, world=World(rank=0, world_size=1))
    assert 'weights="class" leaves out 35 of 175 samples, unlabelled (-1)' in caplog.text
    drawn = collections.Counter(part.labels[k] for k in _draw(ds, World(), 4_000))
    assert set(drawn) == {0, 1} and abs(drawn[1] / 4_000 - 0.5) < 0.03


def test_class_weights_are_refused_on_a_build_without_labels(tmp_path: Path) -> None:
    """Issue 43: a build without labels silently drew only -1."""
    plain = sm.make_output(str(tmp_path / "plain"), (20, 30), labelled=False)
    index_build(plain.root)
    with pytest.raises(ValueError, match=r'weights="class" needs labels, and none of the 50 samples of .*plain'):
        stream(plain.root, batch_size=4, weights="class")
    assert len(_keys(itertools.islice(stream(plain.root, batch_size=4, weights="slide"), 5))) == 20  # others work


def test_proportions_mix_sources(out: sm.Output, tmp_path: Path) -> None:
    other = sm.make_output(str(tmp_path / "b"), (30, 30), slides=2, slide_prefix="other", seed=1)
    index_build(other.root)
    ds = stream(
        [out.root, other.root],
        batch_size=10,
        weights="class",
        proportions=[0.3, 0.7],
        seed=5,
        world=World(rank=0, world_size=1),
    )
    keys = _draw(ds, World(), 5_000)
    share = sum(k.startswith("other") for k in keys) / len(keys)
    assert abs(share - 0.7) < 0.05
    epoch = stream(
        [out.root, other.root],
        batch_size=10,
        weights="class",
        proportions=[0.3, 0.7],
        seed=5,
        resampled=False,
        epoch_size=3_000,
        pad_last=True,
        world=TWO[0],
    )
    keys = _valid([b for w in TWO for b in epoch.pipeline(w, 0)])  # a weighted epoch over 2 ranks x 2 workers
    assert len(keys) == 3_000 and abs(sum(k.startswith("other") for k in keys) / 3_000 - 0.7) < 0.03
    with pytest.raises(ValueError, match="needs weights"):
        stream([out.root, other.root], batch_size=10, proportions=[0.5, 0.5])


@pytest.mark.parametrize("kw", [{"weights": "class"}, {"select": "tissue"}, {"weights": "slide", "select": "odd"}])
def test_weighted_and_selected_streams_resume_exactly(out: sm.Output, kw: dict[str, Any]) -> None:
    chosen = {"tissue": _tissue_select, "odd": _odd_select}
    options = {k: chosen.get(v, v) for k, v in kw.items()}

    def fresh() -> Any:
        return loader(stream(out.root, batch_size=6, shuffle=12, seed=8, **options), num_workers=2)

    reference = [tuple(b["key"]) for b in itertools.islice(fresh(), 30)]
    first = fresh()
    taken = [tuple(b["key"]) for b in itertools.islice(first, 13)]
    state = json.loads(json.dumps(first.state_dict()))
    again = fresh()
    again.load_state_dict(state)
    assert taken + [tuple(b["key"]) for b in itertools.islice(again, 17)] == reference


def test_a_resampled_select_reads_no_index_at_start_up_and_resumes_across_passes(
    out: sm.Output, tmp_path: Path
) -> None:
    def fresh(root: str = out.root) -> Any:
        return loader(stream(root, batch_size=5, shuffle=8, seed=2, select=_quarter_select), num_workers=2)

    chosen = {k for keys in out.keys.values() for i, k in enumerate(keys) if i % 4 == 0}
    reference = [tuple(b["key"]) for b in itertools.islice(fresh(), 60)]
    first = fresh()
    taken = [tuple(b["key"]) for b in itertools.islice(first, 37)]
    assert len(chosen) / 2 < 37 * 5 / 2  # each worker stopped in its second pass over its shards
    again = fresh()
    again.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert taken + [tuple(b["key"]) for b in itertools.islice(again, 23)] == reference
    assert {k for b in reference for k in b} <= chosen
    root = tmp_path / "out"
    shutil.copytree(out.root, root)
    gone = root / index_name(sorted(out.keys)[3])
    gone.unlink()
    lazy = stream(str(root), batch_size=5, select=_quarter_select)  # no index is read here
    with pytest.raises(IndexFileError, match=gone.name):
        list(itertools.islice(lazy, 200))  # until a reader visits that shard
    with pytest.raises(IndexFileError, match=gone.name):
        stream(str(root), batch_size=5, resampled=False, select=_quarter_select)  # an epoch counts at start-up


def test_a_resampled_reader_whose_shards_select_keeps_nothing_of_fails_instead_of_spinning(out: sm.Output) -> None:
    first = sorted(out.keys)[0]
    only_first = stream(out.root, batch_size=5, seed=1, select=functools.partial(_in_shard, first))
    readers = [World(rank=0, world_size=1, worker=w, num_workers=2) for w in range(2)]
    lone = [
        w for w in readers if first not in {only_first.shards[s].url.rsplit("/", 1)[1] for s in _share(only_first, w)}
    ]
    with pytest.raises(ValueError, match=r"select= keeps no sample of the 8 shard.*lazy_select=False"):
        next(iter(only_first.pipeline(lone[0], 0)))
    eager = stream(out.root, batch_size=5, seed=1, select=functools.partial(_in_shard, first), lazy_select=False)
    assert len(eager.shards) == 1 and set(_draw(eager, lone[0], 20)) <= set(out.keys[first])


def _share(ds: ShardStream, world: World) -> list[int]:
    from wsishard.streaming.planner import reader_share

    return [p.shard for p in reader_share(ds.spec, (world.num_workers,), world.rank, world.worker)]


def _in_shard(name: str, t: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(t["shard"]) == name


def _quarter_select(t: dict[str, np.ndarray]) -> np.ndarray:
    return t["position"] % 4 == 0


def _tissue_select(t: dict[str, np.ndarray]) -> np.ndarray:
    return t["tissue"] >= 0.5


def _odd_select(t: dict[str, np.ndarray]) -> np.ndarray:
    return t["position"] % 2 == 1


def test_pad_last_reads_a_706_sample_shard_exactly_once_on_2_ranks_x_2_workers(tmp_path: Path, caplog: Any) -> None:
    one = sm.make_output(str(tmp_path / "one"), (706,), slides=3)
    worlds = [World(rank=r, world_size=2) for r in range(2)]
    runs = [
        list(loader(stream(one.root, batch_size=64, resampled=False, pad_last=True, world=w), num_workers=2))
        for w in worlds
    ]
    assert len(runs[0]) == len(runs[1]) > 0
    valid = [k for run in runs for b in run for k, v in zip(b["key"], b["valid"].tolist(), strict=True) if v]
    assert sorted(valid) == sorted(one.shard_of)
    assert all(b["valid"].dtype == torch_bool() and len(b["key"]) == 64 for run in runs for b in run)
    with caplog.at_level(logging.WARNING, logger="wsishard.streaming.dataset"):
        plain = loader(stream(one.root, batch_size=64, resampled=False, world=worlds[0]), num_workers=2)
        dropped = _keys(plain)
    assert "reads 512 of 706 samples each epoch (194 dropped" in caplog.text
    assert len(dropped) == 256 and all(
        "valid" not in b for b in loader(stream(one.root, batch_size=64, resampled=False), num_workers=0)
    )


def torch_bool() -> Any:
    import torch

    return torch.bool


def _valid(batches: list[dict[str, Any]]) -> list[str]:
    return [k for b in batches for k, v in zip(b["key"], b["valid"].tolist(), strict=True) if v]


def test_a_weighted_epoch_draws_epoch_size_samples_with_equal_batches_per_rank(out: sm.Output) -> None:
    """weights="class" in epoch mode (refused before the planner): 1200 draws over 2 ranks x 2 workers, padded,
    every rank the same batches, the 80/20 labels drawn 50/50; the next epoch draws others."""
    ds = stream(out.root, batch_size=25, resampled=False, weights="class", epoch_size=1200, pad_last=True, seed=2)
    ds.world = TWO[0]
    per_rank = collections.Counter()
    epochs = []
    for epoch in range(2):
        batches = {w: list(ds.pipeline(w, epoch)) for w in TWO}
        for w, got in batches.items():
            per_rank[epoch, w.rank] += len(got)
        epochs.append(_valid([b for got in batches.values() for b in got]))
    assert per_rank[0, 0] == per_rank[0, 1] and per_rank[1, 0] == per_rank[1, 1]
    assert [len(keys) for keys in epochs] == [1200, 1200]  # exactly epoch_size valid draws
    for keys in epochs:
        assert abs(sum(out.labels[k] for k in keys) / 1200 - 0.5) < 0.04
        assert max(collections.Counter(keys).values()) > 1  # with replacement: the 84 label-1 samples repeat
    assert epochs[0] != epochs[1]


def _two_rank_loaders(root: str, ranks: int, workers: int) -> list[Any]:
    return [
        loader(
            stream(
                root,
                batch_size=5,
                shuffle=8,
                seed=6,
                resampled=False,
                pad_last=True,
                select=_odd_select,
                world=World(rank=r, world_size=ranks),
            ),
            num_workers=workers,
        )
        for r in range(ranks)
    ]


def test_a_select_epoch_resumes_on_other_topologies_again_and_again(out: sm.Output) -> None:
    """An epoch with select= stopped on 2 ranks x 2 workers after 3 batches per rank, resumed in one process with 3
    workers, stopped after 2 batches, resumed with 2: every selected sample exactly once (refused before)."""
    chosen = sorted(k for keys in out.keys.values() for i, k in enumerate(keys) if i % 2 == 1)
    old = _two_rank_loaders(out.root, 2, 2)
    taken = [_valid(list(itertools.islice(dl, 3))) for dl in old]
    states = json.loads(json.dumps([dl.state_dict() for dl in old]))
    middle = _two_rank_loaders(out.root, 1, 3)[0]
    middle.load_state_dict(states)
    taken.append(_valid(list(itertools.islice(middle, 2))))
    state = json.loads(json.dumps(middle.state_dict()))
    assert len(state["history"]) == 1 and state["history"][0]["topology"] == [2, 2]
    last = _two_rank_loaders(out.root, 1, 2)[0]
    last.load_state_dict(state)
    rest = _valid(list(last))
    assert all(taken) and rest
    assert sorted([*itertools.chain(*taken), *rest]) == chosen
    assert last.dataset.next_epoch == 1


def test_a_build_without_an_index_streams_as_before_and_refuses_select(tmp_path: Path) -> None:
    old = sm.make_output(str(tmp_path / "old"), (5, 6))
    assert len(_keys(stream(old.root, batch_size=1, resampled=False))) == 11
    with pytest.raises(ManifestError, match="no per-sample index"):
        stream(old.root, batch_size=1, select=_odd_select)
    with pytest.raises(ManifestError, match="no per-sample index"):
        stream(old.root, batch_size=1, weights="class")


def test_bad_combinations_are_refused(out: sm.Output) -> None:
    with pytest.raises(ValueError, match="epoch_size=1200 counts weighted draws: it needs weights="):
        stream(out.root, batch_size=4, resampled=False, epoch_size=1200)
    with pytest.raises(ValueError, match="resampled streams never end"):
        stream(out.root, batch_size=4, weights="class", epoch_size=1200)
    with pytest.raises(ValueError, match="pad_last=True needs resampled=False"):
        stream(out.root, batch_size=4, pad_last=True)
    with pytest.raises(ValueError, match="weights= must be"):
        stream(out.root, batch_size=4, weights="balanced")  # type: ignore[arg-type]
    for bad, message in ((lambda t: t["tissue"], "bool array"), (lambda t: t["label"] > 5, "keeps no sample")):
        with pytest.raises(ValueError, match=message):  # an epoch reads every index at start-up
            stream(out.root, batch_size=4, resampled=False, select=bad)
        lazy = stream(out.root, batch_size=4, select=bad)  # resampled: no index read until a reader visits
        with pytest.raises(ValueError, match=message):
            next(iter(lazy))


def test_a_build_writes_an_index_of_its_shards_and_a_summary(cohort_build: Path) -> None:
    manifest = json.loads((cohort_build / "manifest.json").read_text())
    summary = Summary.from_bytes((cohort_build / SUMMARY_NAME).read_bytes())
    assert summary.shards.astype(str).tolist() == [s["name"] for s in manifest["shards"]]
    assert summary.samples.tolist() == [s["samples"] for s in manifest["shards"]]
    for rec in manifest["shards"][:3]:
        index = load_index((cohort_build / index_name(rec["name"])).read_bytes())
        data = (cohort_build / rec["name"]).read_bytes()
        keys = [k for k, _ in TarSamples(open(cohort_build / rec["name"], "rb"), {"json"})]  # noqa: SIM115
        assert index.key.astype(str).tolist() == keys
        for row in (0, len(keys) - 1):
            lo, size = int(index.columns["offset"][row]), int(index.columns["size"][row])
            meta = json.loads(next(iter(TarSamples(_bytes(data[lo : lo + size]), {"json"})))[1]["json"])
            assert (meta["x"], meta["y"]) == (index.columns["x"][row], index.columns["y"][row])
            assert index.columns["tissue"][row] == pytest.approx(meta["tissue"])
    strict = stream(
        str(cohort_build),
        batch_size=4,
        resampled=False,
        select=lambda t: t["tissue"] >= 0.9,
        world=World(rank=0, world_size=1),
        pad_last=True,
    )
    want = sum(
        int((load_index((cohort_build / index_name(r["name"])).read_bytes()).columns["tissue"] >= 0.9).sum())
        for r in manifest["shards"]
    )
    got = [b for b in strict]
    assert sum(int(b["valid"].sum()) for b in got) == want > 0
    assert all(m["tissue"] >= 0.9 for b in got for m, v in zip(b["meta"], b["valid"].tolist(), strict=True) if v)


def _bytes(data: bytes) -> Any:
    import io

    return io.BytesIO(data)


def test_select_and_weights_read_the_index_from_s3(out: sm.Output, s3: Any, s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/out"
    s3.upload(out.root, url)
    assert {n for n in os.listdir(out.root) if n.endswith(".npz")} >= {SUMMARY_NAME, index_name(sm.shard_name(0))}
    ds = stream(
        url,
        batch_size=5,
        resampled=False,
        select=_odd_select,
        pad_last=True,
        storage_options=s3.storage_options,
        world=World(rank=0, world_size=1),
    )
    odd = {k for keys in out.keys.values() for i, k in enumerate(keys) if i % 2}
    valid = [k for b in ds for k, v in zip(b["key"], b["valid"].tolist(), strict=True) if v]
    assert sorted(valid) == sorted(odd)
    weighted = stream(
        url,
        batch_size=10,
        weights="class",
        seed=1,
        storage_options=s3.storage_options,
        world=World(rank=0, world_size=1),
    )
    keys = _draw(weighted, World(), 1_000)
    assert abs(sum(out.labels[k] for k in keys) / len(keys) - 0.5) < 0.06
