"""Aperio JPEG 2000 slides (compression 33005): tiles decoded directly, full size and at reduced resolution."""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.grid import PatchOptions
from wsishard.slide import OpenSlideReader, TiffTileReader, open_slide
from wsishard.testing.synthetic import make_slide


@pytest.fixture(scope="module")
def jp2k(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("jp2k") / "old-tcga.svs"
    make_slide(path, width=2048, height=1536, seed=4, codec="jp2k", tissue_fraction=0.4)
    return str(path)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def test_the_fast_path_decodes_jpeg2000_tiles_to_openslides_pixels(jp2k: str) -> None:
    with open_slide(jp2k) as fast, OpenSlideReader(jp2k) as ref:
        assert isinstance(fast, TiffTileReader)
        assert fast.level_dimensions == ref.level_dimensions
        for level, (x, y, w, h) in ((0, (300, 200, 900, 700)), (1, (10, 20, 400, 300))):
            assert np.array_equal(fast.read_level(level, x, y, w, h), ref.read_level(level, x, y, w, h))


def test_reduced_resolution_decoding_is_close_to_full_decoding_and_a_box_filter(jp2k: str) -> None:
    with open_slide(jp2k) as fast:
        full = fast.read_level(0, 512, 256, 1024, 1024)  # (1024, 1024, 3)
        reduced = fast.read_level_reduced(0, 512, 256, 1024, 1024, 2)  # type: ignore[attr-defined]
    assert reduced is not None and reduced.shape == (512, 512, 3)
    assert _psnr(reduced, np.asarray(Image.fromarray(full).reduce(2))) > 38.0  # OpenJPEG's low-pass, not a box


def test_a_jpeg2000_build_matches_the_openslide_build(jp2k: str, tmp_path: Path) -> None:
    opts = BuildOptions(patch=PatchOptions(patch_size_px=128), jobs=1, qc=False)
    fast = build([jp2k], str(tmp_path / "fast"), opts)
    slow = build([jp2k], str(tmp_path / "slow"), BuildOptions(patch=opts.patch, jobs=1, qc=False, fast_path=False))
    assert fast.total_samples == slow.total_samples > 20 and not fast.failed_slides
    a, b = _images(tmp_path / "fast"), _images(tmp_path / "slow")
    assert a.keys() == b.keys()
    assert min(_psnr(a[k], b[k]) for k in a) > 33.0  # both JPEG q90 of a 2x reduction: OpenJPEG's vs a box filter


def _images(root: Path) -> dict[str, np.ndarray]:
    out = {}
    with tarfile.open(root / "shard-000000-0000.tar") as tar:
        for member in tar:
            fh = tar.extractfile(member)
            if member.name.endswith(".jpg") and fh is not None:
                out[member.name] = np.asarray(Image.open(io.BytesIO(fh.read())))
    return out
