"""``verify`` against hostile and inconsistent outputs (issue 12, items 2 and 11): every sample must match the
manifest's options (image size from the header only, image format, ``.json`` patch size and mpp, ``.cls`` iff the
slide is labelled), member names must follow the key grammar, and shard names from the manifest never become
paths. Each case changes the samples only: the manifest's counts, sizes and checksums are made to match, so the
option check alone must find it."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm

from wsishard.errors import ManifestError
from wsishard.format import shard_name
from wsishard.shards.verify import format_report, verify

pytestmark = pytest.mark.timeout(120)

PX = 16


def _edit_manifest(out: sm.Output, change: Callable[[dict], None]) -> None:
    path = Path(out.root, "manifest.json")
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_sample(out: sm.Output, shard: int, sample: int, ext: str, change: Callable[[bytes], bytes]) -> str:
    """Replace one member of one sample and make the manifest record match the new shard; the sample's key."""
    key = out.keys[shard_name(shard)][sample]
    sm.rewrite_member(out, shard, key, ext, change)
    sm.refresh_record(out, shard)
    return key


def _edit_json(out: sm.Output, shard: int, sample: int, **fields: object) -> str:
    return _edit_sample(out, shard, sample, "json", lambda data: json.dumps({**json.loads(data), **fields}).encode())


def _problems(out: sm.Output) -> dict[str, str]:
    report = verify(out.root, jobs=2)
    assert report.samples_checked == out.manifest.total_samples
    return dict(report.problems)


