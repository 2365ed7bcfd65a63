"""Property tests of the stream planner (pure: counts in, pieces per reader out; no I/O, no processes)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wsishard.errors import TopologyError
from wsishard.streaming.draws import draw_counts, piece_items, shuffled
from wsishard.streaming.planner import (
    Piece,
    Plan,
    Segment,
    Spec,
    plan_epoch,
    reader_pass,
    reader_share,
)
from wsishard.streaming.work import Passes, epoch_work

BUFFER = 7  # the readers' shuffle buffer in these tests: small, so that it reorders across a piece


def _items(piece: Piece, weights: list[np.ndarray] | None) -> list[tuple[int, int]]:
    """What a reader yields of ``piece``: (shard, sample) pairs, as the reader stage makes them from the shard."""
    if piece.draws:
        assert weights is not None
        counts = draw_counts(weights[piece.shard], piece.items, piece.seed)
        ids = np.repeat(np.arange(len(counts)), counts).tolist()
    else:
        ids = list(range(piece.items))
    return [(piece.shard, i) for i in piece_items(piece, ids, BUFFER)]


def _yields(plan: Plan, weights: list[np.ndarray] | None = None) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Each reader's real items, in yield order."""
    out = {}
    for rank, row in enumerate(plan.readers):
        for worker, reader in enumerate(row):
            got = [item for piece in reader.pieces for item in _items(piece, weights)]
            assert len(got) == reader.items
            out[rank, worker] = got[: reader.real]
    return out


def _taken(plan: Plan, stops: list[list[int]], weights: list[np.ndarray] | None = None) -> list[tuple[int, int]]:
    """The items the readers had yielded after ``stops[rank][worker]`` batches."""
    size, got = plan.batch_size, _yields(plan, weights)
    return [i for (r, w), items in got.items() for i in items[: stops[r][w] * size]]


def _all(plan: Plan, weights: list[np.ndarray] | None = None) -> list[tuple[int, int]]:
    return [i for items in _yields(plan, weights).values() for i in items]


def _expected_items(counts: list[int]) -> Counter[tuple[int, int]]:
    return Counter((s, i) for s, n in enumerate(counts) for i in range(n))


counts_st = st.lists(st.integers(0, 40), min_size=1, max_size=12)
topology_st = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


def _stops(plan: Plan, data: st.DataObject) -> list[list[int]]:
    return [[data.draw(st.integers(0, r.budget)) for r in row] for row in plan.readers]


@settings(max_examples=150, deadline=None)
@given(counts_st, topology_st, st.integers(1, 9), st.integers(0, 3), st.booleans())
def test_an_exact_epoch_yields_each_sample_at_most_once_and_equal_batches_per_rank(
    counts: list[int], topology: tuple[int, ...], batch: int, epoch: int, drop_last: bool
) -> None:
    spec = Spec(counts=np.array(counts), batch_size=batch, seed=5, drop_last=drop_last)
    if sum(counts) < sum(topology):
        with pytest.raises(TopologyError, match="cannot give each"):
            plan_epoch(spec, topology, epoch)
        return
    plan = plan_epoch(spec, topology, epoch)
    assert plan.topology == topology
    assert len({sum(r.budget for r in row) for row in plan.readers}) == 1  # every rank the same batches
    got = Counter(_all(plan))
    assert max(got.values(), default=1) == 1 and set(got) <= set(_expected_items(counts))
    for row in plan.readers:
        for reader in row:
            full = reader.real // batch
            assert reader.budget == full + (reader.real % batch > 0)  # real items fill its batches
            assert not drop_last or reader.real % batch == 0
    # what it drops is what keeping the ranks in step needs: less than a batch per reader plus one rank's surplus
    assert sum(counts) - len(got) < sum(topology) * batch + max(counts) * len(topology)


@settings(max_examples=150, deadline=None)
@given(counts_st, topology_st, st.integers(1, 9), st.integers(0, 3))
def test_a_padded_epoch_yields_every_sample_exactly_once(
    counts: list[int], topology: tuple[int, ...], batch: int, epoch: int
) -> None:
    if sum(counts) < sum(topology):
        return
    plan = plan_epoch(Spec(counts=np.array(counts), batch_size=batch, seed=1, pad_last=True), topology, epoch)
    assert Counter(_all(plan)) == _expected_items(counts)
    assert len({sum(r.budget for r in row) for row in plan.readers}) == 1
    for row in plan.readers:
        assert all(r.budget * batch >= r.real for r in row)


