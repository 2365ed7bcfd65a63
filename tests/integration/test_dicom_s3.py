"""DICOM series in object storage (moto's S3 server on 127.0.0.1): a prefix's ``.dcm`` objects are grouped by their
headers, read by range (never the pixels), and a series is built once, named by its series, from a scratch copy
of all its files (OpenSlide opens a series from a folder)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from wsishard import build
from wsishard.builder.inputs.sources import find_inputs
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.scan.grid import PatchOptions
from wsishard.slide.dicom import series_files

if TYPE_CHECKING:
    from servers import S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(300)

FIXTURES = Path(__file__).parent.parent / "data" / "dicom"
SIZES = {name: (FIXTURES / name).stat().st_size for name in ("boxes_0.dcm", "boxes_1.dcm")}


@pytest.fixture
def bucket_series(s3: S3Server, s3_bucket: str, tmp_path: Path) -> str:
    """s3://BUCKET/slides/ with series/{boxes_0.dcm, boxes_1.dcm} (one series) and alone/boxes_1.dcm (a THUMBNAIL
    in a prefix of its own: another slide)."""
    (tmp_path / "series").mkdir()
    for name in SIZES:
        shutil.copy(FIXTURES / name, tmp_path / "series" / name)
    (tmp_path / "alone").mkdir()
    shutil.copy(FIXTURES / "boxes_1.dcm", tmp_path / "alone" / "boxes_1.dcm")
    root = f"s3://{s3_bucket}/slides"
    s3.upload(str(tmp_path / "series"), f"{root}/series")
    s3.upload(str(tmp_path / "alone"), f"{root}/alone")
    return root


def test_a_series_in_a_bucket_is_found_once_named_by_its_container(
    s3: S3Server, bucket_series: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        paths, names = find_inputs([bucket_series + "/"], s3.storage_options)
    assert paths == [f"{bucket_series}/alone/boxes_1.dcm", f"{bucket_series}/series/boxes_0.dcm"]
    assert names == {p: "SLIDE_1" for p in paths}
    grouped = [r.getMessage() for r in caplog.records if "DICOM series" in r.getMessage()]
    assert len(grouped) == 1 and "boxes_0.dcm, boxes_1.dcm" in grouped[0]
    assert series_files(paths[1], s3.storage_options) == [paths[1], f"{bucket_series}/series/boxes_1.dcm"]
    assert series_files(paths[0], s3.storage_options) == [paths[0]]  # alone/ holds no other file of it


def test_a_series_in_a_bucket_builds_once_from_a_copy_of_all_its_files(
    s3: S3Server, bucket_series: str, tmp_path: Path
) -> None:
    options = BuildOptions(patch=PatchOptions(patch_size_px=8), shard_samples=10, jobs=1)
    remote = build(f"{bucket_series}/series/", str(tmp_path / "s3"), options, storage_options=s3.storage_options)
    (tmp_path / "local").mkdir()
    for name in SIZES:
        shutil.copy(FIXTURES / name, tmp_path / "local" / name)
    local = build(str(tmp_path / "local"), str(tmp_path / "out"), options)
    [slide] = remote.slides
    [twin] = local.slides
    assert slide.file == f"{bucket_series}/series/boxes_0.dcm" and slide.slide_id == twin.slide_id == "SLIDE_1"
    assert (slide.read, slide.bytes_read) == ("copied", sum(SIZES.values()))  # the series' two files, once each
    assert (slide.width, slide.height, slide.slide_mpp, slide.reason) == (16, 16, 0.499, "no tissue found")
    assert (slide.width, slide.height, slide.slide_mpp, slide.reason) == (twin.width, twin.height, 0.499, twin.reason)
