"""The file-name formats of :mod:`wsishard.format`: shard names, temporary names and part manifests, each made
and parsed by one pair of functions that must invert each other and reject every other name; and the sample key
grammar, which no path or dot gets through."""

from __future__ import annotations

import dataclasses

import pytest

from wsishard.format import (
    MANIFEST_NAME,
    SLIDES_NAME,
    is_sample_key,
    is_shard_name,
    is_slides_name,
    key_slide,
    manifest_name,
    mpp_tag,
    parse_part_manifest,
    sample_key,
    sanitize_slide_id,
    shard_index,
    shard_name,
    shard_order,
    slides_name,
    temp_name,
    temp_target,
)
from wsishard.shards.samplerules import SampleRules, _label_problems, _meta_problems


def test_shard_names_are_zero_padded_and_recognised() -> None:
    """Version 2 names a shard by its group and its number in the group (version 1 names are still read)."""
    assert shard_name(shard_index(0, 0)) == "shard-000000-0000.tar"
    assert shard_name(shard_index(0, 42)) == "shard-000000-0042.tar"
    assert shard_name(shard_index(7, 3)) == "shard-000007-0003.tar"
    assert shard_name(shard_index(1_234_567, 12_345)) == "shard-1234567-12345.tar"  # wider, never cut
    indices = [shard_index(g, k) for g in (0, 1, 999_999, 1_000_000) for k in (0, 1, 9_999, 10_000)]
    assert all(is_shard_name(shard_name(i)) for i in indices)
    assert [shard_order(shard_name(i)) for i in indices] == [(i >> 20, i & 0xFFFFF) for i in indices]
    assert sorted(shard_name(shard_index(g, k)) for g, k in ((1, 0), (0, 10), (0, 2))) == [
        shard_name(shard_index(g, k)) for g, k in ((0, 2), (0, 10), (1, 0))
    ]
    assert is_shard_name("shard-000042.tar") and is_shard_name("shard-1234567.tar")  # version 1
    with pytest.raises(ValueError):
        shard_index(0, 1 << 20)


def test_slide_records_file_names() -> None:
    assert slides_name() == SLIDES_NAME == "slides.jsonl"
    assert slides_name((2, 8)) == "slides.part-0002-of-0008.jsonl"
    assert all(map(is_slides_name, (slides_name(), slides_name((2, 8)))))
    assert not any(map(is_slides_name, ("slides.json", "../slides.jsonl", "x/slides.jsonl", "manifest.json")))


@pytest.mark.parametrize(
    "name",
    [
        "shard-42.tar",
        "shard-000042.tar.gz",
        "shard-000042-12.tar",
        "shard-000042--0001.tar",
        "shard-000042-0001",
        "shard-000042",
        "Shard-000042.tar",
        "shard-00004a.tar",
        ".shard-000042.tar.tmp-7",
        "x/shard-000042.tar",
        "shard-000042.tar ",
        "manifest.json",
        "",
    ],
)
def test_other_names_are_not_shard_names(name: str) -> None:
    assert not is_shard_name(name)


@pytest.mark.parametrize("name", ["shard-000003.tar", "manifest.json", "manifest.part-0002-of-0008.json", "qc.png"])
def test_temp_name_round_trips_through_temp_target(name: str) -> None:
    tmp = temp_name(name, 4321)
    assert tmp == f".{name}.tmp-4321"
    assert tmp.startswith(".")  # hidden while it is written: no listing takes it for the final file
    assert temp_target(tmp) == name
    assert not is_shard_name(tmp)


@pytest.mark.parametrize(
    "name",
    [
        "shard-000003.tar",
        ".shard-000003.tar",
        ".shard-000003.tar.tmp-",
        ".shard-000003.tar.tmp-12x",
        "shard-000003.tar.tmp-12",
        ".tmp-12",
        ".shard-000003.tar.tmp-12/",
    ],
)
def test_temp_target_rejects_names_that_are_not_temporary(name: str) -> None:
    assert temp_target(name) is None


