"""A build's resume state (:class:`wsishard.builder.run.state.BuildState`): what ``claim`` keeps or removes, scans, done
records, failed slides and the inputs' stamps, in a local output folder."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
from buildtools import files_under, put_files

from wsishard.builder.extract.extract import ShardDone
from wsishard.builder.run.stamps import fingerprint, input_stamps
from wsishard.builder.run.state import BuildState
from wsishard.builder.scan.grid import Candidates, blocks
from wsishard.builder.scan.scan import ScanResult
from wsishard.errors import OptionError
from wsishard.manifest import Manifest, ShardRecord, SlideRecord
from wsishard.storage.output import Destination

DIGEST = fingerprint(["/slides/a.svs", "/slides/b.svs"], {"patch": {"patch_size_px": 64}, "seed": 1})


def _state(out: Path, digest: str = DIGEST, part: tuple[int, int] | None = None) -> BuildState:
    return BuildState(Destination(str(out)), digest, part)


def _stored_fingerprint(out: Path) -> str:
    return json.loads((out / ".wsishard" / "build.json").read_text())["fingerprint"]


def test_fingerprint_depends_on_slides_and_options_only() -> None:
    slides, options = ["/slides/a.svs", "/slides/b.svs"], {"patch": {"patch_size_px": 64}, "seed": 1}
    assert fingerprint(slides, {"seed": 1, "patch": {"patch_size_px": 64}}) == DIGEST  # key order does not count
    assert fingerprint(slides[:1], options) != DIGEST
    assert fingerprint(slides[::-1], options) != DIGEST
    assert fingerprint(slides, {**options, "seed": 2}) != DIGEST


def test_fingerprint_changes_with_the_build_revision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An output begun by a wsishard that plans or resamples differently is never resumed into a mix of both."""
    import wsishard.format as fmt

    slides, options = ["/slides/a.svs"], {"seed": 1}
    BuildState(Destination(str(tmp_path)), fingerprint(slides, options)).claim(overwrite=False)
    monkeypatch.setattr(fmt, "BUILD_REVISION", fmt.BUILD_REVISION + 1)
    with pytest.raises(OptionError, match="plans or resamples differently"):
        BuildState(Destination(str(tmp_path)), fingerprint(slides, options)).claim(overwrite=False)


def test_claim_of_an_empty_folder_records_the_fingerprint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _state(out).claim(overwrite=False)
    assert _stored_fingerprint(out) == DIGEST
    assert sorted(p.name for p in out.rglob("*")) == [".wsishard", "build.json"]


def test_claim_of_the_same_build_resumes_it_and_keeps_its_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _state(out).claim(overwrite=False)
    (out / "shard-000000.tar").write_bytes(b"done before")
    _state(out).claim(overwrite=False)
    assert (out / "shard-000000.tar").read_bytes() == b"done before"


def test_claim_is_refused_for_another_build_without_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _state(out).claim(overwrite=False)
    (out / "shard-000000.tar").write_bytes(b"theirs")
    with pytest.raises(OptionError, match="--overwrite") as info:
        _state(out, "another digest").claim(overwrite=False)
    assert str(out) in str(info.value)
    assert _stored_fingerprint(out) == DIGEST and (out / "shard-000000.tar").exists()  # nothing touched


