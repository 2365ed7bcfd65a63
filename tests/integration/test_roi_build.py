"""``--roi`` end to end: patches only inside the annotations, class labels as ``.cls`` and in the ``.json``, a broken
or empty annotation file as that slide's failure (the build goes on), a slide without one skipped or built whole,
and the tissue report in the manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from buildtools import read_output

from wsishard.builder.inputs.roi import RoiOptions
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.grid import PatchOptions
from wsishard.cli import main
from wsishard.testing.synthetic import make_slides

PATCH = PatchOptions(patch_size_px=64, target_mpp=1.0)  # 256 level-0 px at 0.25 mpp


def _square(x: float, y: float, side: float) -> list[list[float]]:
    return [[x, y], [x + side, y], [x + side, y + side], [x, y + side], [x, y]]


def _feature(coords: list[Any], name: str, kind: str = "Polygon") -> dict[str, Any]:
    return {
        "type": "Feature",
        "geometry": {"type": kind, "coordinates": coords},
        "properties": {"classification": {"name": name}},
    }


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``slide-000.svs``, ``slide-001.tif``, ``slide-002.svs``, ``slide-003.tif``: 2048x2048 px at 0.25 mpp."""
    folder = tmp_path_factory.mktemp("roi-slides")
    make_slides(folder, 4, seed=9, width=2048, height=2048, tissue_fraction=0.5)
    return folder


@pytest.fixture
def annotations(tmp_path: Path) -> Path:
    """slide-000: two classes and a hole; slide-001: malformed; slide-002: no polygon; slide-003: none."""
    folder = tmp_path / "roi"
    folder.mkdir()
    features = [
        _feature([_square(0, 0, 1024), _square(256, 256, 256)], "Tumor"),
        _feature([[_square(1024, 1024, 1024)]], "Stroma", "MultiPolygon"),
    ]
    (folder / "slide-000.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    (folder / "slide-001.geojson").write_text('{"type": "Polygon", "coordinates": [[[0, 0], [5, 5]]]}')
    (folder / "slide-002.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": []}))
    return folder


def _inside(x: int, y: int, extent: int, x0: int, y0: int, side: int) -> bool:
    return x0 <= x and x + extent <= x0 + side and y0 <= y and y + extent <= y0 + side


def test_patches_only_inside_annotations_with_class_labels(slides: Path, annotations: Path, tmp_path: Path) -> None:
    roi = RoiOptions(path=str(annotations), labels=("Stroma", "Tumor"), min_roi_coverage=1.0)
    options = BuildOptions(patch=PATCH, roi=roi, jobs=1, qc=False)
    manifest, samples = (build([str(slides)], str(tmp_path / "out"), options), read_output(str(tmp_path / "out"))[1])
    by_id = {s.slide_id: s for s in manifest.slides}
    assert by_id["slide-000"].status == "ok" and by_id["slide-000"].roi == "annotated: slide-000.geojson"
    assert "malformed annotation GeoJSON" in by_id["slide-001"].reason and by_id["slide-001"].status == "failed"
    assert "no Polygon" in by_id["slide-002"].reason
    assert by_id["slide-003"].roi == "missing: skipped" and "no annotation file" in by_id["slide-003"].reason
    assert by_id["slide-003"].status == "skipped" and by_id["slide-003"] not in manifest.failed_slides
    assert manifest.extra["label_names"] == ["Stroma", "Tumor"]
    assert samples and {s.meta["slide_id"] for s in samples} == {"slide-000"}
    for s in samples:
        meta = s.meta
        x, y, extent = meta["x"], meta["y"], meta["extent"]
        if meta["label_name"] == "Tumor":
            assert _inside(x, y, extent, 0, 0, 1024) and not _inside(x, y, 1, 256, 256, 256)  # not in the hole
        else:
            assert meta["label_name"] == "Stroma" and _inside(x, y, extent, 1024, 1024, 1024)
        assert int(s.members["cls"]) == meta["label"] == ["Stroma", "Tumor"].index(meta["label_name"])
    assert by_id["slide-000"].filtered.get("roi", 0) > 0 and by_id["slide-000"].patches == len(samples)


def test_missing_annotation_built_whole_and_the_cli_says_why(
    slides: Path, annotations: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "build",
            str(slides),
            "-o",
            str(out),
            "--patch-size",
            "64",
            "--mpp",
            "1",
            "--roi",
            str(annotations),
            "--roi-missing",
            "whole",
            "--no-qc",
            "--jobs",
            "1",
            "-q",
        ]
    )
    assert code == 1  # two slides failed: their annotation files are broken
    printed = capsys.readouterr().out
    assert "FAILED slide-001.tif: " in printed and "malformed annotation GeoJSON" in printed
    manifest, samples = read_output(str(out))
    by_id = {s.slide_id: s for s in manifest.slides}
    assert by_id["slide-003"].status == "ok" and by_id["slide-003"].roi == "missing: built whole"
    whole = [s for s in samples if s.meta["slide_id"] == "slide-003"]
    assert len(whole) == by_id["slide-003"].patches > 0 and "cls" not in whole[0].members
    assert by_id["slide-003"].tissue_mm2 > 0 and by_id["slide-003"].filtered.get("roi", 0) == 0


