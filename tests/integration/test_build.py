"""The build end to end on generated slides: shards, manifest, mixing, bad input, reproducibility."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tifffile
from buildtools import read_output

from wsishard.builder.inputs.roi import RoiOptions
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.grid import PatchOptions
from wsishard.errors import OptionError, SlideError
from wsishard.report import summary
from wsishard.slide import open_slide
from wsishard.testing.synthetic import make_slide, make_slides

SMALL = PatchOptions(target_mpp=0.5, patch_size_px=64, min_tissue=0.5)


@pytest.fixture(scope="module")
def many_slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 small generated slides (2048x2048 at 0.25 mpp), svs and tiff alternating."""
    folder = tmp_path_factory.mktemp("many")
    make_slides(folder, 24, seed=11, width=2048, height=2048)
    return folder


@pytest.fixture(scope="module")
def mixed_build(many_slides: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mixed") / "out"
    build([str(many_slides)], str(out), BuildOptions(patch=SMALL, shard_samples=300, jobs=2, seed=1))
    return out


def test_every_patch_decodes_with_metadata_and_unique_keys(mixed_build: Path) -> None:
    manifest, samples = read_output(str(mixed_build))
    assert not manifest.failed_slides
    assert len(samples) == manifest.total_samples > 0
    keys = [s.key for s in samples]
    assert len(set(keys)) == len(keys)
    for s in samples:
        assert "." not in s.key and "/" not in s.key
        assert s.image().shape == (64, 64, 3)
        meta = s.meta
        assert s.key == f"{meta['slide_id']}_x{meta['x']}_y{meta['y']}"
        assert meta["extent"] == 128 and meta["patch_size"] == 64 and meta["patch_mpp"] == 0.5 and meta["level"] == 0
        assert meta["tissue"] >= 0.5 and meta["file"].startswith("slide-")
    per_slide = Counter(s.meta["slide_id"] for s in samples)
    assert {r.slide_id: r.patches for r in manifest.slides} == dict(per_slide)


def test_shards_mix_slides(mixed_build: Path) -> None:
    manifest, samples = read_output(str(mixed_build))
    assert len(manifest.shards) >= 4
    block = 4 * 4
    for record in manifest.shards:
        slides = [s.meta["slide_id"] for s in samples if s.shard == record.name]
        assert len(set(slides)) >= 0.75 * 24, f"{record.name} mixes only {len(set(slides))} slides"
        longest = max(len(list(run)) for _, run in itertools.groupby(slides))
        assert longest <= block, f"{record.name} has a run of {longest} samples from one slide"
        assert record.slides == len(set(slides))


def test_manifest_records_options_and_slides(mixed_build: Path) -> None:
    manifest, _ = read_output(str(mixed_build))
    assert manifest.options["patch"]["patch_size_px"] == 64 and manifest.options["seed"] == 1
    for slide in manifest.slides:
        assert slide.status == "ok" and slide.slide_mpp == pytest.approx(0.25) and slide.mpp_source == "openslide"
        assert (slide.width, slide.height) == (2048, 2048)
        assert 0.1 < slide.tissue_fraction < 0.6 and slide.candidates >= slide.patches > 0
    assert not (mixed_build / "qc").exists()  # a default build draws no QC picture: inspect --qc does (issue 33)


def test_reproducible_across_jobs_and_seed_dependent(many_slides: Path, mixed_build: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    other = tmp_path / "other"
    build([str(many_slides)], str(again), BuildOptions(patch=SMALL, shard_samples=300, jobs=1, seed=1, qc=False))
    build([str(many_slides)], str(other), BuildOptions(patch=SMALL, shard_samples=300, jobs=1, seed=2, qc=False))
    first, _ = read_output(str(mixed_build))
    second, _ = read_output(str(again))
    third, _ = read_output(str(other))
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in second.shards]
    assert [s.sha256 for s in first.shards] != [s.sha256 for s in third.shards]


def _corrupt_level0_tile(path: Path) -> None:
    """Zero the start of a level-0 tile in the middle of the slide (a JPEG decode error at extraction)."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        n = len(page.dataoffsets)
        offsets = [page.dataoffsets[i] for i in range(n) if page.databytecounts[i] > 0]
    with open(path, "r+b") as fh:
        for offset in offsets[n // 3 : 2 * n // 3]:
            fh.seek(offset)
            fh.write(b"\0" * 64)


@pytest.fixture(scope="module")
def bad_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    folder = tmp_path_factory.mktemp("bad")
    make_slides(folder, 3, seed=5, width=2048, height=2048)
    make_slide(folder / "no-mpp.svs", width=2048, height=2048, include_mpp=False, seed=6)
    make_slide(folder / "blank.svs", width=2048, height=2048, tissue=False, seed=7)
    make_slide(folder / "tiny.tif", width=96, height=96, seed=8)
    (folder / "notes.svs").write_text("this is not a slide\n")
    make_slide(folder / "truncated.svs", width=2048, height=2048, seed=9)
    size = (folder / "truncated.svs").stat().st_size
    with open(folder / "truncated.svs", "r+b") as fh:
        fh.truncate(size // 2)
    make_slide(folder / "corrupt.svs", width=2048, height=2048, seed=10)
    _corrupt_level0_tile(folder / "corrupt.svs")
    out = tmp_path_factory.mktemp("badout") / "out"
    opts = BuildOptions(patch=SMALL, shard_samples=40, shard_size_bytes=None, jobs=2)
    return out, build([str(folder)], str(out), opts)


@pytest.mark.parametrize(
    ("file", "reason"),
    [
        ("no-mpp.svs", "no microns-per-pixel"),
        ("blank.svs", "no tissue"),
        ("tiny.tif", "smaller than one 64 px patch"),
        ("notes.svs", "cannot open"),
        ("truncated.svs", ""),
        ("corrupt.svs", "extraction"),
    ],
)
def test_bad_slides_are_recorded_and_leave_nothing_behind(bad_build: tuple, file: str, reason: str) -> None:
    out, manifest = bad_build
    record = next(s for s in manifest.slides if os.path.basename(s.file) == file)
    assert record.status == "failed" and reason in record.reason and "\n" not in record.reason
    assert record.patches == 0
    _, samples = read_output(str(out))
    assert not [s for s in samples if s.meta["slide_id"] == record.slide_id]


def test_good_slides_still_built_next_to_bad_ones(bad_build: tuple) -> None:
    out, manifest = bad_build
    ok = [s for s in manifest.slides if s.status == "ok"]
    assert sorted(os.path.basename(s.file) for s in ok) == ["slide-000.svs", "slide-001.tif", "slide-002.svs"]
    _, samples = read_output(str(out))
    assert Counter(s.meta["slide_id"] for s in samples) == {s.slide_id: s.patches for s in ok}
    assert not [n for n in os.listdir(out) if ".tmp-" in n]


def test_mpp_override_and_default(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    make_slide(tmp_path / "in" / "a.svs", width=2048, height=2048, include_mpp=False, seed=1)
    make_slide(tmp_path / "in" / "b.svs", width=2048, height=2048, seed=2)
    opts = BuildOptions(patch=SMALL, default_mpp=0.25, mpp_overrides={"b.svs": 0.5}, jobs=1, qc=False)
    manifest = build([str(tmp_path / "in")], str(tmp_path / "out"), opts)
    by_file = {os.path.basename(s.file): s for s in manifest.slides}
    assert (by_file["a.svs"].slide_mpp, by_file["a.svs"].mpp_source) == (0.25, "default")
    assert (by_file["b.svs"].slide_mpp, by_file["b.svs"].mpp_source) == (0.5, "csv")
    _, samples = read_output(str(tmp_path / "out"))
    extents = {s.meta["slide_id"]: s.meta["extent"] for s in samples}
    assert extents == {"a": 128, "b": 64}  # 0.5 mpp slide: one level-0 px per output px


def test_labels_lossless_format_and_patch_cap(tmp_path: Path) -> None:
    make_slides(tmp_path / "in", 2, seed=3, width=2048, height=2048)
    opts = BuildOptions(
        patch=PatchOptions(target_mpp=0.5, patch_size_px=64, max_patches_per_slide=7),
        image_format="png",
        labels={"slide-000": 3, "slide-001.tif": 1},
        jobs=1,
        qc=False,
    )
    build([str(tmp_path / "in")], str(tmp_path / "out"), opts)
    _, samples = read_output(str(tmp_path / "out"))
    assert Counter(s.meta["slide_id"] for s in samples) == {"slide-000": 7, "slide-001": 7}
    for s in samples:
        assert set(s.members) == {"png", "json", "cls"}
        assert int(s.members["cls"]) == s.meta["label"] == {"slide-000": 3, "slide-001": 1}[s.meta["slide_id"]]


def test_empty_folder_and_missing_input_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(OptionError, match="no slide files"):
        build([str(tmp_path / "empty")], str(tmp_path / "out"))
    with pytest.raises(OptionError, match="no such file or folder"):
        build([str(tmp_path / "nope")], str(tmp_path / "out"))


def test_a_missing_roi_path_is_refused_before_the_output_is_touched(many_slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(OptionError, match=r"--roi: no such file or folder: .*nope"):
        build([str(many_slides)], str(out), BuildOptions(roi=RoiOptions(path=str(tmp_path / "nope"))))
    assert not out.exists()  # nothing claimed: the same command with the right --roi is not refused as another build


def test_slide_list_file(many_slides: Path, tmp_path: Path) -> None:
    names = sorted(os.listdir(many_slides))[:2]
    listing = tmp_path / "slides.txt"
    listing.write_text("# two slides\n" + "".join(f"{many_slides / n}\n" for n in names))
    shutil.copy(many_slides / names[0], tmp_path / names[0])
    manifest = build([str(listing)], str(tmp_path / "out"), BuildOptions(patch=SMALL, jobs=1, qc=False))
    assert sorted(os.path.basename(s.file) for s in manifest.slides) == names
    assert np.all([s.status == "ok" for s in manifest.slides])


def test_workers_see_the_environment_of_their_pool_not_of_the_forkserver(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from wsishard.builder.run.pool import WorkerPool, _fork_is_safe

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)  # a second thread: the pool must not fork directly
    other.start()
    try:
        assert not _fork_is_safe()
        with WorkerPool(2) as pool:  # starts the forkserver (if this process had none yet)
            assert list(pool.imap(os.getenv, ["WSISHARD_TEST_VAR"])) == [None]
        monkeypatch.setenv("WSISHARD_TEST_VAR", "set-later")  # e.g. credentials exported after the first build
        with WorkerPool(2) as pool:
            assert list(pool.imap(os.getenv, ["WSISHARD_TEST_VAR"] * 4)) == ["set-later"] * 4
    finally:
        stop.set()
        other.join()


def test_the_same_slide_twice_is_built_once_and_a_dangling_symlink_is_a_failed_slide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_slides(tmp_path / "in", 2, seed=3, width=2048, height=2048)
    (tmp_path / "in" / "alias.svs").symlink_to(tmp_path / "in" / "slide-000.svs")
    (tmp_path / "in" / "gone.svs").symlink_to(tmp_path / "deleted.svs")
    monkeypatch.chdir(tmp_path)
    manifest = build(
        ["in", str(tmp_path / "in" / "slide-001.tif"), str(tmp_path / "in")],
        str(tmp_path / "out"),
        BuildOptions(patch=SMALL, jobs=1, qc=False),
    )
    by_status = Counter((os.path.basename(s.file), s.status) for s in manifest.slides)
    assert sorted(by_status) == [("gone.svs", "failed"), ("slide-000.svs", "ok"), ("slide-001.tif", "ok")]
    assert set(by_status.values()) == {1}
    gone = next(s for s in manifest.slides if s.file.endswith("gone.svs"))
    assert gone.reason == f"a symlink to {tmp_path / 'deleted.svs'}, which is not there (a dangling link)"
    _, samples = read_output(str(tmp_path / "out"))
    assert {s.meta["slide_id"] for s in samples} == {"slide-000", "slide-001"}


def test_a_72_dpi_tiff_is_said_to_have_wrong_resolution_metadata(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    make_slide(tmp_path / "in" / "screen.tif", width=2048, height=2048, mpp=25400 / 72, seed=4)
    manifest = build([str(tmp_path / "in")], str(tmp_path / "out"), BuildOptions(patch=SMALL, jobs=1, qc=False))
    (record,) = manifest.slides
    assert record.status == "failed"
    assert record.reason.startswith("this slide's resolution metadata looks wrong (72 dpi"), record.reason
    assert "allow-upsample" not in record.reason
    fixed = build(
        [str(tmp_path / "in")], str(tmp_path / "out2"), BuildOptions(patch=SMALL, jobs=1, qc=False, default_mpp=0.25)
    )
    assert (fixed.slides[0].status, fixed.slides[0].mpp_source) == ("ok", "default")


# ---- issue 28, item 12: errors of the machine stop the build; they are no slide's failure -----------------------


def _cli_build(*args: str, open_files: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:  # in the child only: the limit a user sets with ulimit -n
        import resource  # Unix only

        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return subprocess.run(
        [sys.executable, "-m", "wsishard.cli", "build", *args],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE")
def test_running_out_of_file_descriptors_stops_the_build_and_a_rerun_builds_every_slide(tmp_path: Path) -> None:
    made = make_slides(tmp_path / "made", 2, seed=5, width=1024, height=1024)
    (tmp_path / "in").mkdir()
    for i, slide in itertools.product(range(15), made):  # 30 slides: a worker keeps them open as it extracts
        shutil.copy(slide.path, tmp_path / "in" / f"{i:02d}-{Path(slide.path).name}")
    out = tmp_path / "out"
    args = (str(tmp_path / "in"), "-o", str(out), "--patch-size", "64", "--jobs", "1", "-q")
    short = _cli_build(*args, open_files=56)  # enough to scan the slides one by one, not to hold 30 open
    assert short.returncode == 2, short.stderr[-2000:]
    lines = short.stderr.strip().splitlines()
    copies = [line for line in lines if "hold the same bytes" in line]  # 15 copies of each of 2 slides: warned
    assert len(copies) == 2 and len(lines) == 3 and "Traceback" not in short.stderr
    assert "too many open files" in short.stderr and "the limit is 56" in short.stderr
    assert "run the build again" in short.stderr
    assert not (out / "manifest.json").exists() and not (out / ".wsishard" / "failed.json").exists()
    again = _cli_build(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    manifest, samples = read_output(str(out))
    assert len(manifest.slides) == 30 and not manifest.failed_slides
    assert {s.meta["slide_id"] for s in samples} == {s.slide_id for s in manifest.slides}


# ---- issue 28, item 3: damaged JPEG tiles on the fast path -------------------------------------------------------


def test_a_slide_with_tiles_that_end_early_fails_and_leaves_no_patch(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    make_slide(tmp_path / "in" / "good.svs", width=2048, height=2048, mpp=0.5, seed=11)
    bad = make_slide(tmp_path / "in" / "bad.svs", width=2048, height=2048, mpp=0.5, seed=12)
    with tifffile.TiffFile(bad.path) as tif:  # at 0.5 mpp level 0 is read as stored: full-size tile decodes
        offsets, counts = tif.pages[0].dataoffsets, tif.pages[0].databytecounts
    with open(bad.path, "r+b") as fh:
        for t in range(0, len(offsets), 2):  # every other tile's second half zeroed, as a copy cut short leaves it
            fh.seek(offsets[t] + counts[t] // 2)
            fh.write(bytes(counts[t] - counts[t] // 2))
    manifest = build([str(tmp_path / "in")], str(tmp_path / "out"), BuildOptions(jobs=1))
    status = {s.slide_id: (s.status, s.reason) for s in manifest.slides}
    assert status["good"] == ("ok", "")
    assert status["bad"][0] == "failed" and "is corrupt: its JPEG data ends before its end marker" in status["bad"][1]
    _, samples = read_output(str(tmp_path / "out"))
    assert samples and {s.meta["slide_id"] for s in samples} == {"good"}


@pytest.mark.parametrize("fast_path", [True, False])
def test_shards_sized_in_bytes_come_out_near_the_size_asked(many_slides: Path, tmp_path: Path, fast_path: bool) -> None:
    """``--shard-size`` plans shards from each slide's estimated bytes a sample: encoded patches scaled by the tiles'
    compressed sizes where the direct reader knows them (the fast path), the mean of a few encoded patches through
    OpenSlide. Either way the full shards land near the size asked: on average within 15%, each within 30% (a
    shard holds whole read blocks of 16 samples, and these small patches' sizes vary from slide to slide)."""
    out = tmp_path / "out"
    manifest = build(
        [str(many_slides)],
        str(out),
        BuildOptions(patch=SMALL, shard_size_bytes=600_000, fast_path=fast_path, jobs=2, seed=3),
    )
    sizes = [record.bytes for record in manifest.shards]
    assert len(sizes) >= 4, sizes
    full = sizes[:-1]  # the last shard holds what is left
    assert 0.85 * 600_000 <= sum(full) / len(full) <= 1.15 * 600_000, sizes
    assert all(0.7 * 600_000 <= size <= 1.3 * 600_000 for size in full), sizes


# ---- issue 42: tiles overwritten in their middle, their end marker kept ----------------------------------------


def _scramble_tile_middles(path: str, every: int) -> int:
    """Overwrite 96 bytes in the middle of every ``every``-th level-0 tile with seeded noise that holds no ``FF``
    (so no marker), each tile's end marker kept: libjpeg decodes garbage after a "Corrupt JPEG data" warning
    (OpenSlide makes that warning an error). Returns how many tiles were hit."""
    with tifffile.TiffFile(path) as tif:
        offsets, counts = tif.pages[0].dataoffsets, tif.pages[0].databytecounts
    noise = np.random.default_rng(42)
    hit = 0
    with open(path, "r+b") as fh:
        for t in range(0, len(offsets), every):
            if counts[t] < 1024:  # glass-only tiles are a few hundred bytes
                continue
            fh.seek(offsets[t] + counts[t] // 2 - 48)
            fh.write(noise.integers(0, 255, 96, dtype=np.uint8).tobytes())
            hit += 1
    return hit


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_slide_with_tiles_scrambled_in_their_middle_fails_on_either_path(tmp_path: Path, fast_path: bool) -> None:
    (tmp_path / "in").mkdir()
    make_slide(tmp_path / "in" / "good.svs", width=2048, height=2048, mpp=0.5, seed=11)
    bad = make_slide(tmp_path / "in" / "bad.svs", width=2048, height=2048, mpp=0.5, seed=12)
    assert _scramble_tile_middles(bad.path, every=3) >= 5
    options = BuildOptions(jobs=1, fast_path=fast_path)
    manifest = build([str(tmp_path / "in")], str(tmp_path / "out"), options)
    status = {s.slide_id: (s.status, s.reason, s.patches) for s in manifest.slides}
    assert status["good"][:2] == ("ok", "") and status["good"][2] > 0
    assert status["bad"][0] == "failed" and status["bad"][2] == 0, status["bad"]
    assert "Corrupt JPEG data" in status["bad"][1] and "\n" not in status["bad"][1]
    assert [f.slide_id for f in manifest.failed_slides] == ["bad"]
    assert f"FAILED bad.svs: {status['bad'][1]}" in summary(manifest).splitlines()[-1]
    _, samples = read_output(str(tmp_path / "out"))
    assert samples and {s.meta["slide_id"] for s in samples} == {"good"}
    assert len(samples) == status["good"][2]


@pytest.mark.parametrize("mpp", [0.25, 0.5])
def test_scrambled_tiles_are_refused_at_every_decode_scale(tmp_path: Path, mpp: float) -> None:
    """0.5 mpp reads level 0 as stored (full-size decodes); 0.25 mpp reads it at 1/2 (libjpeg's scaled decode)."""
    bad = make_slide(tmp_path / "bad.svs", width=1024, height=1024, mpp=0.25, seed=12)
    assert _scramble_tile_middles(bad.path, every=1) >= 4
    with open_slide(bad.path) as slide, pytest.raises(SlideError, match="is corrupt \\(Corrupt JPEG data"):
        if mpp == 0.5:
            slide.read_level(0, 0, 0, 1024, 1024)
        else:
            slide.read_level_reduced(0, 0, 0, 1024, 1024, 2)