def test_shards_of_another_patch_size_than_the_manifest_says_are_problems(small_output: sm.Output) -> None:
    assert verify(small_output.root).ok
    _edit_manifest(small_output, lambda d: d["options"]["patch"].update(patch_size_px=PX // 2))
    problems = _problems(small_output)
    assert list(problems) == [shard_name(i) for i in range(4)]
    for i, reason in enumerate(problems.values()):
        first = small_output.keys[shard_name(i)][0]
        assert f"{PX}x{PX} px" in reason and f"patch_size_px {PX // 2}" in reason and first in reason
        assert ".json patch_size" in reason
    assert "FAILED: 4 of 4" in format_report(verify(small_output.root))


def test_one_sample_of_another_size_or_format_is_named(small_output: sm.Output) -> None:
    big = _edit_sample(small_output, 1, 2, "jpg", lambda _: sm.encode(np.zeros((PX, 2 * PX, 3), dtype=np.uint8)))
    png = _edit_sample(small_output, 2, 4, "jpg", lambda _: sm.encode(np.zeros((PX, PX, 3), dtype=np.uint8), "png"))
    bomb = _edit_sample(small_output, 3, 0, "jpg", _bomb)
    problems = _problems(small_output)
    assert list(problems) == [shard_name(1), shard_name(2), shard_name(3)]
    assert f"1 samples are not {PX}x{PX} px" in problems[shard_name(1)] and big in problems[shard_name(1)]
    assert f"{2 * PX}x{PX}" in problems[shard_name(1)]
    assert "not jpg" in problems[shard_name(2)] and png in problems[shard_name(2)] and "png" in problems[shard_name(2)]
    assert "30000x30000" in problems[shard_name(3)] and bomb in problems[shard_name(3)]


def test_a_png_member_in_a_jpg_build_is_named(small_output: sm.Output) -> None:
    key = small_output.keys[shard_name(0)][1]

    def rename(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        png = sm.encode(small_output.images[key], "png")
        return [(f"{key}.png", png) if name == f"{key}.jpg" else (name, data) for name, data in members]

    sm.rewrite_shard(small_output, 0, rename)
    problems = _problems(small_output)
    assert list(problems) == [shard_name(0)] and "not jpg" in problems[shard_name(0)] and key in problems[shard_name(0)]


def test_json_patch_size_and_mpp_must_agree_with_the_options(small_output: sm.Output) -> None:
    size_key = _edit_json(small_output, 0, 3, patch_size=PX * 2)
    mpp_key = _edit_json(small_output, 2, 1, mpp=0.55)
    broken = _edit_sample(small_output, 3, 2, "json", lambda _: b"{not json")
    close = _edit_json(small_output, 1, 1, mpp=0.5000004)  # rounding of the recorded mpp: fine
    problems = _problems(small_output)
    assert list(problems) == [shard_name(0), shard_name(2), shard_name(3)] and close
    assert ".json patch_size" in problems[shard_name(0)] and size_key in problems[shard_name(0)]
    assert ".json mpp" in problems[shard_name(2)] and mpp_key in problems[shard_name(2)]
    assert "0.55" in problems[shard_name(2)]
    assert ".json" in problems[shard_name(3)] and broken in problems[shard_name(3)]


def test_mpp_within_the_builds_tolerance_passes(small_output: sm.Output) -> None:
    _edit_json(small_output, 0, 0, mpp=0.52)
    assert list(_problems(small_output)) == [shard_name(0)]
    _edit_manifest(small_output, lambda d: d["options"]["patch"].update(mpp_tolerance=0.05))
    assert verify(small_output.root).ok


def test_cls_present_exactly_when_the_slide_is_labelled(small_output: sm.Output, tmp_path: Path) -> None:
    key = small_output.keys[shard_name(1)][0]
    sm.rewrite_shard(small_output, 1, lambda members: [m for m in members if m[0] != f"{key}.cls"])
    wrong = _edit_sample(small_output, 2, 0, "cls", lambda data: str(int(data) + 1).encode())
    problems = _problems(small_output)
    assert list(problems) == [shard_name(1), shard_name(2)]
    assert "lack .cls" in problems[shard_name(1)] and key in problems[shard_name(1)]
    assert ".cls" in problems[shard_name(2)] and wrong in problems[shard_name(2)]
    unlabelled = sm.make_output(str(tmp_path / "u"), (4, 4), labelled=False)
    assert verify(unlabelled.root).ok
    odd = unlabelled.keys[shard_name(0)][2]

    def add_cls(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        at = next(i for i, (name, _) in enumerate(members) if name.startswith(odd + "."))
        return [*members[:at], (f"{odd}.cls", b"1"), *members[at:]]

    sm.rewrite_shard(unlabelled, 0, add_cls)
    problems = _problems(unlabelled)
    assert list(problems) == [shard_name(0)]
    assert "have .cls" in problems[shard_name(0)] and odd in problems[shard_name(0)]


@pytest.mark.parametrize("key", ["../../evil", "sub/slide0_x0_y0", "evil"])
def test_member_names_outside_the_key_grammar_are_problems(small_output: sm.Output, key: str) -> None:
    donor = small_output.keys[shard_name(2)][0]

    def insert(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        copies = [(f"{key}.{name.split('.', 1)[1]}", data) for name, data in members if name.startswith(donor + ".")]
        return members[:3] + copies + members[3:]

    sm.rewrite_shard(small_output, 2, insert)
    problems = _problems(small_output)
    assert list(problems) == [shard_name(2)] and repr(key) in problems[shard_name(2)]


@pytest.mark.parametrize("name", ["../../x.tar", "/etc/x.tar", "s3://other/x.tar", "shard-1.tar"])
def test_a_shard_name_that_is_a_path_is_refused_before_anything_is_read(small_output: sm.Output, name: str) -> None:
    _edit_manifest(small_output, lambda d: d["shards"][2].update(name=name))
    with pytest.raises(ManifestError) as info:
        verify(small_output.root)
    assert repr(name) in info.value.reason and "entry 2" in info.value.reason


def _bomb(_: bytes) -> bytes:
    """A small JPEG whose frame header declares 30000 x 30000 px."""
    data = bytearray(sm.encode(np.full((PX, PX, 3), 200, dtype=np.uint8)))
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC1, 0xC2):
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    data[pos + 5 : pos + 9] = struct.pack(">HH", 30000, 30000)
    return bytes(data)


# ---- issue 28, items 10 and 11: labels that overflow, JSON nested past the parser's depth -------------------


@pytest.mark.parametrize("label", [2**70, -1e23, "3", True])
def test_a_json_label_that_is_no_int64_is_a_problem(small_output: sm.Output, label: object) -> None:
    key = _edit_json(small_output, 2, 1, label=label)
    problems = _problems(small_output)
    assert list(problems) == [shard_name(2)]
    assert "label is not an integer in int64's range" in problems[shard_name(2)] and key in problems[shard_name(2)]


def test_a_cls_outside_int64_is_a_problem_where_no_label_is_recorded(small_output: sm.Output) -> None:
    _edit_manifest(small_output, lambda d: d.update(slides=[]))  # labelled build, slides not listed: no label to match
    key = _edit_sample(small_output, 0, 2, "cls", lambda _: str(2**64).encode())
    problems = _problems(small_output)
    assert list(problems) == [shard_name(0)]
    assert ".cls is not an integer in int64's range" in problems[shard_name(0)] and key in problems[shard_name(0)]


def test_a_json_nested_past_the_parsers_depth_is_a_problem_naming_its_shard(small_output: sm.Output) -> None:
    key = _edit_sample(small_output, 3, 0, "json", lambda _: b"[" * 500_000 + b"]" * 500_000)
    problems = _problems(small_output)
    assert list(problems) == [shard_name(3)]
    assert ".json is not a JSON object" in problems[shard_name(3)] and key in problems[shard_name(3)]
