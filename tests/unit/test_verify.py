"""``verify`` on a local output: every shard re-read and compared with the manifest (S3 and HTTP:
tests/integration/test_verify_remote.py), and against hostile and inconsistent outputs (issue 12, items 2 and 11):
every sample must match the manifest's options (image size from the header only, image format, ``.json`` patch size
and mpp, ``.cls`` iff the slide is labelled), member names must follow the key grammar, and shard names from the
manifest never become paths. Each of those cases changes the samples only: the manifest's counts, sizes and
checksums are made to match, so the option check alone must find it."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm

from wsishard.errors import ManifestError
from wsishard.format import shard_name
from wsishard.shards.verify import VerifyProgress, format_report, verify

pytestmark = pytest.mark.timeout(120)

COUNTS = sm.SMALL_COUNTS


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_an_intact_output_passes_with_counts_and_progress(small_output: sm.Output) -> None:
    seen: list[VerifyProgress] = []
    report = verify(small_output.root, progress=seen.append)
    assert report.ok and report.problems == [] and report.warnings == []
    assert report.shards_checked == len(COUNTS) and report.samples_checked == sum(COUNTS)
    assert report.bytes_checked == small_output.manifest.total_bytes
    assert [p.done for p in seen] == [1, 2, 3, 4] and seen[-1].bytes_done == seen[-1].bytes_total
    assert format_report(report).splitlines()[-1] == "OK"
    assert verify(os.path.join(small_output.root, "manifest.json"), jobs=1).ok


def test_missing_truncated_flipped_and_zeroed_shards_are_each_named(small_output: sm.Output) -> None:
    os.remove(small_output.path(0))
    sm.truncate(small_output.path(1), 0.5)
    _flip_byte(small_output.path(2), os.path.getsize(small_output.path(2)) // 2)
    size = os.path.getsize(small_output.path(3))
    sm.zero_bytes(small_output.path(3), 4)  # a zero block where sample 4 starts: tar readers see a clean end
    assert os.path.getsize(small_output.path(3)) == size
    report = verify(small_output.root)
    problems = dict(report.problems)
    assert not report.ok and list(problems) == [shard_name(i) for i in range(4)]
    assert problems[shard_name(0)] == "missing"
    assert "truncated" in problems[shard_name(1)]
    assert "sha256 differs" in problems[shard_name(2)]
    assert "holds 4 samples, the manifest says 7" in problems[shard_name(3)]
    assert "sha256 differs" in problems[shard_name(3)]
    text = format_report(report)
    assert all(shard_name(i) in text for i in range(4)) and "FAILED: 4 of 4" in text


def test_a_shard_zero_padded_back_to_its_length_is_caught(small_output: sm.Output) -> None:
    path, size = small_output.path(1), os.path.getsize(small_output.path(1))
    sm.truncate(path, 0.5)
    with open(path, "ab") as fh:
        fh.write(b"\0" * (size - os.path.getsize(path)))
    problems = dict(verify(small_output.root).problems)
    assert list(problems) == [shard_name(1)]
    assert "sha256 differs" in problems[shard_name(1)] or "samples" in problems[shard_name(1)]


def test_a_corrupt_member_header_mid_shard_is_caught(small_output: sm.Output) -> None:
    key = small_output.keys[shard_name(2)][3]
    data = Path(small_output.path(2)).read_bytes().replace(f"{key}.jpg".encode(), f"{key}.xyz".encode(), 1)
    Path(small_output.path(2)).write_bytes(data)  # bad header checksum: tarfile takes it for the end of the archive
    problems = dict(verify(small_output.root).problems)
    assert list(problems) == [shard_name(2)]
    assert "holds 3 samples, the manifest says 9" in problems[shard_name(2)]


def test_stray_and_temporary_shard_files_are_warnings(small_output: sm.Output) -> None:
    shutil.copy(small_output.path(0), os.path.join(small_output.root, shard_name(17)))
    Path(small_output.root, f".{shard_name(5)}.tmp-1234").write_bytes(b"partial")
    Path(small_output.root, "notes.txt").write_text("not a shard")
    report = verify(small_output.root)
    assert report.ok
    assert [name for name, _ in report.warnings] == [f".{shard_name(5)}.tmp-1234", shard_name(17)]
    assert "not in the manifest" in dict(report.warnings)[shard_name(17)]
    assert "warning" in format_report(report)


def test_no_manifest_is_a_manifest_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError):
        verify(str(tmp_path))
    with pytest.raises(ValueError, match="jobs"):
        verify(str(tmp_path), jobs=0)


# ---- hostile and inconsistent samples: the manifest's options hold every sample ---------------------------------

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
    mpp_key = _edit_json(small_output, 2, 1, patch_mpp=0.55)
    broken = _edit_sample(small_output, 3, 2, "json", lambda _: b"{not json")
    close = _edit_json(small_output, 1, 1, patch_mpp=0.5000004)  # rounding of the recorded mpp: fine
    problems = _problems(small_output)
    assert list(problems) == [shard_name(0), shard_name(2), shard_name(3)] and close
    assert ".json patch_size" in problems[shard_name(0)] and size_key in problems[shard_name(0)]
    assert ".json patch_mpp" in problems[shard_name(2)] and mpp_key in problems[shard_name(2)]
    assert "0.55" in problems[shard_name(2)]
    assert ".json" in problems[shard_name(3)] and broken in problems[shard_name(3)]


def test_mpp_within_the_builds_tolerance_passes(small_output: sm.Output) -> None:
    _edit_json(small_output, 0, 0, patch_mpp=0.52)
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
