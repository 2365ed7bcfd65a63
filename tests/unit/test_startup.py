"""Start-up: the ``wsishard`` command parses its flags before it loads the libraries that do the work.

``wsishard --help`` and ``import wsishard.cli`` load none of the imaging, array, storage or progress libraries (the
option dataclasses live in modules of plain Python): those load when a command runs. Checked in a fresh
interpreter, by the modules loaded, never by a clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = (
    "numpy",
    "PIL",
    "scipy",
    "skimage",
    "cv2",
    "openslide",
    "tifffile",
    "imagecodecs",
    "fsspec",
    "tqdm",
    "torch",
    "webdataset",
)


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
    """``wsishard.builder.run.orchestrate`` (a build's process, before its pool forks) has loaded every library a
    worker's scan and reads use, so that forked workers inherit them instead of each importing them again; SciPy and
    scikit-image are not among them (the scan's median, labels and Otsu are the package's own)."""
    loaded = _loaded_after("import wsishard.builder.run.orchestrate")
    assert {"cv2", "openslide", "tifffile", "imagecodecs"} <= loaded
    assert not {"scipy", "skimage"} & loaded


def test_a_default_build_never_loads_scipy_or_scikit_image(tmp_path: Path) -> None:
    """A whole default build (scan, tissue, artefacts, pigment, patches, shards) in a fresh interpreter: the
    0.5 s those two cost at start-up is not paid later either."""
    from wsishard.testing.synthetic import make_slide

    slide = tmp_path / "s.svs"
    make_slide(slide, width=4096, height=3072, seed=5, tissue_fraction=0.3)
    loaded = _loaded_after(
        "from wsishard.builder.run.orchestrate import build\n"
        "from wsishard.builder.options.buildopts import BuildOptions\n"
        f"m = build([{str(slide)!r}], {str(tmp_path / 'out')!r}, BuildOptions(jobs=1))\nassert m.total_samples > 0"
    )
    assert "wsishard" in loaded
    assert not {"scipy", "skimage"} & loaded
