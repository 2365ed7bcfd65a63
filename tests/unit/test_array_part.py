"""The default ``--part`` of an array-job task, from its engine's environment (Slurm, Kubernetes, AWS Batch)."""

from __future__ import annotations

import re

import pytest

from wsishard.builder.plan.parts import array_part
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
def test_an_index_without_a_count_or_outside_it_is_refused(
    environ: dict[str, str], parts: int | None, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        array_part(environ, parts)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3"}, "SLURM_ARRAY_TASK_ID=7 is not one of its 3 task"),
        (
            {
                "SLURM_ARRAY_TASK_ID": "5",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_ARRAY_TASK_MAX": "7",
            },
            "not an evenly spaced range (--array=0,5,7?)",
        ),
        (
            {
                "SLURM_ARRAY_TASK_ID": "0",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_ARRAY_TASK_MAX": "7",
            },
            "not an evenly spaced range",
        ),  # its first task too: no part is built twice
        ({"SLURM_ARRAY_TASK_ID": "abc", "SLURM_ARRAY_TASK_COUNT": "3"}, "SLURM_ARRAY_TASK_ID='abc' is not an integer"),
        ({"SLURM_ARRAY_TASK_ID": "1"}, "without its task id and count"),
    ],
)
def test_a_slurm_task_that_is_no_part_of_its_array_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        array_part(environ)


def test_a_slurm_array_with_a_step_numbers_its_tasks_in_order() -> None:
    steps = {
        "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "1",
        "SLURM_ARRAY_TASK_MAX": "7",
        "SLURM_ARRAY_TASK_STEP": "2",
    }
    assert [array_part({**steps, "SLURM_ARRAY_TASK_ID": str(t)}) for t in (1, 3, 5, 7)] == [
        (i, 4) for i in (1, 2, 3, 4)
    ]
    with pytest.raises(OptionError, match="SLURM_ARRAY_TASK_ID=4 is not one of its 4 task ids"):
        array_part({**steps, "SLURM_ARRAY_TASK_ID": "4"})