def test_claim_is_refused_for_a_finished_build_of_other_options(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    finished = Manifest(options={}, shards=[], slides=[], extra={"fingerprint": "from a finished build"})
    (out / "manifest.json").write_text(finished.to_json())  # a finished build, its state folder removed
    with pytest.raises(OptionError, match="--overwrite"):
        _state(out).claim(overwrite=False)
    _state(out, "from a finished build").claim(overwrite=False)  # the same build: resumed (nothing to redo)
    assert (out / "manifest.json").exists()


def test_overwrite_never_deletes_files_the_build_did_not_record(tmp_path: Path) -> None:
    """Named like a build's files but listed by nothing the previous build recorded: kept (with a warning), while
    the previous build's own state is replaced. What it did record: test_overwrite_removes_what_the_previous_build_...
    below."""
    out = tmp_path / "out"
    _state(out, "old").claim(overwrite=False)
    names = ("shard-000000.tar", "manifest.json", "manifest.part-0001-of-0002.json", "qc/s.png", "notes.txt")
    for name in names:
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(b"x")
    _state(out).claim(overwrite=True)
    for name in names:
        assert (out / name).read_bytes() == b"x", name
    assert _stored_fingerprint(out) == DIGEST


def _scans() -> list[ScanResult]:
    cands = Candidates(
        col=np.array([0, 1, 5, 2], dtype=np.int64),
        row=np.array([0, 0, 0, 3], dtype=np.int64),
        tissue=np.array([0.5, 1.0, 0.75, 0.625], dtype=np.float32),
        l0_per_o=2.0,
        stride=64,
        patch=64,
        total=9,
    )
    ok = SlideRecord(
        slide_id="a",
        file="/slides/a.svs",
        status="ok",
        width=2048,
        height=1024,
        slide_mpp=0.25,
        mpp_source="openslide",
        level=0,
        downsample=1.0,
        tissue_fraction=0.3,
        candidates=9,
        label=2,
    )
    failed = SlideRecord(slide_id="b", file="/slides/b.svs", status="failed", reason="no tissue found")
    return [ScanResult(ok, cands, blocks(cands, 4), 1234.5), ScanResult(failed)]


def test_scans_round_trip_one_slide_at_a_time_with_records_and_candidate_arrays(tmp_path: Path) -> None:
    store = _state(tmp_path / "out").scans
    assert store.scanned() == set() and store.load(0, 4) is None  # nothing saved yet
    saved = _scans()
    store.save(7, saved[0])
    assert store.scanned() == {7}  # each slide is saved as it arrives: the others are still to scan
    store.save(12, saved[1])
    store = _state(tmp_path / "out").scans
    assert store.scanned() == {7, 12}
    loaded = store.load_many([7, 9, 12], 4)
    assert sorted(loaded) == [7, 12]  # slide 9 was never scanned
    assert [loaded[7].record, loaded[12].record] == [s.record for s in saved]
    a, b = loaded[7].cands, saved[0].cands
    assert a is not None and b is not None
    for name in ("col", "row", "tissue"):
        assert np.array_equal(getattr(a, name), getattr(b, name)) and getattr(a, name).dtype == getattr(b, name).dtype
    assert (a.l0_per_o, a.stride, a.patch, a.total) == (2.0, 64, 64, 9)
    assert loaded[7].bytes_per_patch == 1234.5
    assert [(blk.o_x, blk.o_y, blk.o_w, blk.o_h, blk.patches.tolist()) for blk in loaded[7].blocks] == [
        (blk.o_x, blk.o_y, blk.o_w, blk.o_h, blk.patches.tolist()) for blk in saved[0].blocks
    ]
    assert loaded[12].cands is None and loaded[12].blocks == [] and loaded[12].bytes_per_patch is None


def test_a_scan_being_written_is_not_counted(tmp_path: Path) -> None:
    store = _state(tmp_path / "out").scans
    store.save(3, _scans()[1])
    (tmp_path / "out" / ".wsishard" / "scan" / ".0000004.npz.tmp-99").write_bytes(b"")  # killed mid-write
    assert store.scanned() == {3}


def test_done_shards_round_trip_with_their_excluded_slides(tmp_path: Path) -> None:
    state = _state(tmp_path / "out")
    assert state.load_done() == {}
    record = ShardRecord(name="shard-000003.tar", samples=12, bytes=40_960, sha256="ab" * 32, slides=2)
    written = ShardDone(3, record=record, patches_by_slide={0: 5, 2: 7})
    empty = ShardDone(4)  # every block of it belonged to excluded slides
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "shard-000003.tar").write_bytes(bytes(40_960))  # a done record stands for its shard's file
    state.save_done(written, "shard-000003.tar", frozenset({1}))
    state.save_done(empty, "shard-000004.tar", frozenset({0, 2}))
    done = _state(tmp_path / "out").load_done()
    assert sorted(done) == [3, 4]
    assert done[3] == (written, frozenset({1}))
    assert done[4] == (empty, frozenset({0, 2}))


