"""The pure sampling functions: padded epochs, weighted draws, their resume, weights from counts."""

from __future__ import annotations

import numpy as np
import pytest

from wsishard.streaming import sampling


def test_class_and_mapping_and_slide_weights() -> None:
    labels, counts = np.array([0, 1]), np.array([800, 200])
    w = sampling.label_weights(labels, counts, "class")
    assert (counts * w).tolist() == pytest.approx([1.0, 1.0])  # each label the same total
    assert sampling.label_weights(labels, counts, {1: 2.0}).tolist() == [0.0, 1.0]  # relative: the largest 1
    assert sampling.label_weights(labels, counts, {0: 1e308, 1: 4e307}).tolist() == pytest.approx([1.0, 0.4])
    assert sampling.inverse(np.array([4, 0, 2])).tolist() == [0.25, 0.0, 0.5]
    assert sampling.csr_totals(np.array([0, 2, 2, 5]), np.arange(5.0)).tolist() == [1.0, 0.0, 9.0]


def test_log_totals_keep_the_ratios_of_finite_extremes() -> None:
    """Issue 42: a sum of weights of 1e308 overflowed to inf (then NaN draws); 1e-320 each lost the ratios."""
    logs = np.array([sampling.log_total(np.full(1000, 1e308)), sampling.log_total(np.full(500, 1e308)), -np.inf])
    assert sampling.from_log_totals(logs).tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert sampling.from_log_totals(np.array([sampling.log_total(np.full(4, 1e-320)), np.log(8e-320)])).tolist() == (
        pytest.approx([0.5, 1.0], rel=1e-3)
    )
    assert sampling.from_log_totals(np.array([-np.inf, -np.inf])).tolist() == [0.0, 0.0]


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