@settings(max_examples=100, deadline=None)
@given(counts_st, topology_st, topology_st, topology_st, st.integers(1, 6), st.booleans(), st.data())
def test_an_epoch_resumed_elsewhere_twice_yields_what_the_uninterrupted_one_does(
    counts: list[int],
    first: tuple[int, ...],
    second: tuple[int, ...],
    third: tuple[int, ...],
    batch: int,
    twice: bool,
    data: st.DataObject,
) -> None:
    """Stopped at any batches on one topology, resumed on another (and again): padded, every sample exactly once
    across the stretches, as in the uninterrupted epoch; each stretch keeps its ranks in step."""
    if sum(counts) < max(sum(first), sum(second), sum(third)):
        return
    spec = Spec(counts=np.array(counts), batch_size=batch, seed=3, pad_last=True)
    plan = plan_epoch(spec, first, 2)
    stops = _stops(plan, data)
    taken = _taken(plan, stops)
    history = [Segment(first, tuple(tuple(s) for s in stops))]
    plan = plan_epoch(spec, second, 2, history)
    if twice:
        stops = _stops(plan, data)
        taken += _taken(plan, stops)
        history.append(Segment(second, tuple(tuple(s) for s in stops)))
        plan = plan_epoch(spec, third, 2, history)
    assert len({sum(r.budget for r in row) for row in plan.readers}) == 1
    assert Counter(taken + _all(plan)) == _expected_items(counts) == Counter(_all(plan_epoch(spec, first, 2)))


@settings(max_examples=60, deadline=None)
@given(counts_st, topology_st, topology_st, st.integers(1, 6), st.data())
def test_an_unpadded_resume_never_repeats_a_sample(
    counts: list[int], first: tuple[int, ...], second: tuple[int, ...], batch: int, data: st.DataObject
) -> None:
    if sum(counts) < max(sum(first), sum(second)):
        return
    spec = Spec(counts=np.array(counts), batch_size=batch, seed=3, drop_last=data.draw(st.booleans()))
    plan = plan_epoch(spec, first, 0)
    stops = _stops(plan, data)
    after = plan_epoch(spec, second, 0, [Segment(first, tuple(tuple(s) for s in stops))])
    got = Counter(_taken(plan, stops) + _all(after))
    assert max(got.values(), default=1) == 1
    assert len({sum(r.budget for r in row) for row in after.readers}) == 1


@settings(max_examples=80, deadline=None)
@given(counts_st, topology_st, topology_st, st.integers(1, 6), st.data())
def test_readers_that_skipped_items_resume_after_them_here_and_elsewhere(
    counts: list[int], first: tuple[int, ...], second: tuple[int, ...], batch: int, data: st.DataObject
) -> None:
    """A reader that passed more items of its plan than its batches hold (a skip under on_error="skip") goes on
    after the last item it passed: on the same topology (epoch_work) and on another (a segment with items); what
    was passed and what is left are every item exactly once."""
    if sum(counts) < max(sum(first), sum(second)):
        return
    spec = Spec(counts=np.array(counts), batch_size=batch, seed=3, pad_last=True)
    plan = plan_epoch(spec, first, 2)
    stops = _stops(plan, data)
    got = _yields(plan)
    passed: list[tuple[int, int]] = []
    positions = []
    for rank, row in enumerate(plan.readers):
        positions.append([])
        for worker, reader in enumerate(row):
            done = min(stops[rank][worker] * batch, reader.real)
            at = data.draw(st.integers(done, reader.real))
            positions[-1].append(at)
            passed += got[rank, worker][:at]
            rest = epoch_work(plan, rank, worker, stops[rank][worker], at)
            left = [i for piece in rest.source.pieces for i in _items(piece, None)][: rest.real]
            assert left == got[rank, worker][at:] and rest.real == reader.real - at
    segment = Segment(first, tuple(tuple(s) for s in stops), tuple(tuple(p) for p in positions))
    after = plan_epoch(spec, second, 2, [segment])
    assert Counter(passed + _all(after)) == _expected_items(counts)


