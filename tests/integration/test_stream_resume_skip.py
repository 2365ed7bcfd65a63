"""Resume after ``on_error="skip"``: a loader saves how many items of its plan each worker has passed (yielded, or
skipped with a broken shard or sample), so a resumed loader goes on where the uninterrupted one did; and a
``collate_fn`` of the user's that makes a new dict keeps the resume exact."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import shardmaker as sm
from streamtools import keys_of

from wsishard.shards.summary import index_build
from wsishard.streaming.loader import ShardLoader, loader
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World

COUNTS = (9, 7, 12, 5, 10, 8)


def _broken(root: Path, kind: str) -> sm.Output:
    out = sm.make_output(str(root), COUNTS)
    if kind == "truncated":  # the shard's first samples read, then it fails: the rest of it skipped
        sm.truncate(out.path(2), 0.5)
    else:  # one sample's image cut short: that sample skipped at decode
        keys = out.keys[out.manifest.shards[4].name]
        sm.rewrite_member(out, 4, keys[3], "jpg", lambda data: data[: len(data) // 3])
    return out


@pytest.fixture(scope="module", params=["truncated", "corrupt-jpeg"])
def bad(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> sm.Output:
    return _broken(tmp_path_factory.mktemp("skip"), request.param)


def _loader(root: str, workers: int, **kw: Any) -> ShardLoader:
    extra = kw.pop("loader", {})
    ds = stream(root, batch_size=3, on_error="skip", **{"seed": 5, "shuffle": 6, **kw})
    return loader(ds, num_workers=workers, **extra)


def _sig(batches: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [tuple(b["key"]) for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_with_a_skip_resumes_as_the_uninterrupted_one(bad: sm.Output, workers: int) -> None:
    """Stopped after every number of batches in turn (before and after the skip)."""
    reference = _sig(list(_loader(bad.root, workers, resampled=False, drop_last=False)))
    assert sum(len(b) for b in reference) < sum(COUNTS)  # something was skipped
    for steps in range(1, len(reference)):
        first = _loader(bad.root, workers, resampled=False, drop_last=False)
        taken = _sig(list(itertools.islice(first, steps)))
        state = json.loads(json.dumps(first.state_dict()))
        again = _loader(bad.root, workers, resampled=False, drop_last=False)
        again.load_state_dict(state)
        assert taken + _sig(list(again)) == reference, f"stopped after {steps} batches"


@pytest.mark.parametrize(("workers", "steps"), [(0, 9), (2, 11)])
def test_a_resampled_stream_with_a_skip_resumes_as_the_uninterrupted_one(
    bad: sm.Output, workers: int, steps: int
) -> None:
    reference = _sig(list(itertools.islice(_loader(bad.root, workers), steps + 20)))
    first = _loader(bad.root, workers)
    assert _sig(list(itertools.islice(first, steps))) == reference[:steps]
    again = _loader(bad.root, workers)
    again.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert _sig(list(itertools.islice(again, 20))) == reference[steps:]


def test_an_epoch_with_a_skip_resumed_on_another_topology_yields_the_rest_once(tmp_path: Path) -> None:
    """2 ranks x 2 workers stopped after 2 batches each, resumed in one process with 3 workers: every sample the
    broken build can give, once (the truncated shard's readable samples included), none of them twice."""
    bad = _broken(tmp_path / "o", "truncated")
    whole = set(keys_of(_loader(bad.root, 0, resampled=False, drop_last=False, shuffle=0)))

    def ranks(n: int, workers: int) -> list[ShardLoader]:
        return [
            _loader(bad.root, workers, resampled=False, drop_last=False, world=World(rank=r, world_size=n))
            for r in range(n)
        ]

    old = ranks(2, 2)
    taken = [keys_of(itertools.islice(dl, 2)) for dl in old]
    again = ranks(1, 3)[0]
    again.load_state_dict(json.loads(json.dumps([dl.state_dict() for dl in old])))
    seen = [*itertools.chain(*taken), *keys_of(again)]
    assert len(seen) == len(set(seen))
    assert set(seen) <= whole and len(whole - set(seen)) < 2 * 2 * 3  # at most the old workers' partial batches


def _new_dict(batch: dict[str, Any]) -> dict[str, Any]:
    """A user's collate_fn: a new dict of the batch's keys, as many write."""
    return {"x": batch["image"].float(), "key": list(batch["key"])}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_user_collate_that_makes_a_new_dict_resumes_exactly(tmp_path: Path, workers: int) -> None:
    out = sm.make_output(str(tmp_path / "o"), COUNTS)
    kw: dict[str, Any] = {"resampled": False, "drop_last": False, "loader": {"collate_fn": _new_dict}}
    reference = _sig(list(_loader(out.root, workers, **dict(kw))))
    first = _loader(out.root, workers, **dict(kw))
    taken = _sig(list(itertools.islice(first, 5)))
    state = json.loads(json.dumps(first.state_dict()))
    assert state["batches"] != [5] + [0] * (max(workers, 1) - 1) or workers == 0  # each batch counted to its worker
    again = _loader(out.root, workers, **dict(kw))
    again.load_state_dict(state)
    rest = list(again)
    assert set(rest[0]) == {"x", "key"}  # the user's own dict, as the function made it
    assert taken + _sig(rest) == reference


def test_a_lazy_select_with_a_skip_resumes_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """A resampled stream applies select= as readers visit shards (their pieces count rows until read): its
    position after a skipped shard still counts selected samples."""
    out = sm.make_output(str(tmp_path / "o"), COUNTS)
    index_build(out.root)
    sm.truncate(out.path(2), 0.5)

    def fresh() -> ShardLoader:
        return _loader(out.root, 2, select=lambda t: t["position"] % 2 == 0)

    reference = _sig(list(itertools.islice(fresh(), 30)))
    for steps in (4, 13):
        first = fresh()
        taken = _sig(list(itertools.islice(first, steps)))
        again = fresh()
        again.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert taken + _sig(list(itertools.islice(again, 30 - steps))) == reference


@pytest.mark.parametrize("workers", [0, 2])
def test_a_rank_topping_up_after_a_skip_resumes_as_the_uninterrupted_one(tmp_path: Path, workers: int) -> None:
    """Under DDP a rank left short by a skip re-reads its own shards to yield its planned batches (a top-up); a job
    stopped at any batch, before or during the top-up, resumes to the uninterrupted rank's batches."""
    out = sm.make_output(str(tmp_path / "o"), COUNTS)
    sm.truncate(out.path(2), 0.3)

    def rank(r: int) -> ShardLoader:
        return _loader(out.root, workers, resampled=False, shuffle=4, world=World(rank=r, world_size=2))

    tops = []
    for r in range(2):
        reference = _sig(list(rank(r)))
        topped = len(set(sum(reference, ()))) < len(sum(reference, ()))  # this rank re-read some samples
        tops.append(topped)
        for steps in range(1, len(reference)):
            first = rank(r)
            taken = _sig(list(itertools.islice(first, steps)))
            again = rank(r)
            again.load_state_dict(json.loads(json.dumps(first.state_dict())))
            assert taken + _sig(list(again)) == reference, f"rank {r} (topped up: {topped}) stopped at {steps}"
    assert any(tops)  # one rank did top up