def test_failed_slides_are_kept_per_part_in_their_own_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    whole, first, second = _state(out), _state(out, part=(1, 2)), _state(out, part=(2, 2))
    assert first.load_failed() == {}
    first.save_failed({4: "extraction: broken tile"})
    second.save_failed({7: "cannot open", 9: "truncated"})
    names = sorted(p.name for p in (out / ".wsishard").iterdir())
    assert names == ["failed.part-0001-of-0002.json", "failed.part-0002-of-0002.json"]
    assert first.load_failed() == {4: "extraction: broken tile"}
    assert second.load_failed() == {7: "cannot open", 9: "truncated"}
    assert whole.load_failed() == {}
    whole.save_failed({1: "x"})
    assert "failed.json" in {p.name for p in (out / ".wsishard").iterdir()}
    assert first.load_failed() == {4: "extraction: broken tile"} and whole.load_failed() == {1: "x"}


def test_a_done_record_being_written_by_another_part_is_not_read(tmp_path: Path) -> None:
    """Parts of a cluster build write their done records into one folder at once; one half-written (under its
    temporary name, still empty) must not break another part's resume (it did: JSONDecodeError)."""
    state = _state(tmp_path / "out")
    record = ShardRecord(name="shard-000000.tar", samples=3, bytes=10240, sha256="0" * 64, slides=1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "shard-000000.tar").write_bytes(bytes(10240))
    state.save_done(ShardDone(0, record, {0: 3}), "shard-000000.tar", frozenset())
    done_dir = tmp_path / "out" / ".wsishard" / "done"
    (done_dir / ".shard-000001.tar.json.tmp-4242").write_bytes(b"")  # another part's record, being written
    assert list(state.load_done()) == [0]


# ---- claim: what is kept, what is removed ----------------------------------------------------------------------


def test_a_folder_of_other_files_is_refused_or_built_beside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    put_files(out, "notes.txt", "qc/notes.txt", "manifest_of_patients.xlsx")
    with pytest.raises(OptionError, match=r"holds 3 files that are not a wsishard build \(manifest_of_patients"):
        _state(out).claim(overwrite=False)
    _state(out).claim(overwrite=True, stamps={"/slides/a.svs": {"size": 1, "mtime_ns": 1}})
    assert files_under(out) == [".wsishard/build.json", "manifest_of_patients.xlsx", "notes.txt", "qc/notes.txt"]


@pytest.mark.parametrize(
    "theirs",
    ["shard-000000.tar", "manifest.json", "manifest.part-0001-of-0002.json", "qc/a.png", ".shard-000003.tar.tmp-42"],
)
def test_overwrite_never_builds_over_a_file_that_is_not_a_builds(tmp_path: Path, theirs: str) -> None:
    out = tmp_path / "out"
    put_files(out, theirs, "notes.txt")
    with pytest.raises(OptionError, match=f"names a build writes \\({theirs}\\)"):
        _state(out).claim(overwrite=True, stamps={"/slides/a.svs": {"size": 1, "mtime_ns": 1}})
    assert files_under(out) == sorted([theirs, "notes.txt"])