def _weights(counts: list[int], seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    weights = [rng.choice([0.0, 0.5, 1.0, 4.0], n) for n in counts]
    return weights, np.array([w.sum() for w in weights])


@settings(max_examples=80, deadline=None)
@given(counts_st, topology_st, topology_st, st.integers(1, 6), st.integers(1, 200), st.data())
def test_a_weighted_epoch_draws_epoch_size_and_resumes_elsewhere_to_the_same_draws(
    counts: list[int],
    first: tuple[int, ...],
    second: tuple[int, ...],
    batch: int,
    size: int,
    data: st.DataObject,
) -> None:
    weights, totals = _weights(counts, sum(counts))
    if totals.sum() <= 0 or size < max(sum(first), sum(second)):
        return
    spec = Spec(counts=np.array(counts), batch_size=batch, seed=9, totals=totals, epoch_size=size, pad_last=True)
    whole = plan_epoch(spec, first, 1)
    draws = Counter(_all(whole, weights))
    assert sum(draws.values()) == size  # every draw once, padded
    assert all(weights[s][i] > 0 for s, i in draws)  # only samples of positive weight
    assert len({sum(r.budget for r in row) for row in whole.readers}) == 1
    stops = _stops(whole, data)
    after = plan_epoch(spec, second, 1, [Segment(first, tuple(tuple(s) for s in stops))])
    assert Counter(_taken(whole, stops, weights) + _all(after, weights)) == draws


def test_weighted_draws_follow_the_weights() -> None:
    """40,000 draws over 12 shards of mixed weights on 2 ranks x (2, 3) workers: each sample's frequency matches
    its weight (a chi-square test over the samples, fixed seed) and the unweighted epoch is unchanged."""
    counts = [30, 5, 50, 17, 8, 40, 22, 1, 60, 12, 33, 9]
    weights, totals = _weights(counts, 11)
    size = 40_000
    spec = Spec(counts=np.array(counts), batch_size=32, seed=4, totals=totals, epoch_size=size, pad_last=True)
    got = Counter(_all(plan_epoch(spec, (2, 3), 0), weights))
    observed = np.array([got[s, i] for s, w in enumerate(weights) for i in range(len(w))], dtype=np.float64)
    expected = np.concatenate(weights) / totals.sum() * size
    assert observed.sum() == size and not observed[expected == 0].any()
    live = expected > 0
    chi2 = float((((observed - expected) ** 2)[live] / expected[live]).sum())
    df = int(live.sum()) - 1
    assert abs(chi2 - df) < 4 * np.sqrt(2 * df), (chi2, df)  # ~4 sigma of the chi-square's spread
    heavy = np.concatenate(weights) == 4.0
    assert observed[heavy].sum() / size == pytest.approx(expected[heavy].sum() / size, abs=0.01)


def test_weighted_epochs_differ_and_equal_batches_per_rank_without_padding() -> None:
    counts = [30, 5, 50, 17, 8, 40]
    weights, totals = _weights(counts, 2)
    spec = Spec(counts=np.array(counts), batch_size=8, seed=4, totals=totals, epoch_size=333)
    one, two = plan_epoch(spec, (2, 2), 0), plan_epoch(spec, (2, 2), 1)
    assert one.batches_per_rank == sum(r.budget for r in one.readers[1])
    assert _all(one, weights) != _all(two, weights)
    assert sum(len(x) for x in _yields(one, weights).values()) == one.batches_per_rank * 8 * 2  # full batches


def test_extreme_finite_weights_draw_by_their_ratio() -> None:
    """Weights of 1e308 and 1e-320 (valid: finite, >= 0) neither overflow nor vanish: the draws follow their ratio."""
    counts = [3, 3, 3]
    totals = np.array([1e308, 1e308, 1e-320])
    spec = Spec(counts=np.array(counts), batch_size=4, seed=1, totals=totals, epoch_size=1000, pad_last=True)
    weights = [np.array([1e308, 0.0, 0.0]), np.array([5e307, 5e307, 0.0]), np.array([1e-320, 0.0, 0.0])]
    got = Counter(_all(plan_epoch(spec, (1,), 0), weights))
    assert sum(got.values()) == 1000 and got[2, 0] == 0
    assert 400 < got[0, 0] < 600 and 150 < got[1, 0] < 350 and 150 < got[1, 1] < 350


def test_a_history_on_the_wrong_topology_is_refused() -> None:
    spec = Spec(counts=np.array([10, 10, 10]), batch_size=2, pad_last=True)
    with pytest.raises(ValueError, match="segment 0"):
        plan_epoch(spec, (1,), 0, [Segment((2,), ((0,), (0,)))])
    with pytest.raises(ValueError, match="beyond its budget"):
        plan_epoch(spec, (1,), 0, [Segment((1,), ((99,),))])


@settings(max_examples=60, deadline=None)
@given(counts_st, topology_st, st.integers(0, 500), st.booleans())
def test_a_resampled_reader_resumes_at_the_item_it_stopped(
    counts: list[int], topology: tuple[int, ...], items: int, weighted: bool
) -> None:
    if sum(counts) < sum(topology):
        return
    weights, totals = _weights(counts, 7)
    if weighted and totals.sum() <= 0:
        return
    spec = Spec(counts=np.array(counts), batch_size=1, seed=2, totals=totals if weighted else None)
    rank, worker = len(topology) - 1, topology[-1] - 1
    if not any(p.count for p in reader_share(spec, topology, rank, worker)):
        with pytest.raises(TopologyError, match="only empty shards"):
            next(Passes(spec, topology, rank, worker)())
        return

    def stream(start: int, n: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for piece in Passes(spec, topology, rank, worker, start)():
            out += _items(piece, weights)
            if len(out) >= n:
                return out[:n]
        raise AssertionError("an endless stream ended")

    whole = stream(0, items + 20)
    assert stream(items, 20) == whole[items:]


@settings(max_examples=60, deadline=None)
@given(counts_st, topology_st, st.integers(0, 3))
def test_resampled_readers_share_out_every_pass(counts: list[int], topology: tuple[int, ...], pass_index: int) -> None:
    """Pass ``p`` of every reader together: each sample once (readers own disjoint shares, also of a shard split
    over them: each reader keeps its own slice of it, pass after pass), whatever their passes' orders."""
    if sum(counts) < sum(topology):
        return
    spec = Spec(counts=np.array(counts), batch_size=1, seed=2, stream_seed=11)
    got: list[tuple[int, int]] = []
    for rank, workers in enumerate(topology):
        for worker in range(workers):
            mine = reader_share(spec, topology, rank, worker)
            got += [i for p in reader_pass(spec, mine, rank, worker, pass_index) for i in _items(p, None)]
    assert Counter(got) == _expected_items(counts)


def test_the_shuffle_depends_on_the_count_and_seed_only() -> None:
    a = list(shuffled(range(100), 16, (1, 2)))
    assert sorted(a) == list(range(100)) and a != list(range(100))
    assert [x * 2 for x in a] == list(shuffled((x * 2 for x in range(100)), 16, (1, 2)))


def _pass_items(
    spec: Spec, topology: tuple[int, ...], rank: int, worker: int, p: int, weights: list[np.ndarray] | None
) -> list[tuple[int, int]]:
    mine = reader_share(spec, topology, rank, worker)
    return [item for piece in reader_pass(spec, mine, rank, worker, p) for item in _items(piece, weights)]


def test_readers_sharing_a_shard_in_resampled_mode_read_different_samples_each_pass() -> None:
    """Review of the merged planner: with fewer shards than readers, a weighted visit of a shard split over readers
    took the shard's shared seed, so all 4 readers drew the same samples in the same order, every pass; unweighted,
    each reader keeps its own slice of the shard (disjoint from the others') every pass."""
    weights, totals = _weights([50], 3)
    topology = (2, 2)
    for spec, w in (
        (Spec(counts=np.array([50]), batch_size=4, seed=1, totals=totals), weights),
        (Spec(counts=np.array([50]), batch_size=4, seed=1), None),
    ):
        readers = [(r, k) for r in range(2) for k in range(2)]
        first = [_pass_items(spec, topology, r, k, 0, w) for r, k in readers]
        assert all(first) and len({tuple(x) for x in first}) == 4  # no two readers alike
        if w is None:  # unweighted: disjoint slices of one order, the same slices every pass
            assert len(set().union(*map(set, first))) == sum(map(len, first))
            assert set(_pass_items(spec, topology, 0, 0, 1, w)) == set(first[0])
        else:  # weighted: each visit draws anew
            assert _pass_items(spec, topology, 0, 0, 1, w) != first[0]
