"""A manifest or slide records file whose fields hold the wrong kind of value (issue 42, item 4): each is a
``ManifestError`` naming the file, the entry and the field, where it was a ``TypeError`` in ``inspect`` or
``verify`` (exit status 3), a wrong count accepted, or a stream allocating terabytes."""

from __future__ import annotations

import json
import math

import pytest

from wsishard.errors import ManifestError
from wsishard.format import MAX_PATCH_PX
from wsishard.manifest import Manifest, SlideRecord, expected_patch_size, parse_slide_lines, slide_lines
from wsishard.report import details

SHA = "0" * 64


def _data(**top: object) -> dict:
    shard = {"name": "shard-000000-0000.tar", "samples": 4, "bytes": 10240, "sha256": SHA, "slides": 2}
    data = {"format": "wsishard", "version": 3, "options": {}, "shards": [shard], "slides": [], "image_format": "jpg"}
    data.update(top)
    return data


def _shard(**fields: object) -> dict:
    data = _data()
    data["shards"][0].update(fields)
    return data


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_shard(sha256=5), "sha256"),
        (_shard(sha256="ab"), "sha256"),
        (_shard(sha256="G" * 64), "sha256"),
        (_shard(slides=-3), "slides"),
        (_shard(slides="x"), "slides"),
        (_shard(bytes=math.nan), "bytes"),
        (_data(slides_file=7), "slides_file"),
        (_data(image_format="pyd"), "image_format"),
        (_data(image_format=3), "image_format"),
        (_data(options=[1]), "options"),
        (_data(extra=[1]), "extra"),
        (_data(created=5), "created"),
        (_data(version=True), "format version True"),
    ],
)
def test_a_manifest_field_of_the_wrong_kind_is_named(data: dict, field: str) -> None:
    with pytest.raises(ManifestError) as info:
        Manifest.from_dict(data, "out/manifest.json")
    assert info.value.location == "out/manifest.json" and field in info.value.reason
    assert "\n" not in str(info.value)


def test_a_well_formed_manifest_still_reads() -> None:
    manifest = Manifest.from_dict(_data(), "m")
    assert manifest.shards[0].slides == 2 and manifest.image_format == "jpg"
    assert Manifest.from_json(manifest.to_json(), "m") == manifest


def test_a_patch_size_past_any_build_is_refused_before_a_stream_allocates_it() -> None:
    for size, ok in ((MAX_PATCH_PX, True), (MAX_PATCH_PX + 1, False), (10**9, False)):
        manifest = Manifest.from_dict(_data(options={"patch": {"patch_size_px": size}}))
        if ok:
            assert expected_patch_size(manifest, "m") == size
        else:
            with pytest.raises(ManifestError, match=f"1 to {MAX_PATCH_PX}"):
                expected_patch_size(manifest, "m")


RECORD = SlideRecord(slide_id="s0", file="s0.svs", status="ok", width=100, height=80, slide_mpp=0.25, patches=3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("slide_id", ["a"]),
        ("file", 5),
        ("status", "weird"),
        ("patches", "x"),
        ("patches", -5),
        ("width", math.nan),
        ("tissue_mm2", "x"),
        ("tissue_fraction", -0.5),
        ("slide_mpp", "x"),
        ("slide_mpp", 0),
        ("label", "x"),
        ("label", 2**63),
        ("level", -1),
        ("filtered", [1]),
        ("filtered", {"min_tissue": -1}),
        ("stain", [1]),
    ],
)
def test_a_slide_record_field_of_the_wrong_kind_is_named_with_its_line(field: str, value: object) -> None:
    lines = slide_lines([RECORD, RECORD]).decode().splitlines()
    data = json.loads(lines[1])
    data[field] = value
    text = "\n".join([lines[0], json.dumps(data)])
    with pytest.raises(ManifestError) as info:
        parse_slide_lines(text, "out/slides.jsonl")
    assert info.value.location == "out/slides.jsonl" and info.value.reason.startswith("line 2 ")
    assert f"field {field!r} is " in info.value.reason and "\n" not in str(info.value)
    inline = _data(version=1, slides=[json.loads(lines[0]), data])
    with pytest.raises(ManifestError, match=rf"slide entry 1's field {field!r}"):
        Manifest.from_dict(inline, "out/manifest.json")


def test_records_of_failed_and_older_slides_still_read() -> None:
    failed = SlideRecord(slide_id="f", file="f.svs", status="failed", reason="unreadable")
    assert parse_slide_lines(slide_lines([RECORD, failed]).decode()) == [RECORD, failed]
    older = slide_lines([RECORD], version=2).decode()  # mpp for slide_mpp
    assert parse_slide_lines(older)[0].slide_mpp == 0.25
    with pytest.raises(ManifestError, match="line 1 is not a slide record"):
        parse_slide_lines("[1, 2]\n", "s")


@pytest.mark.parametrize(
    ("options", "extra", "shown"),
    [
        ({"patch": {"patch_size_px": 16, "target_mpp": 0.5, "mpp_tolerance": "x"}}, {}, "within 'x' of it"),
        ({"patch": [1]}, {}, "patches: None px at None mpp (exactly)"),
        ({"patch": {"patch_size_px": 16, "target_mpp": 0.5, "mpp_tolerance": 0.05}}, {"label_names": 5}, "0.05 of it"),
    ],
)
def test_inspect_shows_options_of_the_wrong_kind_as_they_are(options: dict, extra: dict, shown: str) -> None:
    """``inspect``'s details formatted these with ``:g`` or iterated them: ValueError, AttributeError or TypeError,
    exit status 3 (the options are a build's record, shown, never used by ``inspect``)."""
    text = details(Manifest.from_dict(_data(options=options, extra=extra), "m"))
    assert shown in text and "labels:" not in text
