"""The default ``--part`` of an array-job task, from its engine's environment (Slurm, Kubernetes, AWS Batch)."""

from __future__ import annotations

import pytest

from wsishard.builder.parts import array_part
from wsishard.errors import OptionError


def test_each_engine_gives_a_one_based_part() -> None:
    assert array_part({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "1"}) == (
        5,
        8,
    )
    assert array_part({"JOB_COMPLETION_INDEX": "0"}, parts=4) == (1, 4)
    assert array_part({"JOB_COMPLETION_INDEX": "3"}, parts=4) == (4, 4)
    assert array_part({"AWS_BATCH_JOB_ARRAY_INDEX": "2", "AWS_BATCH_JOB_ARRAY_SIZE": "10"}) == (3, 10)
    assert array_part({"AWS_BATCH_JOB_ARRAY_INDEX": "2"}, parts=3) == (3, 3)
    assert array_part({}) is None and array_part({"HOME": "/root"}, parts=4) is None


@pytest.mark.parametrize(
    ("environ", "parts", "message"),
    [
        ({"JOB_COMPLETION_INDEX": "1"}, None, "pass --part-count N"),
        ({"JOB_COMPLETION_INDEX": "4"}, 4, "is not a task of 4"),
        ({"JOB_COMPLETION_INDEX": "x"}, 4, "not an integer"),
        ({"AWS_BATCH_JOB_ARRAY_INDEX": "1", "AWS_BATCH_JOB_ARRAY_SIZE": "3"}, 5, "--part-count 5, but an AWS Batch"),
        ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4"}, 2, "--part-count 2, but a Slurm"),
    ],
)
def test_an_index_without_a_count_or_outside_it_is_refused(environ: dict[str, str], parts: int | None,
                                                           message: str) -> None:  # fmt: skip
    with pytest.raises(OptionError, match=message):
        array_part(environ, parts)
