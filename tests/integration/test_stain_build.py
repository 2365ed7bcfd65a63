"""The issue's normalisation test: two copies of a real slide (CMU-1), one with its haematoxylin darker and its
eosin paler, built into shards; the build records each slide's stain, and ``GpuCollate(stain=macenko)`` brings the
copies' mean H and E optical densities together."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from buildtools import read_output
from cmu import cmu_rgb, write_tiff

from wsishard import build
from wsishard.augment.stain import StainOptions, StainTable
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.scan.grid import PatchOptions
from wsishard.builder.scan.stain import IO, REFERENCE_MATRIX, macenko, optical_density
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.decode import Metas

SHIFT = np.array([1.5, 0.6])  # haematoxylin 50% darker, eosin 40% paler (their concentrations)


def _shifted(rgb: np.ndarray) -> np.ndarray:
    """``rgb`` with each pixel's H and E concentrations (on the image's own Macenko stains) scaled by SHIFT."""
    od = optical_density(rgb.reshape(-1, 3))  # (n, 3)
    matrix, _, _ = macenko(od)
    conc = np.linalg.lstsq(matrix, od.T, rcond=None)[0]  # (2, n)
    rest = od.T - matrix @ conc  # what the two stains do not explain, kept as it is
    moved = matrix @ (conc * SHIFT[:, None]) + rest
    return np.clip(IO * np.exp(-moved.T) - 1, 0, 255).round().astype(np.uint8).reshape(rgb.shape)


def _mean_he(images: np.ndarray) -> np.ndarray:
    """Mean H and E optical density of (n, h, w, 3) uint8 images on one fixed basis (the reference H&E)."""
    od = optical_density(images.reshape(-1, 3))
    return np.linalg.lstsq(np.array(REFERENCE_MATRIX), od.T, rcond=None)[0].mean(axis=1)


def _gap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / ((a + b) / 2)  # relative difference, per stain


@pytest.fixture(scope="module")
def shifted_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cmu")
    rgb = cmu_rgb()
    (folder / "slides").mkdir()
    write_tiff(str(folder / "slides" / "original.tif"), rgb, 0.499)
    write_tiff(str(folder / "slides" / "shifted.tif"), _shifted(rgb), 0.499)
    options = BuildOptions(patch=PatchOptions(patch_size_px=128), shard_samples=64, seed=3, jobs=1)
    build([str(folder / "slides")], str(folder / "out"), options)
    return folder / "out"


def test_the_recorded_stains_differ_as_the_shift_does(shifted_build: Path) -> None:
    manifest, _ = read_output(str(shifted_build))
    stains = {r.slide_id: r.stain for r in manifest.slides}
    a, b = stains["original"], stains["shifted"]
    assert a["source"] == b["source"] == "fitted" and a["pixels"] >= 2000
    h, e = np.array(b["max_conc"]) / np.array(a["max_conc"])  # darker H: more of it; paler E: less
    assert h >= 1.25 and e <= 0.8, (h, e)


def test_macenko_brings_the_shifted_copy_within_10_percent(shifted_build: Path) -> None:
    _, samples = read_output(str(shifted_build))
    by_slide = {s: [x for x in samples if x.meta["slide_id"] == s] for s in ("original", "shifted")}
    before = {s: _mean_he(np.stack([x.image() for x in xs])) for s, xs in by_slide.items()}
    assert _gap(before["original"], before["shifted"]).min() >= 0.30  # both stains differ by 30% or more

    table = StainTable.from_build(str(shifted_build))  # the build's slides.jsonl
    collate = GpuCollate("cpu", stain=StainOptions(normalize="macenko", slides=table))
    after = {}
    for slide, xs in by_slide.items():
        batch = {
            "image": torch.from_numpy(np.stack([x.image() for x in xs])),
            "label": torch.full((len(xs),), -1),
            "meta": Metas(x.members["json"] for x in xs),
            "key": [x.key for x in xs],
        }
        out = collate(batch)["image"]  # (b, 3, h, w) float in [0, 1] (mean 0, std 1)
        pixels = (out.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
        after[slide] = _mean_he(pixels)
    assert _gap(after["original"], after["shifted"]).max() <= 0.10
