"""The build's catch-all boundary (:class:`wsishard.errors.SlideFailure`): a slide's own failure is recorded, a
shortage of the machine (file descriptors, memory, disk space) is not: it stops the build (issue 28, item 12)."""

from __future__ import annotations

import errno
import os
import pickle

import numpy as np
import pytest

from wsishard.errors import OutputError, ResourceError, SlideError, SlideFailure


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (OSError(errno.EMFILE, os.strerror(errno.EMFILE), "a.svs"), "too many open files in this process"),
        (OSError(errno.ENFILE, os.strerror(errno.ENFILE)), "too many open files on this machine"),
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/scratch/x.bin"), "no space left"),
        (OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)), "out of memory"),
        (MemoryError(), "out of memory"),
        (SlideError("a.svs", "OpenSlide cannot open it (Couldn't open a.svs: Too many open files)"), "too many open"),
    ],
)
def test_a_shortage_of_the_machine_stops_instead_of_failing_the_slide(exc: Exception, words: str) -> None:
    with pytest.raises(ResourceError) as info, SlideFailure("a.svs"):
        raise exc
    assert info.value.location == "a.svs" and words in info.value.reason and "\n" not in str(info.value)
    assert "run the build again" in info.value.reason
    again = pickle.loads(pickle.dumps(info.value))  # it crosses from a worker process to the build's
    assert (type(again), again.location, again.reason) == (ResourceError, "a.svs", info.value.reason)


def test_an_array_larger_than_the_machine_is_the_slides_failure() -> None:
    with SlideFailure("huge.svs") as failure:
        np.empty((2**40, 2**20), dtype=np.uint8)  # 1 EiB: what a slide whose tags claim an absurd size asks for
    assert failure.reason is not None and "MemoryError" in failure.reason


@pytest.mark.parametrize(
    "exc", [OSError(errno.EIO, "Input/output error"), ValueError("bad tag"), SlideError("a.svs", "no tissue found")]
)
def test_a_slides_own_failure_is_recorded(exc: Exception) -> None:
    with SlideFailure("a.svs") as failure:
        raise exc
    assert failure.reason


def test_output_and_resource_errors_pass_through() -> None:
    for exc in (OutputError("out/x", "read-only"), ResourceError("a.svs", "out of memory")):
        with pytest.raises(type(exc)), SlideFailure("a.svs"):
            raise exc
