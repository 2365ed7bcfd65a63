"""Start-up: the ``wsishard`` command parses its flags before it loads the libraries that do the work.

``wsishard --help`` and ``import wsishard.cli`` load numpy and Pillow (the option dataclasses' modules use them) but
none of the heavy imaging, storage or progress libraries: those load when a command runs. Checked in a fresh
interpreter, by the modules loaded, never by a clock.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("scipy", "skimage", "cv2", "openslide", "tifffile", "imagecodecs", "fsspec", "tqdm", "torch", "webdataset")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "import wsishard.cli",
        "import wsishard.cli as c\ntry:\n    c.main(['build', '--help'])\nexcept SystemExit:\n    pass",
    ],
)
def test_the_cli_starts_without_the_heavy_libraries(code: str) -> None:
    assert not _loaded_after(code) & set(HEAVY)


def test_a_slide_reader_still_loads_its_backend_on_first_use() -> None:
    """The slide package's backends are imported when named (``wsishard.slide.OpenSlideReader``) or opened."""
    loaded = _loaded_after(
        "import wsishard.slide as s\nassert s.TiffTileReader.backend == 'tifffile'\n"
        "assert s.OpenSlideReader.backend == 'openslide'"
    )
    assert {"tifffile", "openslide"} <= loaded


def test_a_build_loads_what_its_workers_scan_with_before_it_forks_them() -> None:
    """``wsishard.builder.run`` (a build's process, before its pool forks) has loaded every library a worker's
    scan and reads use, so that forked workers inherit them instead of each importing them again."""
    loaded = _loaded_after("import wsishard.builder.run")
    assert {"scipy", "skimage", "cv2", "openslide", "tifffile", "imagecodecs"} <= loaded
    probe = "import wsishard.builder.run, sys\nprint(sorted(m for m in sys.modules if m.startswith('skimage.filters')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "skimage.filters.rank" in out
