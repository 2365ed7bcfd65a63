"""Pure tests of the balanced deal and the batch budgets the planner uses, and of World (no I/O, no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from wsishard.streaming.partition import batch_budgets, deal
from wsishard.streaming.world import World

# ---- World and topology -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"world_size": 0}, "0"),
        ({"rank": 2, "world_size": 2}, "2"),
        ({"num_workers": -1}, "-1"),
        ({"worker": 3, "num_workers": 3}, "3"),
    ],
)
def test_world_validation_names_the_bad_value(kwargs: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        World(**kwargs)


def test_world_is_frozen_and_with_worker_keeps_rank() -> None:
    world = World(rank=1, world_size=4)
    assert world.with_worker(2, 3) == World(rank=1, world_size=4, worker=2, num_workers=3)
    assert (w := world.with_worker(2, 3)).world_size * w.num_workers == 12 and w.worker == 2
    with pytest.raises(AttributeError):
        world.rank = 0  # type: ignore[misc]


# ---- the deal and the order -------------------------------------------------------------------------------


def test_deal_is_a_permutation_with_balanced_bins() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        counts, bins = rng.integers(0, 100, int(rng.integers(1, 50))), int(rng.integers(1, 9))
        order = deal(counts, bins, np.random.default_rng(1))
        assert sorted(order.tolist()) == list(range(len(counts)))
        totals = [counts[order[b::bins]].sum() for b in range(bins)]
        assert max(totals) - min(totals) <= counts.max()
        sizes = [len(order[b::bins]) for b in range(bins)]  # the islice shape: sizes differ by at most 1
        assert max(sizes) - min(sizes) <= 1


# ---- budgets and the epoch plan ---------------------------------------------------------------------------


def _reference_budgets(samples: np.ndarray, b: int, drop_last: bool) -> np.ndarray:
    """One batch at a time: cut a short last batch (smallest first), then the fullest worker's last batch."""
    full, rem = samples // b, samples % b
    budgets = full + ((rem > 0) & (not drop_last))
    target = budgets.sum(axis=1).min()
    for r in range(len(samples)):
        while budgets[r].sum() > target:
            short = [w for w in range(samples.shape[1]) if not drop_last and budgets[r, w] > full[r, w]]
            w = min(short, key=lambda w: rem[r, w]) if short else int(np.argmax(budgets[r]))
            budgets[r, w] -= 1
    return budgets


def test_budgets_match_a_one_at_a_time_reference() -> None:
    rng = np.random.default_rng(3)
    for _ in range(500):
        samples = rng.integers(0, 80, (int(rng.integers(1, 6)), int(rng.integers(1, 5))))
        b, drop_last = int(rng.integers(1, 12)), bool(rng.integers(2))
        got = batch_budgets(samples, batch_size=b, drop_last=drop_last)
        want = _reference_budgets(samples, b, drop_last)
        assert np.array_equal(got.sum(axis=1), want.sum(axis=1))
        assert np.array_equal(np.sort(got, axis=1), np.sort(want, axis=1))  # equally level
        assert np.minimum(got * b, samples).sum() == np.minimum(want * b, samples).sum()
