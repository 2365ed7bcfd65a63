"""Resume: a loader restored from its state_dict yields, from step N on, what the uninterrupted run yields."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
import shardmaker as sm

from wsishard.streaming.dataset import stream
from wsishard.streaming.loader import ShardLoader, loader

COUNTS = (9, 7, 12, 5, 10, 8)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> sm.Output:
    return sm.make_output(str(tmp_path_factory.mktemp("resume")), COUNTS)


def _loader(root: str, workers: int, **kw: Any) -> ShardLoader:
    ds = stream(root, batch_size=3, shuffle=6, **{"seed": 5, **kw})
    return loader(ds, num_workers=workers)


def _sig(batches: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [tuple(b["key"]) for b in batches]


@pytest.mark.parametrize(("workers", "steps"), [(2, 5), (2, 6), (0, 4), (3, 7)])
def test_resampled_batches_after_a_resume_are_the_uninterrupted_ones(out: sm.Output, workers: int,
                                                                      steps: int) -> None:  # fmt: skip
    reference = list(itertools.islice(_loader(out.root, workers), steps + 12))
    first = _loader(out.root, workers)
    taken = list(itertools.islice(first, steps))
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON: what a checkpoint stores
    assert _sig(taken) == _sig(reference[:steps])
    again = _loader(out.root, workers)
    again.load_state_dict(state)
    rest = list(itertools.islice(again, 12))
    assert _sig(rest) == _sig(reference[steps:])
    for a, b in zip(rest, reference[steps:], strict=True):
        assert np.array_equal(a["image"].numpy(), b["image"].numpy()) and a["label"].tolist() == b["label"].tolist()


@pytest.mark.parametrize(("workers", "steps"), [(2, 3), (2, 8), (0, 5), (3, 4)])
def test_an_epoch_resumed_mid_way_finishes_as_the_uninterrupted_one_and_the_next_follows(
    out: sm.Output, workers: int, steps: int
) -> None:
    uninterrupted = _loader(out.root, workers, resampled=False, drop_last=False)
    reference = [_sig(list(uninterrupted)) for _ in range(2)]  # two epochs
    assert len(reference[0]) > steps
    first = _loader(out.root, workers, resampled=False, drop_last=False)
    taken = list(itertools.islice(first, steps))
    state = json.loads(json.dumps(first.state_dict()))
    again = _loader(out.root, workers, resampled=False, drop_last=False)
    again.load_state_dict(state)
    assert _sig(taken) + _sig(list(again)) == reference[0]  # the epoch finishes: no sample repeated or lost
    assert _sig(list(again)) == reference[1]  # and the next epoch is the uninterrupted run's next


def test_a_state_at_an_epochs_end_resumes_with_the_next_epoch(out: sm.Output) -> None:
    first = _loader(out.root, 2, resampled=False, drop_last=False)
    epoch0 = _sig(list(first))
    state = first.state_dict()
    again = _loader(out.root, 2, resampled=False, drop_last=False)
    again.load_state_dict(state)
    uninterrupted = _loader(out.root, 2, resampled=False, drop_last=False)
    assert _sig(list(uninterrupted)) == epoch0
    assert _sig(list(again)) == _sig(list(uninterrupted))


def test_a_state_of_another_topology_or_stream_is_refused(out: sm.Output) -> None:
    state = _loader(out.root, 2).state_dict()
    with pytest.raises(ValueError, match="num_workers 2 \\(now 3\\)"):
        _loader(out.root, 3).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        loader(stream(out.root, batch_size=4, seed=5), num_workers=2).load_state_dict(state)
    with pytest.raises(ValueError, match="not a wsishard loader state"):
        _loader(out.root, 2).load_state_dict({"epoch": 0})


def test_the_state_is_plain_data(out: sm.Output) -> None:
    dl = _loader(out.root, 2)
    list(itertools.islice(dl, 3))
    state = dl.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["batches"] == [2, 1] and state["last_worker"] == 0 and state["epoch"] == 0
