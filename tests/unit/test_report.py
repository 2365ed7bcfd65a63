"""Readable summaries of a manifest (:mod:`wsishard.report`), on hand-made manifests."""

from __future__ import annotations

import dataclasses

import pytest

from wsishard.manifest import Manifest, ShardRecord, SlideRecord
from wsishard.report import details, human_bytes, summary


def _slide(i: int, *, failed: str = "") -> SlideRecord:
    if failed:
        return SlideRecord(slide_id=f"bad{i}", file=f"/data/in/bad{i}.svs", status="failed", reason=failed)
    return SlideRecord(
        slide_id=f"s{i}",
        file=f"/data/in/s{i}.svs",
        status="ok",
        width=40_000,
        height=30_000,
        slide_mpp=0.2501,
        mpp_source="openslide",
        level=1,
        downsample=4.0,
        tissue_fraction=0.25,
        candidates=900 + i,
        patches=800 + i,
    )


def _shard(i: int, samples: int, slides: int, nbytes: int) -> ShardRecord:
    return ShardRecord(name=f"shard-{i:06d}.tar", samples=samples, bytes=nbytes, sha256=f"{i:x}" * 64, slides=slides)


def _manifest(slides: list[SlideRecord], shards: list[ShardRecord]) -> Manifest:
    options = {
        "patch": {"patch_size_px": 224, "target_mpp": 0.5, "stride_px": None, "min_tissue": 0.4},
        "seed": 7,
        "quality": 85,
    }
    return Manifest(
        options=options,
        shards=shards,
        slides=slides,
        image_format="png",
        created="2024-01-02T03:04:05Z",
        wsishard_version="9.9.9",
    )


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (1234, "1.2 kB"),
        (1_234_567, "1.2 MB"),
        (256 * 1000**2, "256.0 MB"),
        (3.5e9, "3.5 GB"),
        (4.2e12, "4.2 TB"),
        (7e15, "7000.0 TB"),
    ],
)
def test_human_bytes_uses_decimal_units_up_to_terabytes(n: float, text: str) -> None:
    assert human_bytes(n) == text


def test_summary_counts_slides_samples_shards_and_bytes() -> None:
    slides = [_slide(0), _slide(1), _slide(2, failed="no tissue found"), _slide(3, failed="cannot open: bad header")]
    shards = [_shard(0, 1200, 2, 2_000_000), _shard(1, 400, 1, 500_000), _shard(2, 800, 2, 1_500_000)]
    lines = summary(_manifest(slides, shards), "s3://bucket/out").splitlines()
    assert lines[0] == "4 slides (2 ok, 2 failed): 2,400 patches in 3 shards (4.0 MB, png) -> s3://bucket/out"
    assert lines[1] == "  samples per shard 400..1200, slides per shard 1..2"
    assert lines[2] == (
        "  QC review: wsishard inspect s3://bucket/out --qc draws the pictures and "
        "s3://bucket/out/qc/index.html (no picture drawn yet)"
    )
    assert lines[3:] == ["  FAILED bad2.svs: no tissue found", "  FAILED bad3.svs: cannot open: bad header"]
    drawn = _manifest(slides, shards)
    drawn.options["qc"] = True  # built with --qc: the page is there
    assert summary(drawn, "out/").splitlines()[2] == "  QC review: out/qc/index.html"


def test_summary_totals_the_bytes_read_of_slides_in_object_storage_only_when_there_are_some() -> None:
    slides = [
        dataclasses.replace(_slide(i), file=f"s3://b/in/s{i}.svs", bytes_read=n)
        for i, n in enumerate([3_000_000, 1_000_000, 0])
    ]
    slides.append(_slide(3))  # a local file: not among them
    lines = summary(_manifest(slides, [_shard(0, 3206, 4, 9_000_000)])).splitlines()
    assert lines[2] == "  read from object storage: 4.0 MB of slide files, 1.3 MB per slide on average (3 slides)"
    assert not any("object storage" in line for line in summary(_manifest([_slide(0)], [])).splitlines())
    one = summary(_manifest(slides[:1], [_shard(0, 800, 1, 3_000_000)])).splitlines()
    assert one[2].endswith("3.0 MB per slide on average (1 slide)")


