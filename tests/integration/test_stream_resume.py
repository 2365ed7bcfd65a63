"""Resume: a loader restored from its state_dict yields, from step N on, what the uninterrupted run yields."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import numpy as np
import pytest
import shardmaker as sm
from streamtools import kept, keys_of

from wsishard.streaming.loader import ShardLoader, loader
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World

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
def test_resampled_batches_after_a_resume_are_the_uninterrupted_ones(out: sm.Output, workers: int, steps: int) -> None:
    reference = list(itertools.islice(kept(_loader(out.root, workers)), steps + 12))
    first = _loader(out.root, workers)
    taken = list(itertools.islice(kept(first), steps))
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON: what a checkpoint stores
    assert _sig(taken) == _sig(reference[:steps])
    again = _loader(out.root, workers)
    again.load_state_dict(state)
    rest = list(itertools.islice(kept(again), 12))
    assert _sig(rest) == _sig(reference[steps:])
    for a, b in zip(rest, reference[steps:], strict=True):
        assert np.array_equal(a["image"].numpy(), b["image"].numpy()) and a["label"].tolist() == b["label"].tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resampled_stream_without_a_seed_resumes_to_the_batches_it_would_have_given(
    out: sm.Output, workers: int
) -> None:
    """Review of the merged planner: a state's drawn seed reached the dataset but not the planner's spec, so the
    batches after a resume came from a new random stream."""
    first = _loader(out.root, workers, seed=None)
    it = kept(first)
    list(itertools.islice(it, 4))
    state = json.loads(json.dumps(first.state_dict()))
    reference = list(itertools.islice(it, 8))
    again = _loader(out.root, workers, seed=None)
    again.load_state_dict(state)
    assert _sig(list(itertools.islice(kept(again), 8))) == _sig(reference)


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


@pytest.mark.parametrize(("resampled", "steps"), [(False, 3), (False, 8), (True, 5)])
def test_persistent_workers_resume_mid_epoch_and_go_on(out: sm.Output, resampled: bool, steps: int) -> None:
    def persistent() -> ShardLoader:
        ds = stream(out.root, batch_size=3, shuffle=6, seed=5, resampled=resampled, drop_last=False)
        return loader(ds, num_workers=2, persistent_workers=True)

    def epochs(dl: ShardLoader, n: int) -> list[list[tuple[str, ...]]]:
        return [_sig(list(itertools.islice(dl, 14 if resampled else None))) for _ in range(n)]

    reference = epochs(persistent(), 2)
    first = persistent()
    taken = _sig(list(itertools.islice(first, steps)))
    state = json.loads(json.dumps(first.state_dict()))
    again = persistent()
    again.load_state_dict(state)  # refused before: persistent workers could not be resumed
    rest, following = epochs(again, 2)
    if resampled:
        assert taken + rest[: 14 - steps] == reference[0]
    else:
        assert taken + rest == reference[0]  # the epoch finishes in its workers: no sample repeated or lost
        assert following == reference[1]  # and the same workers go on with the uninterrupted run's next epoch


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
    with pytest.raises(ValueError, match="another topology needs epoch mode"):
        _loader(out.root, 3).load_state_dict(state)  # resampled: another topology would change the stream
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


def _ranks(root: str, ranks: int, workers: int, **kw: Any) -> list[ShardLoader]:
    return [
        loader(
            stream(
                root,
                batch_size=3,
                shuffle=6,
                seed=5,
                resampled=False,
                drop_last=False,
                world=World(rank=r, world_size=ranks),
                **kw,
            ),
            num_workers=workers,
        )
        for r in range(ranks)
    ]


@pytest.mark.parametrize(("ranks", "workers"), [(1, 2), (3, 2), (3, 1), (1, 0)])
def test_an_epoch_stopped_on_two_ranks_finishes_on_another_world_size(out: sm.Output, ranks: int, workers: int) -> None:
    old = _ranks(out.root, 2, 2)
    whole = set(keys_of(list(old[0]))) | set(keys_of(list(_ranks(out.root, 2, 2)[1])))  # the epoch, uninterrupted
    old = _ranks(out.root, 2, 2)
    taken = [keys_of(itertools.islice(dl, n)) for dl, n in zip(old, (3, 2), strict=True)]  # stopped mid-epoch
    states = [json.loads(json.dumps(dl.state_dict())) for dl in old]
    new = _ranks(out.root, ranks, workers)
    for dl in new:
        dl.load_state_dict(states)
    rest = [list(dl) for dl in new]
    assert len({len(r) for r in rest}) == 1  # every new rank yields as many batches: DDP stays in step
    before, after = [k for t in taken for k in t], [k for r in rest for k in keys_of(r)]
    assert len(before + after) == len(set(before + after))  # no sample twice
    assert set(before + after) <= whole
    lost = whole - set(before) - set(after)
    assert len(lost) <= ranks * max(workers, 1) * 2  # only what keeps the new ranks in step (partial batches)
    if ranks == 1:
        assert not lost  # one rank, drop_last=False: every sample of the epoch
    nxt = [keys_of(list(dl)) for dl in new]  # and the next epoch runs on the new topology
    assert sorted(k for n in nxt for k in n) == sorted(set(k for n in nxt for k in n)) and any(nxt)


def test_a_topology_change_needs_every_old_rank(out: sm.Output) -> None:
    old = _ranks(out.root, 2, 2)
    list(itertools.islice(old[0], 2))
    with pytest.raises(ValueError, match="states of every rank"):
        _ranks(out.root, 3, 2)[0].load_state_dict([old[0].state_dict()])


def test_states_taken_at_an_epochs_end_go_on_with_the_next_epoch_on_the_new_topology(out: sm.Output) -> None:
    old = _ranks(out.root, 2, 2)
    for dl in old:
        list(dl)
    new = _ranks(out.root, 3, 1)
    for dl in new:
        dl.load_state_dict([dl_old.state_dict() for dl_old in old])
    assert [dl.dataset.next_epoch for dl in new] == [1, 1, 1]
    fresh = _ranks(out.root, 3, 1)
    for dl in fresh:
        dl.dataset.set_epoch(1)
    assert [keys_of(list(a)) for a in new] == [keys_of(list(b)) for b in fresh]


BAD_FIELDS = {
    "huge batches": ("batches", [10**30, 0]),
    "float batches": ("batches", [1.0, 0]),
    "bool batches": ("batches", [True, 0]),
    "too few batches": ("batches", [1]),
    "negative batches": ("batches", [-1, 0]),
    "float epoch": ("epoch", 1e20),
    "huge epoch": ("epoch", 10**30),
    "bool epoch": ("epoch", True),
    "worker beyond the workers": ("last_worker", 99),
    "string worker": ("last_worker", "0"),
    "string rank": ("rank", "0"),
    "rank beyond the world": ("rank", 5),
    "seed as text": ("seed", "5"),
    "resampled as a number": ("resampled", 1),
    "samples of another shape": ("samples", [6]),
    "history not a list": ("history", {"topology": [2]}),
    "history of another shape": ("history", [{"topology": [2], "batches": [[1, 2, 3]]}]),
    "history of no topology": ("history", [{"batches": [[1]]}]),
    "items of another length": ("items", [3]),
    "negative items": ("items", [-1, None]),
    "items as text": ("items", ["3", 0]),
    "history items of another shape": ("history", [{"topology": [2], "batches": [[1, 2]], "items": [[3]]}]),
    "history items negative": ("history", [{"topology": [2], "batches": [[1, 2]], "items": [[3, -1]]}]),
}


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
def test_a_damaged_state_is_refused_naming_its_field(out: sm.Output, field: str, value: Any) -> None:
    first = _loader(out.root, 2)
    list(itertools.islice(first, 3))
    state = {**first.state_dict(), field: value}
    again = _loader(out.root, 2)
    with pytest.raises(ValueError, match=field):
        again.load_state_dict(state)
    assert again.dataset.next_epoch == 0  # refused before anything changed


def test_a_history_beyond_its_plan_is_refused_and_changes_nothing(out: sm.Output) -> None:
    first = _loader(out.root, 2, resampled=False)
    list(itertools.islice(first, 3))
    state = {**first.state_dict(), "history": [{"topology": [1], "batches": [[10**6]]}]}
    again = _loader(out.root, 2, resampled=False)
    with pytest.raises(ValueError, match=r"loader state: .*beyond its budget"):
        again.load_state_dict(state)
    assert again.dataset.history is None and again.dataset.next_epoch == 0


@pytest.mark.parametrize("state", ["epoch 3", None, 7, [], {"format": "wsishard-loader-state"}, ["x"]])
def test_what_is_no_state_at_all_is_refused(out: sm.Output, state: Any) -> None:
    with pytest.raises(ValueError, match="loader state"):
        _loader(out.root, 2).load_state_dict(state)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([0, 3], "a list whose item 0 is an int, not a state (a dict); give this rank's state_dict(), or a list"),
        (7, "not a wsishard loader state: an int, not a dict"),
    ],
)
def test_a_list_or_number_where_a_state_belongs_says_what_it_got(out: sm.Output, state: Any, message: str) -> None:
    """Issue 42: a list of numbers was refused as 'a int, not a dict', naming neither the list nor what to give."""
    with pytest.raises(ValueError, match=re.escape(message)):
        _loader(out.root, 2).load_state_dict(state)


def test_an_epoch_state_with_more_batches_than_the_epoch_gives_is_refused(out: sm.Output) -> None:
    first = _loader(out.root, 2, resampled=False)
    list(itertools.islice(first, 2))
    state = first.state_dict()
    state["batches"] = [b + 1000 for b in state["batches"]]
    with pytest.raises(ValueError, match="exceed the epoch"):
        _loader(out.root, 2, resampled=False).load_state_dict(state)
