"""``verify`` on a local output: every shard re-read and compared with the manifest (S3 and HTTP:
tests/integration/test_verify_remote.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

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