def test_overwrite_removes_what_the_previous_build_recorded_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    old = _state(out, "old")
    old.claim(overwrite=False)
    shard = ShardRecord(name="shard-000001.tar", samples=1, bytes=1, sha256="0" * 64)
    manifest = Manifest(
        options={},
        shards=[shard],
        slides=[SlideRecord(slide_id="s", file="s.svs", status="ok")],
        extra={"fingerprint": "old", "part": [1, 2]},
    )
    (out / "manifest.part-0001-of-0002.json").write_text(manifest.to_json())
    put_files(
        out,
        ".wsishard/done/shard-000000.tar.json",
        ".wsishard/scan.json",
        "shard-000000.tar",
        "shard-000001.tar",
        ".shard-000002.tar.tmp-7",
        "qc/s.png",
        "qc/.s.png.tmp-7",
        "shard-000009.tar",
        "manifest.json",
        "qc/annotated.png",
        "notes.txt",
        "shard-plan.docx",
        "manifest_of_patients.xlsx",
    )
    (out / ".wsishard" / "scan.json").write_text("[]")
    caplog.set_level(logging.INFO, logger="wsishard")
    _state(out).claim(overwrite=True)
    assert files_under(out) == [
        ".wsishard/build.json",
        "manifest.json",
        "manifest_of_patients.xlsx",
        "notes.txt",
        "qc/annotated.png",
        "shard-000009.tar",
        "shard-plan.docx",
    ]
    messages = [r.getMessage() for r in caplog.records]
    assert any("removing 2 shards, 1 manifests, 1 QC pictures" in m for m in messages)
    assert any("keeping 1 files named like shards" in m and "shard-000009.tar" in m for m in messages)


def test_a_changed_slide_is_named_and_refused_until_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stamps = {"/s/a.svs": {"size": 10, "mtime_ns": 1}, "/s/b.svs": {"size": 20, "mtime_ns": 2}}
    _state(out).claim(overwrite=False, stamps=stamps)
    put_files(out, "shard-000000.tar", ".wsishard/done/shard-000000.tar.json")
    _state(out).claim(overwrite=False, stamps=stamps)  # unchanged: resumed
    changed = {**stamps, "/s/b.svs": {"size": 20, "mtime_ns": 3}}
    with pytest.raises(OptionError, match=r"slides changed since this build began \(/s/b\.svs\).*--overwrite"):
        _state(out).claim(overwrite=False, stamps=changed)
    _state(out, part=(1, 2)).claim(overwrite=True, stamps=stamps)  # a part resumes the same, unchanged build
    assert (out / "shard-000000.tar").exists()
    _state(out).claim(overwrite=True, stamps=changed)  # replaced: its shards and state removed
    assert files_under(out) == [".wsishard/build.json"]
    assert json.loads((out / ".wsishard" / "build.json").read_text())["inputs"] == changed


def test_input_stamps_follow_size_and_modification_time(tmp_path: Path) -> None:
    a, b = tmp_path / "a.svs", tmp_path / "b.svs"
    a.write_bytes(b"aaaa")
    b.write_bytes(b"bbbb")
    first = input_stamps([str(a), str(b)])
    assert first == input_stamps([str(a), str(b)]) and first[str(a)]["size"] == 4
    os.utime(b, ns=(b.stat().st_atime_ns, b.stat().st_mtime_ns + 10**9))
    second = input_stamps([str(a), str(b)])
    assert second[str(a)] == first[str(a)] and second[str(b)] != first[str(b)]


def test_the_qc_picture_of_a_slide_named_by_its_dicom_series_is_the_builds_own(tmp_path: Path) -> None:
    """A build interrupted before its manifest knows its pictures by the slides' names (a DICOM series': its
    ContainerIdentifier, not its first file's stem): a build replacing it removes them, and keeps what is not its."""
    out = tmp_path / "out"
    stamps = {"/s/boxes_0.dcm": {"size": 10, "mtime_ns": 1}}
    names = {"/s/boxes_0.dcm": "SLIDE_1"}
    BuildState(Destination(str(out)), DIGEST, names=names).claim(overwrite=False, stamps=stamps)
    put_files(out, "qc/SLIDE_1.png", "qc/boxes_0.png")
    BuildState(Destination(str(out)), "another", names=names).claim(overwrite=True, stamps=stamps)
    assert files_under(out) == [".wsishard/build.json", "qc/boxes_0.png"]  # boxes_0.png: no slide of the build's
