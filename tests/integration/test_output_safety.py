"""Nothing lost, nothing silently wrong (issue 12): ``--overwrite`` removes only the build's own files, one build at
a time writes an output, a slide replaced before a resume is noticed, and an output that cannot be written stops
the build instead of becoming the slides' cached failure."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from buildtools import read_output

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.orchestrate import build
from wsishard.builder.run.stamps import input_stamps
from wsishard.builder.run.state import BuildState
from wsishard.builder.scan.grid import PatchOptions
from wsishard.errors import OptionError, OutputError, WsiShardError
from wsishard.storage.output import Destination
from wsishard.testing.synthetic import make_slides

if TYPE_CHECKING:
    from servers import S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(300)

FAST = BuildOptions(patch=PatchOptions(patch_size_px=64), jobs=1, qc=False)
WITH_QC = dataclasses.replace(FAST, qc=True)
FOREIGN = {"qc/notes.txt": b"my notes", "manifest_of_patients.xlsx": b"patients", "shard-plan.docx": b"the plan"}


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small generated slides (2048x2048 px): ``slide-000.svs``, ``slide-001.tif``. Read-only."""
    folder = tmp_path_factory.mktemp("two-slides")
    make_slides(folder, 2, seed=3, width=2048, height=2048)
    return folder


def _put(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wsishard.cli", *args], capture_output=True, text=True, timeout=300)


def _locks(out: Path) -> list[str]:
    return sorted(p.name for p in (out / ".wsishard").glob("lock*")) if (out / ".wsishard").is_dir() else []


# ---- 1. --overwrite deletes only what the build wrote -----------------------------------------------------------


def test_overwrite_into_a_folder_without_a_build_deletes_nothing(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "u"
    _put(out, FOREIGN)
    manifest = build([str(slides)], str(out), WITH_QC, overwrite=True)
    assert {k: v for k, v in _files(out).items() if k in FOREIGN} == FOREIGN
    assert len(manifest.slides) == 2 and not manifest.failed_slides
    assert sorted(p.name for p in out.glob("shard-*.tar")) == [s.name for s in manifest.shards]
    assert sorted(p.name for p in (out / "qc").iterdir()) == [
        "index.html",
        "notes.txt",
        "slide-000.png",
        "slide-001.png",
    ]


def test_a_folder_of_other_files_is_refused_and_left_as_it_was(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "u"
    _put(out, FOREIGN)
    with pytest.raises(OptionError, match="not a wsishard build") as info:
        build([str(slides)], str(out), FAST)
    message = str(info.value)
    assert "manifest_of_patients.xlsx" in message and "shard-plan.docx" in message and "qc" in message
    assert "empty or new folder" in message and "\n" not in message
    assert _files(out) == FOREIGN and sorted(p.name for p in out.iterdir()) == sorted(
        ["qc", "manifest_of_patients.xlsx", "shard-plan.docx"]
    )  # nothing written, no state folder left behind
    proc = _cli("build", str(slides), "-o", str(out), "--patch-size", "64", "--no-qc", "-q")
    assert proc.returncode == 2 and "not a wsishard build" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_overwrite_never_replaces_a_file_the_build_did_not_write(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "u"
    theirs = {"shard-000000.tar": b"someone else's shard", "manifest.json": b"{}", "notes.txt": b"n"}
    _put(out, theirs)
    with pytest.raises(OptionError, match=r"shard-000000\.tar") as info:
        build([str(slides)], str(out), FAST, overwrite=True)
    assert "manifest.json" in str(info.value) and "notes.txt" not in str(info.value)
    assert _files(out) == theirs and not (out / ".wsishard").exists()


def test_overwriting_a_previous_build_removes_its_files_and_nothing_else(
    slides: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    first = build([str(slides)], str(out), dataclasses.replace(WITH_QC, shard_samples=20))
    mine = {**FOREIGN, "qc/annotated.png": b"my picture", "shard-000001.tar.md5": b"sum", "logs/part-1.log": b"log"}
    _put(out, mine)
    caplog.set_level(logging.INFO, logger="wsishard")
    second = build([str(slides)], str(out), dataclasses.replace(WITH_QC, shard_samples=60), overwrite=True)
    assert len(second.shards) < len(first.shards)
    assert {k: v for k, v in _files(out).items() if k in mine} == mine
    assert sorted(p.name for p in out.glob("shard-*.tar")) == [s.name for s in second.shards]
    assert sorted(p.name for p in (out / "qc").iterdir()) == [
        "annotated.png",
        "index.html",
        "notes.txt",
        "slide-000.png",
        "slide-001.png",
    ]
    removing = [r.getMessage() for r in caplog.records if "removing" in r.getMessage()]
    assert len(removing) == 1 and f"{len(first.shards)} shards" in removing[0] and "2 QC pictures" in removing[0]


# ---- 2. one build at a time ------------------------------------------------------------------------------------

_HOLDER = """
import sys
from wsishard.builder.scan.grid import PatchOptions
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.orchestrate import build

held = []

def hold(event):  # the first slide is scanned: say so, and hold the output until the test closes our stdin
    if not held:
        held.append(event)
        print("holding", flush=True)
        sys.stdin.readline()

build([sys.argv[1]], sys.argv[2], BuildOptions(patch=PatchOptions(patch_size_px=128), jobs=1, qc=False),
      progress=hold)
"""


def test_a_second_build_is_refused_while_the_first_writes_the_output(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(slides), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert first.stdin is not None and first.stdout is not None and first.stderr is not None
    try:
        assert first.stdout.readline() == "holding\n", first.stderr.read()  # it holds the output, claimed
        assert (out / ".wsishard" / "build.json").exists()
        with pytest.raises(OptionError) as info:
            build([str(slides)], str(out), FAST, overwrite=True)  # other options, 64 px
        message = str(info.value)
        assert f"pid {first.pid}" in message and "started" in message and "other slides or options" in message
        proc = _cli("build", str(slides), "-o", str(out), "--patch-size", "64", "--no-qc", "-q", "--overwrite")
        assert proc.returncode == 2 and f"pid {first.pid}" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        _, err = first.communicate("go\n", timeout=120)  # let it go on
    assert first.returncode == 0, err
    manifest, samples = read_output(str(out))
    assert manifest.options["patch"]["patch_size_px"] == 128
    assert samples and all(s.image().shape == (128, 128, 3) for s in samples)  # nothing of the refused build
    assert _locks(out) == []
    again = build([str(slides)], str(out), FAST, overwrite=True)  # the first has ended: the output is free
    assert again.options["patch"]["patch_size_px"] == 64


def test_the_lock_is_released_on_error_and_interrupt(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def interrupt(event: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build([str(slides)], str(out), FAST, progress=interrupt)
    assert _locks(out) == [] and (out / ".wsishard" / "build.json").exists()
    with pytest.raises(OptionError, match="--overwrite"):
        build([str(slides)], str(out), dataclasses.replace(FAST, seed=7))
    assert _locks(out) == []
    manifest = build([str(slides)], str(out), FAST)  # resumed, not refused by a leftover lock
    assert len(manifest.slides) == 2 and not manifest.failed_slides


def test_the_lock_of_a_crashed_build_is_taken_over(
    slides: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / ".wsishard").mkdir(parents=True)
    lock = {
        "fingerprint": "a crashed build",
        "part": None,
        "host": os.uname().nodename,
        "pid": int(dead.stdout),
        "token": "0123",
        "started": "2020-01-01T00:00:00+00:00",
        "refreshed_s": time.time(),
    }
    (out / ".wsishard" / "lock.json").write_text(json.dumps(lock))
    caplog.set_level(logging.WARNING, logger="wsishard")
    manifest = build([str(slides)], str(out), FAST, overwrite=True)
    assert len(manifest.slides) == 2 and _locks(out) == []
    assert any(
        f"pid {dead.stdout.strip()}" in r.getMessage() and "not running" in r.getMessage() for r in caplog.records
    )


def test_parts_share_the_output_and_a_whole_build_waits_for_them(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    options = dataclasses.replace(FAST, group_slides=1)
    first = build([str(slides)], str(out), options, part=(1, 2))
    digest = json.loads((out / ".wsishard" / "build.json").read_text())["fingerprint"]
    with BuildState(Destination(str(out)), digest, (1, 2)).lock:  # part 1 runs (again)
        second = build([str(slides)], str(out), options, part=(2, 2))  # part 2 is not refused
        assert first.shards and second.shards
        with pytest.raises(OptionError, match="part 1/2 of this build"):
            build([str(slides)], str(out), options)  # a whole build of the same slides and options
        with pytest.raises(OptionError, match="part 1/2 of another build"):
            build([str(slides)], str(out), dataclasses.replace(options, seed=9), part=(2, 2), overwrite=True)
    assert _locks(out) == []


def test_an_s3_output_is_locked_by_a_conditional_create(
    s3: S3Server, s3_bucket: str, slides: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://{s3_bucket}/out"
    dest = Destination(url, s3.storage_options)
    assert dest.create_exclusive("probe.json", b"first") is True
    assert dest.create_exclusive("probe.json", b"second") is False
    with monkeypatch.context() as mp:
        mp.setattr(dest.fs, "exists", lambda path: False)  # another creator got in after the existence check
        assert dest.create_exclusive("probe.json", b"third") is False  # If-None-Match: * refused the PUT
    assert dest.read_bytes("probe.json") == b"first"
    dest.remove("probe.json")
    with BuildState(dest, "another build").lock, pytest.raises(OptionError, match="other slides or options"):
        build([str(slides)], url, FAST, storage_options=s3.storage_options, overwrite=True)
    manifest = build([str(slides)], url, FAST, storage_options=s3.storage_options, overwrite=True)
    assert len(manifest.slides) == 2 and not manifest.failed_slides
    fs = s3.fs()
    fs.invalidate_cache()
    assert not [p for p in fs.ls(f"{url}/.wsishard", detail=False) if p.rsplit("/", 1)[-1].startswith("lock")]


def test_an_old_s3_lock_of_another_host_is_stale(s3: S3Server, s3_bucket: str, slides: Path) -> None:
    url = f"s3://{s3_bucket}/out"
    dest = Destination(url, s3.storage_options)
    lock = {
        "fingerprint": "x",
        "part": None,
        "host": "elsewhere",
        "pid": 1,
        "token": "t",
        "started": "2020-01-01",
        "refreshed_s": time.time() - 60,
    }
    dest.write_bytes(".wsishard/lock.json", json.dumps(lock).encode())
    with pytest.raises(OptionError, match="pid 1 on elsewhere"):
        build([str(slides)], url, FAST, storage_options=s3.storage_options, overwrite=True)
    dest.write_bytes(".wsishard/lock.json", json.dumps({**lock, "refreshed_s": time.time() - 2 * 3600}).encode())
    manifest = build([str(slides)], url, FAST, storage_options=s3.storage_options, overwrite=True)
    assert not manifest.failed_slides


# ---- 3. a slide replaced before a resume -----------------------------------------------------------------------


def test_a_slide_replaced_before_a_resume_is_named_and_refused(slides: Path, tmp_path: Path) -> None:
    src, out = tmp_path / "slides", tmp_path / "out"
    shutil.copytree(slides, src)
    build([str(src)], str(out), FAST)
    (out / "manifest.json").unlink()  # as if killed before the end: the resume state is all there is
    other = make_slides(tmp_path / "other", 1, seed=99, width=1536, height=1536)[0]
    shutil.copyfile(other.path, src / "slide-000.svs")
    with pytest.raises(OptionError, match=r"slide-000\.svs") as info:
        build([str(src)], str(out), FAST)
    assert "--overwrite" in str(info.value) and "slide-001" not in str(info.value)
    proc = _cli("build", str(src), "-o", str(out), "--patch-size", "64", "--no-qc", "-q")
    assert proc.returncode == 2 and "slide-000.svs" in proc.stderr and "Traceback" not in proc.stderr
    manifest = build([str(src)], str(out), FAST, overwrite=True)
    replaced = next(s for s in manifest.slides if s.file.endswith("slide-000.svs"))
    assert (replaced.width, replaced.height) == (1536, 1536) and replaced.status == "ok"
    assert build([str(src)], str(out), FAST).slides == manifest.slides  # unchanged slides: resumed as before


def test_object_stamps_change_when_an_object_is_replaced(s3: S3Server, s3_bucket: str) -> None:
    prefix = f"s3://{s3_bucket}/slides"
    urls = [f"{prefix}/a.svs", f"{prefix}/b.svs"]
    fs = s3.fs()
    for url in urls:
        fs.pipe(url, b"a" * 100)
    first = input_stamps(urls, s3.storage_options)
    assert all(stamp["size"] == 100 and stamp["tag"] for stamp in first.values())
    assert input_stamps(urls, s3.storage_options) == first
    s3.fs().ls(prefix)  # a listing this process keeps in its cache...
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options).pipe(urls[1], b"b" * 100)
    second = input_stamps(urls, s3.storage_options)  # ...does not hide a replacement made elsewhere
    assert second[urls[0]] == first[urls[0]] and second[urls[1]] != first[urls[1]]


# ---- 9. an output that cannot be written is not the slides' failure --------------------------------------------


def _no_qc_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a QC picture fails as a read-only ``qc/`` folder makes it fail (also for root, who ignores modes)."""
    write = Destination.write_bytes

    def refuse(self: Destination, name: str, data: bytes) -> None:
        if name.startswith("qc/"):
            raise PermissionError(13, "Permission denied", self.path(name))
        write(self, name, data)

    monkeypatch.setattr(Destination, "write_bytes", refuse)


def test_a_qc_write_error_stops_the_build_and_is_not_cached(
    slides: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as mp:
        _no_qc_writes(mp)
        with pytest.raises(OutputError) as info:
            build([str(slides)], str(out), WITH_QC)  # one job: the scan runs in this process
    assert isinstance(info.value, WsiShardError) and isinstance(info.value, OSError)
    assert "qc" in info.value.location and "Permission denied" in str(info.value) and "\n" not in str(info.value)
    assert _locks(out) == []
    manifest = build([str(slides)], str(out), WITH_QC)  # the permission is back: both slides are built
    assert [s.status for s in manifest.slides] == ["ok", "ok"]
    assert sorted(p.name for p in (out / "qc").iterdir()) == ["index.html", "slide-000.png", "slide-001.png"]


def _read_only_binds() -> bool:
    """Whether a read-only folder keeps this process out (root's is not, unless its capabilities are dropped)."""
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o555)
        try:
            open(os.path.join(folder, "probe"), "wb").close()
        except PermissionError:
            return True
        finally:
            os.chmod(folder, 0o755)
        return False


@pytest.mark.skipif(not _read_only_binds(), reason="this user writes into read-only folders (root)")
def test_a_read_only_qc_folder_stops_the_build_and_a_rerun_builds_every_slide(slides: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "qc").mkdir(parents=True)
    (out / "qc").chmod(0o555)
    try:
        proc = _cli("build", str(slides), "-o", str(out), "--patch-size", "64", "--jobs", "2", "-q")
        assert proc.returncode == 2 and "Permission denied" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        (out / "qc").chmod(0o755)
    manifest = build([str(slides)], str(out), dataclasses.replace(WITH_QC, jobs=2))
    assert [s.status for s in manifest.slides] == ["ok", "ok"]
