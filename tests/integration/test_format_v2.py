"""Outputs of format version 2, written by wsishard 0.2.0's own code (``tests/data/format-v2``, see its README), under
this version (3: each microns per pixel named by whose it is): they stream the same samples, give the patch's mpp as
``patch_mpp`` too, inspect, verify, merge as version 2, and are refused, not resumed, by a build of the same slides and
options. New builds record the new names, and nothing under the old ones."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from wsishard.builder.run.merge import _join, merge
from wsishard.cli import main
from wsishard.errors import ManifestError
from wsishard.format import FORMAT_VERSION, patch_meta
from wsishard.report import details
from wsishard.shards.index import index_name, load_index
from wsishard.shards.verify import verify
from wsishard.storage.opener import load_manifest
from wsishard.streaming.sources import stream
from wsishard.testing.synthetic import make_slides

V2 = Path(__file__).parents[1] / "data" / "format-v2"
# the flags the fixture was built with (its README)
FLAGS = ("--mpp", "2.0", "--mpp-tolerance", "0.05", "--patch-size", "64", "--context-mpp", "8.0", "--quality", "60")
FLAGS += ("--shard-samples", "16", "--no-qc", "--jobs", "1", "-q")
SLIDE_MPP, PATCH_MPP = 0.504, 2.016  # the slides' level 0 and the patches (a 4x level within 0.05 of 2.0)


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(np.ascontiguousarray(t.numpy()).tobytes()).hexdigest()


def _streamed(root: Path, **kw: Any) -> list[dict[str, Any]]:
    """Each sample as ``build-stream.json`` holds what wsishard 0.2.0 streamed from the fixture."""
    out = []
    for b in stream(str(root), batch_size=4, resampled=False, shuffle=0, seed=0, drop_last=False, **kw):
        for i, key in enumerate(b["key"]):
            out.append(
                {
                    "key": key,
                    "label": int(b["label"][i]),
                    "image_sha256": _sha(b["image"][i]),
                    "context_sha256": _sha(b["context"][i]),
                    "meta": dict(b["meta"][i]),
                }
            )
    return out


def test_a_version_2_output_streams_the_same_samples_with_the_patch_mpp_under_its_new_name_too() -> None:
    before = json.loads((V2 / "build-stream.json").read_text())
    now = _streamed(V2 / "build")
    assert len(now) == len(before) == 18
    for old, new in zip(before, now, strict=True):
        assert {**new, "meta": None} == {**old, "meta": None}  # key, label, pixels, context pixels
        assert new["meta"] == {**old["meta"], "patch_mpp": old["meta"]["mpp"]}  # what the .json holds, and the name
        assert new["meta"]["patch_mpp"] == PATCH_MPP and new["meta"]["context"][0]["mpp"] == 8.0


def test_select_reads_a_version_2_outputs_index_under_the_new_column_name() -> None:
    index = load_index((V2 / "build" / index_name("shard-000000-0000.tar")).read_bytes())
    assert "mpp" not in index.columns and np.allclose(index.columns["patch_mpp"], PATCH_MPP)
    every = _streamed(V2 / "build", select=lambda t: t["patch_mpp"] > 2.0)
    tissue = _streamed(V2 / "build", select=lambda t: t["tissue"] > 0.7)
    assert len(every) == 18
    assert 0 < len(tissue) < 18 and all(s["meta"]["tissue"] > 0.7 for s in tissue)


def test_a_version_2_output_inspects_and_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    manifest, _ = load_manifest(str(V2 / "build"))
    assert manifest.version == 2 and [s.slide_mpp for s in manifest.slides] == [SLIDE_MPP, SLIDE_MPP]
    assert [s.patch_mpp for s in manifest.slides] == [PATCH_MPP, PATCH_MPP]
    row = next(ln for ln in details(manifest).splitlines() if ln.startswith("slide-000 "))
    assert row.split()[3:7] == ["0.5040", "openslide", "1", "2.0160"]
    report = verify(str(V2 / "build"))
    assert report.ok and report.samples_checked == 18, report.problems
    assert main(["inspect", str(V2 / "build")]) == 0
    assert "2.0160" in capsys.readouterr().out


def test_version_2_parts_merge_into_a_version_2_output_that_keeps_its_names(tmp_path: Path) -> None:
    out = tmp_path / "part"
    shutil.copytree(V2 / "part", out)
    merged = merge(str(out))
    assert merged.version == 2 and {s.slide_mpp for s in merged.slides} == {SLIDE_MPP}
    written = json.loads((out / "manifest.json").read_text())
    records = [json.loads(line) for line in (out / "slides.jsonl").read_text().splitlines()]
    assert written["version"] == 2 and [r["mpp"] for r in records] == [SLIDE_MPP, SLIDE_MPP]
    assert not [r for r in records if "slide_mpp" in r]  # a version 2 output in version 2's names
    assert verify(str(out)).ok and len(_streamed(out)) == 18


def test_parts_of_two_format_versions_are_not_merged() -> None:
    part, _ = load_manifest(str(V2 / "part" / "manifest.part-0001-of-0002.json"))
    newer = dataclasses.replace(part, version=FORMAT_VERSION)
    with pytest.raises(ManifestError, match="part 2 is of format version 3 and part 1 of version 2"):
        _join([part, newer], "out")


def test_a_version_2_build_is_refused_not_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    make_slides("slides", 2, seed=5, width=1024, height=1024, mpp=0.5040, quality=60, tissue_fraction=0.5)
    shutil.copytree(V2 / "build", "build")
    before = {p: p.read_bytes() for p in Path("build").rglob("*") if p.is_file()}
    assert main(["build", "slides", *FLAGS, "-o", "build"]) == 2
    assert "writes another format version" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in Path("build").rglob("*") if p.is_file()} == before  # nothing lost


def test_a_new_build_records_the_new_names_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    make_slides("slides", 2, seed=5, width=1024, height=1024, mpp=0.5040, quality=60, tissue_fraction=0.5)
    assert main(["build", "slides", *FLAGS, "-o", "new"]) == 0
    manifest = json.loads(Path("new/manifest.json").read_text())
    records = [json.loads(line) for line in Path("new/slides.jsonl").read_text().splitlines()]
    assert manifest["version"] == FORMAT_VERSION == 3 and manifest["options"]["patch"]["target_mpp"] == 2.0
    assert [(r["slide_mpp"], r["patch_mpp"]) for r in records] == [(SLIDE_MPP, PATCH_MPP)] * 2
    assert not [r for r in records if "mpp" in r]
    samples = _streamed(Path("new"))
    assert len(samples) == 18 and {s["meta"]["patch_mpp"] for s in samples} == {PATCH_MPP}
    assert not [s for s in samples if "mpp" in s["meta"]]  # the .json holds patch_mpp alone
    index = load_index(Path("new", index_name(manifest["shards"][0]["name"])).read_bytes())
    assert np.allclose(index.columns["patch_mpp"], PATCH_MPP)
    before = json.loads((V2 / "build-stream.json").read_text())
    # the same samples, pixel for pixel; their order in the shard follows the read blocks (8x8 since 0.2.0's 4x4)
    assert sorted((s["key"], s["image_sha256"]) for s in samples) == sorted(
        (s["key"], s["image_sha256"]) for s in before
    )


def test_patch_meta_gives_a_version_2_samples_mpp_as_patch_mpp_and_leaves_version_3_alone() -> None:
    assert patch_meta({"mpp": 0.5, "x": 1}) == {"mpp": 0.5, "patch_mpp": 0.5, "x": 1}
    assert patch_meta({"patch_mpp": 0.5}) == {"patch_mpp": 0.5}
    assert patch_meta([1, 2]) == [1, 2]  # not an object: left for the caller to refuse