@pytest.mark.parametrize(
    ("part", "name"),
    [
        ((2, 8), "manifest.part-0002-of-0008.json"),
        ((1, 1), "manifest.part-0001-of-0001.json"),
        ((12, 10_000), "manifest.part-0012-of-10000.json"),
    ],
)
def test_part_manifest_names_round_trip(part: tuple[int, int], name: str) -> None:
    assert manifest_name(part) == name
    assert parse_part_manifest(name) == part


def test_the_whole_manifest_is_not_a_part_manifest() -> None:
    assert manifest_name() == manifest_name(None) == MANIFEST_NAME == "manifest.json"
    assert parse_part_manifest(MANIFEST_NAME) is None


@pytest.mark.parametrize(
    "name",
    [
        "manifest.part-2-of-8.json",
        "manifest.part-0002-of-0008.json.tmp-1",
        "manifest.part-0002-0008.json",
        ".manifest.part-0002-of-0008.json.tmp-1",
        "failed.part-0001-of-0002.json",
        "manifest.part-000a-of-0008.json",
        "manifest.part-0002-of-0008.json/",
        "",
    ],
)
def test_other_names_are_not_part_manifests(name: str) -> None:
    assert parse_part_manifest(name) is None


def test_the_key_grammar() -> None:
    assert is_sample_key(sample_key(sanitize_slide_id("../../a b.svs"), 0, 1024))
    assert is_sample_key("TCGA-02-0001-01Z-00-DX1_x123_y456") and is_sample_key("s-1a2b3c4d_x0_y0")
    for bad in (
        "../../evil",
        "a/b_x1_y2",
        "a_x1_y2/..",
        "evil",
        "a_x1",
        "a_x-1_y2",
        "_a_x1_y2",
        "-a_x1_y2",
        "a_x1_y2 ",
        "a.b_x1_y2",
        "a_x1_y2\n",
        "",
        "a_x_y1",
    ):
        assert not is_sample_key(bad), bad


def test_a_multi_mpp_key_names_its_scale_and_gives_its_slide_back() -> None:
    assert [mpp_tag(m) for m in (0.5, 1.0, 2.0, 0.252, 0.2631)] == ["mpp0p5", "mpp1", "mpp2", "mpp0p252", "mpp0p2631"]
    key = sample_key("slide_mpp2", 1016, 0, 0.5)  # a slide id may end like a tag: only a multi-mpp key has one
    assert key == "slide_mpp2_mpp0p5_x1016_y0" and is_sample_key(key)
    assert key_slide(key, multi_mpp=True) == "slide_mpp2"
    assert key_slide(sample_key("slide_mpp2", 1, 2), multi_mpp=False) == "slide_mpp2"
    assert sample_key("a", 1, 2) == "a_x1_y2"  # a build of one mpp: the plain grammar


def test_verify_holds_a_multi_mpp_sample_to_its_slide_label() -> None:
    rules = SampleRules(patch_size_px=64, image_format="jpg", labels={"s1": 1}, labelled=True, multi_mpp=True)
    assert _label_problems("s1_mpp2_x0_y0", b"1", rules) == []
    assert _label_problems("s1_mpp2_x0_y0", b"0", rules)[0][0].endswith("differs from their slide's label")
    assert _label_problems("s1_mpp2_x0_y0", b"0", dataclasses.replace(rules, multi_mpp=False)) == []  # not found


def test_verify_holds_a_multi_mpp_sample_to_the_nearest_of_its_mpps() -> None:
    rules = SampleRules(patch_size_px=64, image_format="jpg", multi_mpp=True, target_mpps=(0.5, 1.0, 2.0))
    assert _meta_problems(b'{"patch_size": 64, "patch_mpp": 1.0}', rules) == []
    off = _meta_problems(b'{"patch_size": 64, "patch_mpp": 1.3}', rules)
    assert off and "target_mpp 1 by more than" in off[0][0]
