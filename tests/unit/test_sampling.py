"""The pure sampling functions: padded epochs, weighted draws, their resume, weights from counts."""

from __future__ import annotations

import numpy as np
import pytest

from wsishard.streaming import sampling
from wsishard.streaming.partition import plan_epoch


@pytest.mark.parametrize(
    ("counts", "world", "workers", "batch"),
    [
        ((706,), 2, 2, 64),
        ((10, 7, 12, 5, 9), 2, 2, 4),
        ((3, 1, 1), 3, 1, 8),
        ((40, 1, 1, 1), 2, 2, 16),
    ],
)
def test_a_padded_plan_reads_every_sample_and_gives_every_rank_the_same_batches(counts, world, workers, batch) -> None:
    plan = sampling.pad_plan(
        plan_epoch(
            np.array(counts), world_size=world, num_workers=workers, batch_size=batch, seed=3, epoch=0, drop_last=False
        )
    )
    assert np.array_equal(plan.kept, plan.samples) and int(plan.kept.sum()) == sum(counts)
    assert np.all(plan.budgets * batch >= plan.samples)  # room for every sample of each worker
    assert set(plan.budgets.sum(axis=1).tolist()) == {plan.batches_per_rank}
    assert sampling.dropped_message(plan) is None


def test_the_drop_message_counts_what_an_unpadded_epoch_drops() -> None:
    plan = plan_epoch(np.array([706]), world_size=2, num_workers=2, batch_size=64, seed=0, epoch=0)
    message = sampling.dropped_message(plan)
    assert message is not None
    assert f"reads {int(plan.kept.sum())} of 706" in message and "pad_last=True" in message
    assert f"({plan.batches_per_rank} batches of 64 samples) with 2 rank(s)" in message  # not "5 of 64"


def test_draws_follow_the_weights() -> None:
    rng = np.random.default_rng(0)
    counts = sampling.draw_counts(np.array([1.0, 3.0, 0.0, 4.0]), 80_000, rng)
    assert counts[2] == 0 and counts.sum() == 80_000
    assert np.allclose(counts / 80_000, [1 / 8, 3 / 8, 0, 4 / 8], atol=0.01)
    assert sampling.draw_counts(np.zeros(3), 5, rng).tolist() == [0, 0, 0]


def test_visit_counts_round_at_random_to_their_expectation() -> None:
    got = [sampling.visit_count(2.25, sampling.visit_rng(1, 0, 0, p)) for p in range(4000)]
    assert set(got) == {2, 3} and abs(np.mean(got) - 2.25) < 0.03


@pytest.mark.parametrize("samples", [0, 1, 17, 40, 41, 333])
def test_a_weighted_resume_lands_where_replaying_the_visits_does(samples: int) -> None:
    expected = np.array([3.7, 0.4, 8.0, 1.2])
    position, skip = sampling.weighted_resume(expected, samples, seed=9, rank=1, worker=0)
    done, p = 0, 0  # replay visit by visit, as the reader yields them
    while True:
        order = sampling.resample_order(4, seed=9, rank=1, worker=0, pass_index=p // 4)
        n = sampling.visit_count(float(expected[order[p % 4]]), sampling.visit_rng(9, 1, 0, p))
        if done + n > samples:
            break
        done, p = done + n, p + 1
    assert (position, skip) == (p, samples - done)
    assert 0 <= skip < max(1, int(np.ceil(expected.max())) + 1)


def test_expected_draws_make_a_pass_as_long_as_its_samples() -> None:
    e = sampling.expected_draws(np.array([2.0, 6.0]), np.array([10, 30]))
    assert e.sum() == pytest.approx(40) and e[1] / e[0] == pytest.approx(3)


def test_class_and_mapping_and_slide_weights() -> None:
    labels, counts = np.array([0, 1]), np.array([800, 200])
    w = sampling.label_weights(labels, counts, "class")
    assert (counts * w).tolist() == pytest.approx([1.0, 1.0])  # each label the same total
    assert sampling.label_weights(labels, counts, {1: 2.0}).tolist() == [0.0, 1.0]  # relative: the largest 1
    assert sampling.label_weights(labels, counts, {0: 1e308, 1: 4e307}).tolist() == pytest.approx([1.0, 0.4])
    assert sampling.inverse(np.array([4, 0, 2])).tolist() == [0.25, 0.0, 0.5]
    assert sampling.csr_totals(np.array([0, 2, 2, 5]), np.arange(5.0)).tolist() == [1.0, 0.0, 9.0]


def test_log_totals_and_draws_keep_the_ratios_of_finite_extremes() -> None:
    """Issue 42: a sum of weights of 1e308 overflowed to inf (then NaN draws); 1e-320 each lost the ratios."""
    logs = np.array([sampling.log_total(np.full(1000, 1e308)), sampling.log_total(np.full(500, 1e308)), -np.inf])
    assert sampling.from_log_totals(logs).tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert sampling.from_log_totals(np.array([sampling.log_total(np.full(4, 1e-320)), np.log(8e-320)])).tolist() == (
        pytest.approx([0.5, 1.0], rel=1e-3)
    )
    assert sampling.from_log_totals(np.array([-np.inf, -np.inf])).tolist() == [0.0, 0.0]
    rng = np.random.default_rng(0)
    counts = sampling.draw_counts(np.array([1e308, 1e308, 0.0]), 10_000, rng)
    assert counts.sum() == 10_000 and counts[2] == 0 and abs(counts[0] - 5_000) < 300


def test_proportions_scale_each_source_to_its_share() -> None:
    scales = sampling.proportion_scales([10.0, 30.0], [0.7, 0.3])
    assert (scales * [10.0, 30.0]).tolist() == pytest.approx([0.7, 0.3])
    assert sampling.proportion_scales([10.0, 30.0], None).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="one finite value"):
        sampling.proportion_scales([1.0, 1.0], [0.5])
    with pytest.raises(ValueError, match="no sample with a weight"):
        sampling.proportion_scales([1.0, 0.0], [0.5, 0.5])


def test_bad_answers_of_user_functions_are_named() -> None:
    with pytest.raises(ValueError, match="bool array of 3"):
        sampling.checked_mask(np.array([1, 0, 1]), 3, "shard-x")
    with pytest.raises(ValueError, match="3 finite weights"):
        sampling.checked_weights([1.0, -1.0, 2.0], 3, "shard-x")
    with pytest.raises(ValueError, match="3 finite weights"):
        sampling.checked_weights([1.0, 2.0], 3, "shard-x")
    with pytest.raises(ValueError, match="mapping"):
        sampling.check_mapping({0: 0.0})