def test_tissue_report_in_the_manifest(slides: Path, tmp_path: Path) -> None:
    manifest = build([str(slides)], str(tmp_path / "out"), BuildOptions(patch=PATCH, jobs=1, qc=False))
    for record in manifest.slides:
        area_mm2 = record.width * record.height * (0.25 / 1000) ** 2
        assert record.tissue_mm2 == pytest.approx(record.tissue_fraction * area_mm2, rel=0.02)
        assert record.ink_mm2 < 0.01 * area_mm2 and record.artefact_mm2 < 0.03 * area_mm2  # the dust specks
        assert record.patches > 0 and record.patches + sum(record.filtered.values()) <= record.candidates


def test_quality_scores_recorded_and_filters_leave_patches_out(slides: Path, tmp_path: Path) -> None:
    from wsishard.builder.extract.quality import QualityOptions

    plain = build([str(slides)], str(tmp_path / "a"), BuildOptions(patch=PATCH, jobs=1, qc=False))
    _, all_samples = read_output(str(tmp_path / "a"))
    assert all({"background", "dark", "sharpness"} <= set(s.meta) for s in all_samples)
    backgrounds = sorted(s.meta["background"] for s in all_samples)
    cut = backgrounds[len(backgrounds) // 2]  # about half the patches are more background than this
    options = BuildOptions(patch=PATCH, jobs=1, qc=False, patch_quality=QualityOptions(max_background=cut))
    filtered = build([str(slides)], str(tmp_path / "b"), options)
    _, kept = read_output(str(tmp_path / "b"))
    assert kept and all(s.meta["background"] <= cut for s in kept)
    assert len(kept) == sum(1 for b in backgrounds if b <= cut)  # exactly those: the scores are deterministic
    for before, after in zip(plain.slides, filtered.slides, strict=True):
        assert after.patches + after.filtered.get("quality", 0) == before.patches
    assert sum(s.filtered.get("quality", 0) for s in filtered.slides) == len(all_samples) - len(kept) > 0


def test_a_slide_skipped_for_want_of_annotations_is_no_failure(
    slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roi = tmp_path / "roi"
    roi.mkdir()
    features = [_feature([_square(0, 0, 1024)], "Tumor")]
    (roi / "slide-000.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    out = tmp_path / "out"
    code = main(
        [
            "build",
            str(slides),
            "-o",
            str(out),
            "--patch-size",
            "64",
            "--mpp",
            "1",
            "--roi",
            str(roi),
            "--no-qc",
            "--jobs",
            "1",
            "-q",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed  # the default --roi-missing skip: three slides skipped, none failed
    assert printed.startswith("4 slides (1 ok, 0 failed, 3 skipped)") and "FAILED" not in printed
    assert "skipped slide-003.tif: no annotation file in --roi" in printed


def test_a_roi_labels_build_passes_verify_and_inspect_counts_its_classes(
    slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roi = tmp_path / "roi"
    roi.mkdir()
    features = [_feature([_square(0, 0, 1024)], "Tumor"), _feature([_square(1024, 1024, 1024)], "Stroma")]
    (roi / "slide-000.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    out = tmp_path / "out"
    flags = ["--patch-size", "64", "--mpp", "1", "--roi", str(roi), "--roi-labels", "Stroma,Tumor"]
    code = main(["build", str(slides), "-o", str(out), *flags, "--roi-missing", "whole", "--no-qc", "--jobs", "1"])
    assert code == 0, capsys.readouterr()
    capsys.readouterr()
    assert main(["verify", str(out), "-q"]) == 0, capsys.readouterr().out  # .cls from annotations, none elsewhere
    assert capsys.readouterr().out.rstrip().endswith("OK")
    _, samples = read_output(str(out))
    counts = {name: sum(s.meta.get("label_name") == name for s in samples) for name in ("Stroma", "Tumor")}
    assert counts["Stroma"] > 0 and counts["Tumor"] > 0
    assert main(["inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"labels: 0 Stroma ({counts['Stroma']} patches), 1 Tumor ({counts['Tumor']} patches)" in printed
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.startswith("slide-00")}
    assert rows["slide-000"][-1] == "roi" and rows["slide-003"][-1] == "-"  # annotated; built whole, unlabelled
