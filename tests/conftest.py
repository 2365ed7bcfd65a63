"""Shared pytest fixtures.

Slides are generated once per session with :mod:`wsishard.synthetic` and kept small (4096x3072 px at
0.25 mpp: levels 4096x3072, 1024x768, 256x192) so the suite stays fast. Width and height differ on purpose,
to catch swapped axes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from wsishard.testing.synthetic import SyntheticSlide, make_slides

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
