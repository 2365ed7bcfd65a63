"""A build of a slide with melanin: the pigment is kept, each sample's ``.json`` says how much of it is dark pigment
(so training can leave out dark patches instead of the build), and the slide record reports the area kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from buildtools import Sample, read_output

from wsishard.cli import main
from wsishard.manifest import Manifest
from wsishard.shards.index import index_name, load_index
from wsishard.testing.artefacts import patch_fractions
from wsishard.testing.synthetic import SyntheticSlide, make_slide

ARGS = ("--mpp", "1", "--patch-size", "128", "--jobs", "1", "--no-qc", "-q")


@pytest.fixture(scope="module")
def melanin(tmp_path_factory: pytest.TempPathFactory) -> SyntheticSlide:
    folder = tmp_path_factory.mktemp("melanin")
    return make_slide(folder / "melanin.svs", width=2560, height=2560, mpp=1.0, seed=2, pigments=("melanin",))


def _build(slide: SyntheticSlide, out: Path, *extra: str) -> tuple[Manifest, list[Sample]]:
    assert main(["build", slide.path, "-o", str(out), *ARGS, *extra]) == 0
    return read_output(str(out))


def test_samples_carry_a_pigment_score_where_the_pigment_is(melanin: SyntheticSlide, tmp_path: Path) -> None:
    manifest, samples = _build(melanin, tmp_path / "out")
    assert melanin.pigment is not None
    x = np.array([s.meta["x"] for s in samples])
    y = np.array([s.meta["y"] for s in samples])
    truth = patch_fractions(melanin.pigment, melanin.mask_downsample, x, y, 128)
    score = np.array([s.meta["pigment"] for s in samples])
    for s in samples:  # the fields that were there before are still there
        assert {"tissue", "background", "dark", "sharpness", "pigment"} <= set(s.meta)
    assert ((score >= 0) & (score <= 1)).all()
    assert (truth >= 0.5).sum() >= 5 and (score[truth >= 0.5] > 0).all()  # its darkest part is dark pigment
    assert (score[truth == 0] == 0).mean() > 0.95  # no pigment: none found (a view px may straddle)
    record = manifest.slides[0]
    assert record.pigment_mm2 > 0.02 and record.artefact_mm2 < record.pigment_mm2 / 4  # dust specks aside
    indexed = {}  # the per-sample index carries the same score, for select= without reading a shard
    for shard in manifest.shards:
        index = load_index((tmp_path / "out" / index_name(shard.name)).read_bytes())
        indexed.update(zip(index.key.astype(str), index.columns["pigment"].tolist(), strict=True))
    assert indexed == pytest.approx({s.key: s.meta["pigment"] for s in samples})


def test_pigment_as_artefact_restores_the_old_rule(melanin: SyntheticSlide, tmp_path: Path) -> None:
    manifest, new = _build(melanin, tmp_path / "new")
    old, old_samples = _build(melanin, tmp_path / "old", "--dark-pigment-as-artefact")
    assert len(old_samples) < len(new)
    assert old.slides[0].pigment_mm2 == 0 and old.slides[0].artefact_mm2 > manifest.slides[0].pigment_mm2
    assert all(s.meta["pigment"] == 0 for s in old_samples)
