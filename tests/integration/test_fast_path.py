"""The tile fast path against ``--no-fast-path`` at a real scanner's mpp (0.2520 to 0.5: stage 1 reduces 2 times):
the same patches, nearly (not exactly) the same pixels and scores, as building.md says."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from buildtools import read_output
from PIL import Image

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.patchopts import PatchOptions
from wsishard.builder.run.orchestrate import build
from wsishard.testing.synthetic import make_slides

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = BuildOptions(patch=PatchOptions(patch_size_px=256, target_mpp=0.5), image_format="png", jobs=1, qc=False)


def test_both_paths_keep_the_same_patches_with_nearly_the_same_pixels(tmp_path: Path) -> None:
    make_slides(tmp_path / "in", 1, seed=4, width=6144, height=6144, mpp=0.2520, kinds=("svs",))
    outputs = {}
    for fast in (True, False):
        manifest = build(
            [str(tmp_path / "in")], str(tmp_path / f"out-{fast}"), dataclasses.replace(OPTIONS, fast_path=fast)
        )
        outputs[fast] = (manifest, {s.key: s for s in read_output(str(tmp_path / f"out-{fast}"))[1]})
    (fast_manifest, fast), (slow_manifest, slow) = outputs[True], outputs[False]
    assert sorted(fast) == sorted(slow) and len(fast) > 20  # the same patches: the scan does not depend on the path
    assert [s.name for s in fast_manifest.shards] == [s.name for s in slow_manifest.shards]
    diffs, scores = [], []
    for key, sample in fast.items():
        a = np.asarray(Image.open(io.BytesIO(sample.members["png"])), dtype=np.int16)  # (256, 256, 3)
        b = np.asarray(Image.open(io.BytesIO(slow[key].members["png"])), dtype=np.int16)
        diffs.append(np.abs(a - b).mean())
        scores.append([sample.meta[n] - slow[key].meta[n] for n in ("background", "dark")])
        assert sample.meta["sharpness"] == pytest.approx(slow[key].meta["sharpness"], rel=0.1)
    assert 0 < float(np.mean(diffs)) < 1.0  # libjpeg's 1/2 DCT scaling against a 2x2 mean: close, not equal
    assert float(np.abs(scores).max()) < 0.01  # so a quality filter's threshold can flip a patch or two
    guide = (ROOT / "docs" / "guide" / "building.md").read_text()
    assert "nearly the same pixels" in guide and "both give the same pixels" not in guide
