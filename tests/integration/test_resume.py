"""Resumable builds (SIGKILL mid-way, then the same command again), option changes, and part/merge builds."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from buildtools import SMALL_BUILD, SMALL_BUILD_ARGS, read_output

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.merge import merge
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.grid import PatchOptions
from wsishard.errors import ManifestError, OptionError

ARGS = SMALL_BUILD_ARGS  # the CLI spelling of SMALL_BUILD: a CLI build must equal the API-built reference


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wsishard.cli", *args], capture_output=True, text=True, timeout=600)


def _same_output(a: Path, b: Path) -> None:
    ma, sa = read_output(str(a))
    mb, sb = read_output(str(b))
    assert [(s.name, s.sha256, s.samples) for s in ma.shards] == [(s.name, s.sha256, s.samples) for s in mb.shards]
    assert ma.slides == mb.slides
    assert [s.key for s in sa] == [s.key for s in sb]
    assert sorted(p.name for p in a.glob("shard-*.tar")) == sorted(p.name for p in b.glob("shard-*.tar"))


def test_resume_after_sigkill_gives_the_uninterrupted_result(cohort: Path, cohort_build: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "wsishard.cli", "build", str(cohort), "-o", str(out), "--jobs", "1", *ARGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = out / ".wsishard" / "done"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if done.is_dir() and len(os.listdir(done)) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert not (out / "manifest.json").exists()
    finished_before = set(os.listdir(done))
    mtimes = {n: (done / n).stat().st_mtime_ns for n in finished_before}
    again = _cli("build", str(cohort), "-o", str(out), "--jobs", "2", *ARGS)
    assert again.returncode == 0, again.stderr
    assert all((done / n).stat().st_mtime_ns == mtimes[n] for n in finished_before)  # finished shards skipped
    assert len(os.listdir(done)) > len(finished_before)
    _same_output(out, cohort_build)
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


def test_rerun_of_a_finished_build_changes_nothing(cohort: Path, cohort_build: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = dataclasses.replace(SMALL_BUILD, jobs=1)
    first = build([str(cohort)], str(out), opts)
    assert first.shards == read_output(str(cohort_build))[0].shards  # one job or two: the same shards
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    second = build([str(cohort)], str(out), opts)
    assert first.shards == second.shards
    assert stamps == {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}


@pytest.mark.parametrize("finished", [True, False])
def test_a_rerun_rewrites_shards_deleted_truncated_or_altered_since(
    cohort: Path, cohort_build: Path, tmp_path: Path, finished: bool
) -> None:
    out = tmp_path / "out"
    shutil.copytree(cohort_build, out)  # times kept: the shards are older than their done records, as written
    if not finished:  # interrupted before its manifest
        (out / "manifest.json").unlink()
    shards = sorted(out.glob("shard-*.tar"))
    assert len(shards) >= 4
    shards[0].unlink()
    with open(shards[1], "r+b") as fh:
        fh.truncate(shards[1].stat().st_size // 2)
    with open(shards[2], "r+b") as fh:  # the same size, a block of zeros in the middle
        fh.seek(shards[2].stat().st_size // 2)
        fh.write(bytes(4096))
    kept = {p.name: p.stat().st_mtime_ns for p in shards[3:]}
    stem = shards[3].name.removesuffix(".tar")  # a writer killed between writing a file and renaming it:
    (out / f".{stem}.tar.tmp-99999").write_bytes(b"partial")
    (out / f".{stem}.idx.npz.tmp-99999").write_bytes(b"partial")
    again = _cli("build", str(cohort), "-o", str(out), "--jobs", "2", *ARGS)
    assert again.returncode == 0, again.stderr
    for shard, damage in zip(shards, ("is missing", "holds", "was altered"), strict=False):
        assert f"{shard.name}, recorded as written, {damage}" in again.stderr
    _same_output(out, cohort_build)
    assert all(out.joinpath(n).read_bytes() == cohort_build.joinpath(n).read_bytes() for n in (p.name for p in shards))
    assert kept == {n: out.joinpath(n).stat().st_mtime_ns for n in kept}  # intact shards are not rewritten
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]  # leftovers of the killed writer removed


def test_other_options_are_refused_unless_overwrite(cohort: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    build([str(cohort)], str(out), BuildOptions(patch=PatchOptions(patch_size_px=64), shard_samples=25, jobs=1))
    other = BuildOptions(patch=PatchOptions(patch_size_px=64), shard_samples=40, jobs=1)
    with pytest.raises(OptionError, match="--overwrite") as info:
        build([str(cohort)], str(out), other)
    assert "option shard_samples 25 -> 40)" in str(info.value)  # what changed, old and new (and the block side)
    proc = _cli("build", str(cohort), "-o", str(out), "--patch-size", "64", "--shard-samples", "40", "-q")
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and "Traceback" not in proc.stderr
    assert "option shard_samples 25 -> 40" in proc.stderr
    first, *rest = sorted(str(p) for p in cohort.iterdir())
    same = BuildOptions(patch=PatchOptions(patch_size_px=64), shard_samples=25, jobs=1)
    with pytest.raises(OptionError, match=rf"\(slides removed: {os.path.basename(first)}\); re-run"):
        build(rest, str(out), same)
    manifest = build([str(cohort)], str(out), other, overwrite=True)
    assert manifest.options["shard_samples"] == 40
    assert sorted(p.name for p in out.glob("shard-*.tar")) == [s.name for s in manifest.shards]


def test_three_parts_in_separate_processes_merge_to_the_single_build(
    cohort: Path, cohort_build: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "wsishard.cli",
                "build",
                str(cohort),
                "-o",
                str(out),
                "--jobs",
                "1",
                "--part",
                f"{i}/3",
                *ARGS,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (1, 2, 3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    parts = sorted(p.name for p in out.glob("manifest.part-*"))
    assert parts == [f"manifest.part-000{i}-of-0003.json" for i in (1, 2, 3)]
    assert all(json.loads((out / n).read_text())["shards"] for n in parts)  # every part did some of the work
    assert not (out / "manifest.json").exists()
    proc = _cli("merge", str(out))
    assert proc.returncode == 0, proc.stderr
    _same_output(out, cohort_build)


def test_merge_names_missing_parts(cohort: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = dataclasses.replace(SMALL_BUILD, jobs=1, qc=False)
    build([str(cohort)], str(out), opts, part=(2, 3))
    with pytest.raises(ManifestError, match="parts 1, 3 of 3 are not finished"):
        merge(str(out))


def test_merge_names_a_part_whose_slide_records_are_missing(cohort: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = dataclasses.replace(SMALL_BUILD, jobs=1, qc=False)
    for i in (1, 2):
        build([str(cohort)], str(out), opts, part=(i, 2))
    (out / "slides.part-0002-of-0002.jsonl").unlink()  # lost in a copy, say
    with pytest.raises(ManifestError, match=r"slides\.part-0002-of-0002\.jsonl.*not found"):
        merge(str(out))
    assert not (out / "manifest.json").exists()  # nothing half-merged


def test_slurm_array_environment_gives_the_part() -> None:
    from wsishard.builder.plan.parts import slurm_part

    assert slurm_part({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4"}) == (1, 4)
    assert slurm_part({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "4"}) == (
        4,
        4,
    )
    assert slurm_part({}) is None