def test_summary_of_a_build_without_shards_has_no_shard_line() -> None:
    text = summary(_manifest([_slide(0, failed="no tissue found")], []))
    assert text.splitlines() == [
        "1 slide (0 ok, 1 failed): 0 patches in 0 shards (0 B, png)",
        "  FAILED bad0.svs: no tissue found",
    ]


def test_details_lists_options_slides_and_shards() -> None:
    slides = [_slide(0), _slide(1, failed="no microns-per-pixel in the slide")]
    shards = [_shard(0, 801, 1, 1_500_000)]
    lines = details(_manifest(slides, shards)).splitlines()
    assert lines[0] == "wsishard manifest v3 (wsishard 9.9.9, created 2024-01-02T03:04:05Z)"
    header = next(ln for ln in lines if ln.startswith("slide "))
    assert header.split()[3:7] == ["slide_mpp", "src", "lvl", "patch_mpp"]  # each mpp named by whose it is
    assert lines[1].startswith("2 slides (1 ok, 1 failed): 801 patches in 1 shard ")
    assert "patches: 224 px at 0.5 mpp (exactly), stride 224, min tissue 0.4, seed 7, quality 85" in lines
    ok = next(ln for ln in lines if ln.startswith("s0 "))
    assert ok.split() == ["s0", "ok", "40000x30000", "0.2501", "openslide", "1", "-", "25.0%", "900", "800", "-"]
    bad = next(ln for ln in lines if ln.startswith("bad1 "))
    assert bad.split() == ["bad1", "failed", "-", "-", "-", "-", "-", "0.0%", "0", "0", "-"]
    assert "cells: grid cells with any tissue" in "\n".join(lines)  # the columns explained
    shard = next(ln for ln in lines if ln.startswith("shard-000000.tar"))
    assert shard.split() == ["shard-000000.tar", "801", "1", "1.5", "MB", "0" * 16]
    assert not [ln for ln in lines if ln.startswith("...")]


def test_details_truncates_long_tables_with_a_count_of_the_rest() -> None:
    slides = [_slide(i) for i in range(7)]
    shards = [_shard(i, 10, 1, 1000) for i in range(5)]
    lines = details(_manifest(slides, shards), max_rows=3).splitlines()
    firsts = [ln.split()[0] for ln in lines if ln.strip()]
    assert [w for w in firsts if w in {s.slide_id for s in slides}] == ["s0", "s1", "s2"]
    assert [w for w in firsts if w.startswith("shard-")] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert "... 4 more slides" in lines and "... 2 more shards" in lines
    exact = details(_manifest(slides[:3], shards[:3]), max_rows=3).splitlines()
    assert not [ln for ln in exact if ln.startswith("...")]  # exactly max_rows: nothing left out


def test_details_show_the_patch_mpp_the_tolerance_the_labels_and_what_the_columns_mean() -> None:
    slide = dataclasses.replace(_slide(0), patch_mpp=0.5004, label=1)
    manifest = _manifest([slide], [_shard(0, 800, 1, 1_000_000)])
    manifest.options["patch"]["mpp_tolerance"] = 0.05
    manifest.extra["label_names"] = ["normal", "tumour"]
    text = details(manifest)
    assert "patches: 224 px at 0.5 mpp (within 0.05 of it)" in text
    assert "labels: 0 normal, 1 tumour" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("s0 "))
    assert row.split()[6] == "0.5004" and row.split()[-1] == "1"
    assert "cells: grid cells with any tissue" in text and "min_tissue" in text


def test_a_skipped_slide_is_counted_and_listed_as_skipped_not_failed() -> None:
    skipped = SlideRecord(slide_id="s9", file="/data/in/s9.svs", status="skipped", reason="no annotation file in --roi")
    manifest = _manifest([_slide(0), skipped], [_shard(0, 800, 1, 1_000_000)])
    assert manifest.failed_slides == []
    lines = summary(manifest).splitlines()
    assert lines[0].startswith("2 slides (1 ok, 0 failed, 1 skipped): 800 patches in 1 shard ")
    assert lines[-1] == "  skipped s9.svs: no annotation file in --roi"
    assert manifest.to_dict()["totals"]["slides_skipped"] == 1
