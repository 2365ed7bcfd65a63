"""DICOM series (:mod:`wsishard.slide.dicom`): OpenSlide's two-file fixture (a VOLUME and a THUMBNAIL of one
series, tests/data/dicom) is one slide, found and built once and named by its series; a ``.dcm`` that is no slide is
a failed record. In object storage: tests/integration/test_dicom_s3.py."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from wsishard import build
from wsishard.builder.inputs.sources import find_inputs, find_slides
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.scan.grid import PatchOptions
from wsishard.slide.dicom import group_series, header

FIXTURES = Path(__file__).parent.parent / "data" / "dicom"
SERIES = "1.3.6.1.4.1.5962.99.1.1747645553.419656796.1689669825649.4.0"
CONTAINER = "SLIDE_1"  # the fixture's ContainerIdentifier: the glass slide's id


@pytest.fixture
def series(tmp_path: Path) -> Path:
    """slides/{boxes_0.dcm, boxes_1.dcm} (one series) and slides/other/{boxes_0.dcm} (the same series' VOLUME alone,
    in a folder of its own: a slide of its own)."""
    root = tmp_path / "slides"
    (root / "other").mkdir(parents=True)
    for name in ("boxes_0.dcm", "boxes_1.dcm"):
        shutil.copy(FIXTURES / name, root / name)
    shutil.copy(FIXTURES / "boxes_0.dcm", root / "other" / "boxes_0.dcm")
    return root


def test_the_two_files_of_a_series_are_found_as_one_slide_with_a_warning(
    series: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        found = find_slides([str(series)])
    assert found == [str(series / "boxes_0.dcm"), str(series / "other" / "boxes_0.dcm")]
    grouped = [r.getMessage() for r in caplog.records if "DICOM series" in r.getMessage()]
    assert len(grouped) == 1  # the folder other/ holds one file: nothing grouped there
    assert SERIES in grouped[0] and "boxes_0.dcm, boxes_1.dcm" in grouped[0] and CONTAINER in grouped[0]


def test_a_series_is_named_by_its_container_identifier_and_either_file_names_it(series: Path) -> None:
    found = {header(str(FIXTURES / name)) for name in ("boxes_0.dcm", "boxes_1.dcm")}
    assert len(found) == 1
    one = next(iter(found))
    assert one is not None and (one.series, one.container, one.is_slide) == (SERIES, CONTAINER, True)
    paths, names = find_inputs([str(series)])
    # both series are SLIDE_1: unique_slide_ids breaks the tie by a hash of the path, as for two files of one stem
    assert names == {p: CONTAINER for p in paths}


def test_files_that_are_no_slide_and_other_files_are_kept_as_they_are(tmp_path: Path) -> None:
    (tmp_path / "report.dcm").write_bytes(b"\0" * 128 + b"DICM" + b"\0" * 64)  # DICOM, but no slide
    (tmp_path / "thumb").mkdir()
    shutil.copy(FIXTURES / "boxes_1.dcm", tmp_path / "thumb" / "boxes_1.dcm")  # a THUMBNAIL without its VOLUME
    paths = [str(tmp_path / "a.svs"), str(tmp_path / "report.dcm"), str(tmp_path / "thumb" / "boxes_1.dcm")]
    assert header(paths[1]) is None and header(paths[0]) is None  # report.dcm: DICM, then nothing readable
    # a THUMBNAIL alone is a series of one file (its scan records whether OpenSlide opens it)
    assert group_series(paths) == (paths, {paths[2]: CONTAINER})


def test_a_series_builds_as_one_slide_and_a_dcm_that_is_no_slide_fails_with_a_reason(
    series: Path, tmp_path: Path
) -> None:
    shutil.rmtree(series / "other")
    (series / "report.dcm").write_bytes(b"\0" * 128 + b"DICM" + b"\0" * 64)
    options = BuildOptions(patch=PatchOptions(patch_size_px=8), shard_samples=10, jobs=1)
    manifest = build(str(series), str(tmp_path / "out"), options)
    by_file = {Path(s.file).name: s for s in manifest.slides}
    assert sorted(by_file) == ["boxes_0.dcm", "report.dcm"]  # boxes_1.dcm is boxes_0's series: not a slide
    volume = by_file["boxes_0.dcm"]  # opened and read (16 x 16 px of boxes: no tissue to patch)
    assert (volume.slide_id, by_file["report.dcm"].slide_id) == (CONTAINER, "report")  # named by its series
    assert (volume.width, volume.height, volume.slide_mpp, volume.reason) == (16, 16, 0.499, "no tissue found")
    assert by_file["report.dcm"].status == "failed" and "OpenSlide cannot open it" in by_file["report.dcm"].reason
