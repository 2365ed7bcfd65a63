"""Shared pytest fixtures, visible in every test folder (unit/, integration/, distributed/ and the top level).

Everything here is made once per session and is read-only for the tests that use it: a test that changes an
output makes its own (``sm.make_output(tmp_path / ...)``, ``build(..., tmp_path / ...)``).

- ``synthetic_slides``/``slide_dir``: four generated slides, 4096x3072 px at 0.25 mpp (levels 4096x3072,
  1024x768, 256x192). Width and height differ on purpose, to catch swapped axes.
- ``cohort``/``cohort_build``: eight 3072x3072 slides and their build with :data:`buildtools.SMALL_BUILD`
  (64 px patches, 25 samples per shard, groups of 3 slides: dozens of shards in three groups).
- ``stream_out``: eight hand-made shards of 16 px noise patches with uneven counts (:data:`streamtools.COUNTS`).

The helper modules beside this file (``buildtools``, ``shardmaker``, ``streamtools``; ``servers`` through
``pytest_plugins``) import from any test folder (``pythonpath`` in pyproject.toml). The fixtures import them when
they run, so collecting a test file that needs none of them imports neither torch nor webdataset.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from wsishard.testing.synthetic import SyntheticSlide, make_slides

if TYPE_CHECKING:
    from shardmaker import Output

SLIDE_WIDTH = 4096
SLIDE_HEIGHT = 3072
SLIDE_MPP = 0.25


@pytest.fixture(scope="session")
def synthetic_slides(tmp_path_factory: pytest.TempPathFactory) -> list[SyntheticSlide]:
    """Four generated slides: ``slide-000.svs``, ``slide-001.tif``, ``slide-002.svs``, ``slide-003.tif``.

    4096x3072 px at 0.25 mpp, tissue fraction 0.3, with dust; seeded from (0, i). Treat as read-only.
    """
    folder = tmp_path_factory.mktemp("slides")
    return make_slides(folder, 4, seed=0, width=SLIDE_WIDTH, height=SLIDE_HEIGHT, mpp=SLIDE_MPP)


@pytest.fixture(scope="session")
def slide_dir(synthetic_slides: list[SyntheticSlide]) -> Path:
    """The folder holding :func:`synthetic_slides` (nothing else is in it). Treat as read-only."""
    return Path(synthetic_slides[0].path).parent


@pytest.fixture(scope="session")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of eight generated slides (3072x3072 px at 0.25 mpp, svs and tif alternating, seed 21).

    Read-only: builds read it, resume and S3 tests build it again into their own outputs.
    """
    folder = tmp_path_factory.mktemp("cohort")
    make_slides(folder, 8, seed=21, width=3072, height=3072)
    return folder


@pytest.fixture(scope="session")
def cohort_build(cohort: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`cohort` built uninterrupted, in one call, with :data:`buildtools.SMALL_BUILD`. Read-only: the
    reference that resumed, part/merge and object-storage builds of the same slides must equal."""
    from buildtools import SMALL_BUILD

    from wsishard.builder.run.orchestrate import build

    out = tmp_path_factory.mktemp("cohort-build") / "out"
    manifest = build([str(cohort)], str(out), SMALL_BUILD)
    assert len(manifest.slides) == 8 and not manifest.failed_slides
    return out


@pytest.fixture(scope="session")
def stream_out(tmp_path_factory: pytest.TempPathFactory) -> Output:
    """Hand-made shards for the stream tests: ``len(COUNTS)`` shards of ``COUNTS[i]`` labelled 16 px jpg
    patches (:func:`shardmaker.make_output`, seed 0). Read-only: a test that breaks shards makes its own."""
    import shardmaker as sm
    from streamtools import COUNTS

    return sm.make_output(str(tmp_path_factory.mktemp("stream") / "out"), COUNTS)


@pytest.fixture
def small_output(tmp_path: Path) -> Output:
    """A fresh four-shard output of hand-made samples (:data:`shardmaker.SMALL_COUNTS`), for a test to damage."""
    import shardmaker as sm

    return sm.make_output(str(tmp_path / "out"), sm.SMALL_COUNTS)
