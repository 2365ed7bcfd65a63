#!/usr/bin/env python
"""Hostile input, end to end: the build and stream cases of issues 12 and 28, on generated slides so they stay fixed.

Each case builds (through the ``wsishard`` command, as a user would) or streams (through :func:`wsishard.stream`)
something broken, hostile or concurrent, and checks what a user must get: a clear one-line error, nothing lost,
nothing silently wrong. Prints one line per case, a summary, and one ``JSON: {...}`` line; exits 1 if any failed.

    python scripts/torture.py              # all cases, about a minute on 2 cores
    python scripts/torture.py --keep DIR   # keep the work folder for a look
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tifffile
from PIL import Image

from wsishard import Batch, ManifestError, ShardError, stream
from wsishard.manifest import Manifest
from wsishard.shards.verify import verify
from wsishard.shards.writer import ShardWriter
from wsishard.storage.opener import load_manifest
from wsishard.storage.output import Destination
from wsishard.streaming.stages import ErrorMode
from wsishard.testing.synthetic import make_slides

SMALL = ["--patch-size", "64", "--shard-samples", "64", "--jobs", "1", "-q"]
Case = Callable[[Path], str]  # returns what it saw; raises AssertionError when the behaviour is wrong


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wsishard.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )


def _usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, f"exit {proc.returncode}: {err[-300:]}"
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-500:]
    assert all(w in err for w in words), err
    return err


def _slides(work: Path) -> Path:
    folder = work / "slides"
    if not folder.exists():
        make_slides(folder, 3, seed=5, width=2048, height=2048)
    return folder


def _built(work: Path) -> Path:
    out = work / "built"
    if not (out / "manifest.json").exists():
        proc = _cli("build", str(_slides(work)), "-o", str(out), *SMALL)
        assert proc.returncode == 0, proc.stderr
    return out


def _copy_build(work: Path, name: str) -> Path:
    out = work / name
    shutil.copytree(_built(work), out)
    return out


# ---- build side ----------------------------------------------------------------------------------------


def overwrite_keeps_foreign_files(work: Path) -> str:
    out = work / "user-folder"
    files = {"qc/notes.txt": b"mine", "manifest_of_patients.xlsx": b"xlsx", "shard-plan.docx": b"docx"}
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    err = _usage_error(_cli("build", str(_slides(work)), "-o", str(out), *SMALL), "not a wsishard build")
    proc = _cli("build", str(_slides(work)), "-o", str(out), *SMALL, "--overwrite")
    assert proc.returncode == 0, proc.stderr[-500:]
    assert all((out / n).read_bytes() == d for n, d in files.items()), "a user's file changed"
    return f"refused without --overwrite ({err[:60]}...), built beside them with it, all kept"


_SLOW = textwrap.dedent(
    """
    import time
    import wsishard.builder.extract as extract

    read = extract.block_samples

    def slow_read(reader, work, block, encode):  # a build long enough for another to try the same output
        time.sleep(0.05)
        return read(reader, work, block, encode)

    extract.block_samples = slow_read
    """
)


def _site(work: Path, name: str, code: str) -> dict[str, str]:
    """An environment whose Python processes run ``code`` at start (as ``sitecustomize``), workers included."""
    (work / name).mkdir(exist_ok=True)
    (work / name / "sitecustomize.py").write_text(code)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(work / name), os.environ.get("PYTHONPATH", "")])}


def second_build_is_refused(work: Path) -> str:
    out = work / "contended"
    cmd = [
        sys.executable,
        "-m",
        "wsishard.cli",
        "build",
        str(_slides(work)),
        "-o",
        str(out),
        "--patch-size",
        "32",
        "--jobs",
        "1",
        "-q",
    ]
    first = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=_site(work, "slow", _SLOW))
    try:
        deadline = time.monotonic() + 60
        while not (out / ".wsishard" / "lock.json").exists():
            assert time.monotonic() < deadline and first.poll() is None, "the first build never took the lock"
            time.sleep(0.05)
        err = _usage_error(_cli("build", str(_slides(work)), "-o", str(out), *SMALL, "--overwrite"), "being written")
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0
    sizes = {m["patch_size"] for m in _metas(out)}
    assert sizes == {32}, f"the shards mix patch sizes {sizes}"
    return f"refused: {err[:90]}..."


def replaced_slide_is_noticed(work: Path) -> str:
    slides, out = work / "slides-replaced", work / "replaced"
    shutil.copytree(_slides(work), slides)
    proc = _cli("build", str(slides), "-o", str(out), *SMALL)
    assert proc.returncode == 0, proc.stderr[-500:]
    (out / "manifest.json").unlink()  # as if interrupted before its end: a re-run resumes
    make_slides(work / "other", 1, seed=99, width=3000, height=2000)
    shutil.copy(work / "other" / "slide-000.svs", slides / "slide-000.svs")  # another slide under the same name
    return _usage_error(_cli("build", str(slides), "-o", str(out), *SMALL), "slide-000")[:120]


def bad_labels_are_usage_errors(work: Path) -> str:
    seen = []
    for table, word in (
        ("slide-000,1\nslide-001,tumor\nslide-002,2\n", "mixed"),
        ("slide-000,1\nslide-001,99999999999999999999999\n", "0..2**63-1"),
        ("slide-000,1\nslide-000,2\n", "listed twice"),
    ):
        (work / "labels.csv").write_text(table)
        out = work / "labels-out"
        seen.append(
            _usage_error(
                _cli("build", str(_slides(work)), "-o", str(out), *SMALL, "--labels", str(work / "labels.csv")), word
            )
        )
        assert not out.exists(), "a usage error wrote into OUT"
    return f"{len(seen)} tables refused before any work"


def bad_values_are_usage_errors(work: Path) -> str:
    (work / "afile").write_text("x")
    (work / "mpp.csv").write_text("slide-000,nan\n")
    cases = [
        (["--seed", "-1"], "seed"),
        (["--quality", "0"], "quality"),
        (["--mpp-csv", str(work / "mpp.csv")], "nan"),
        (["--patch-size", "4"], "patch"),
    ]
    for args, word in cases:
        _usage_error(_cli("build", str(_slides(work)), "-o", str(work / "values-out"), *SMALL, *args), word)
    _usage_error(_cli("build", str(_slides(work)), "-o", str(work / "afile"), *SMALL), "not a folder")
    return f"{len(cases) + 1} values refused in one line each"


_KILLER = textwrap.dedent(
    """
    import os, signal
    import wsishard.builder.extract as extract

    read = extract.block_samples

    def killing_read(reader, work, block, encode):  # as the out-of-memory killer would, on one slide
        if work.slide_id == "slide-001":
            os.kill(os.getpid(), signal.SIGKILL)
        return read(reader, work, block, encode)

    extract.block_samples = killing_read
    """
)


def killed_worker_does_not_hang(work: Path) -> str:
    env = _site(work, "killer", _KILLER)
    out = work / "killed"
    proc = _cli("build", str(_slides(work)), "-o", str(out), "--patch-size", "64", "--jobs", "2", "-q", env=env)
    assert proc.returncode == 1 and (out / "manifest.json").exists(), f"exit {proc.returncode}: {proc.stderr[-800:]}"
    manifest, _ = load_manifest(str(out))  # exit 1: some slides failed (their records: slides.jsonl)
    failed = {s.slide_id: s.reason for s in manifest.failed_slides}
    assert list(failed) == ["slide-001"] and "died twice" in failed["slide-001"], failed
    assert "slide-001" not in {m["slide_id"] for m in _metas(out)}
    return f"build ended, slide-001 failed: {failed['slide-001']}"


# ---- stream side ---------------------------------------------------------------------------------------


def _metas(out: Path) -> list[dict[str, object]]:
    metas = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            metas += [json.load(tar.extractfile(m)) for m in tar if m.name.endswith(".json")]  # type: ignore[arg-type]
    return metas


def _rewrite_first_image(out: Path, image: bytes) -> str:
    """Replace the first sample's image of shard 0 with ``image``; the manifest's bytes and sha256 follow."""
    return _rewrite_member(out, "jpg", lambda _: image)


def _rewrite_member(out: Path, ext: str, change: Callable[[bytes], bytes]) -> str:
    """Replace the first sample's ``.ext`` of shard 0 with ``change(old)``; the manifest's bytes and sha256 follow."""
    manifest = Manifest.from_json((out / "manifest.json").read_text())
    name = manifest.shards[0].name
    with tarfile.open(out / name) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    key = members[0][0].split(".", 1)[0]
    writer = ShardWriter(Destination(str(out)), name)
    samples: dict[str, dict[str, bytes]] = {}
    for member, data in members:
        k, e = member.split(".", 1)
        samples.setdefault(k, {})[e] = change(data) if (k, e) == (key, ext) else data
    for k, m in samples.items():
        writer.write(k, m, k.rsplit("_x", 1)[0])
    record = writer.commit()
    shards = [record if s.name == name else s for s in manifest.shards]
    (out / "manifest.json").write_text(dataclasses.replace(manifest, shards=shards).to_json())
    return key


def _jpeg(size: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (200, 100, 150)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _bomb() -> bytes:
    """A small JPEG whose header declares 30000 x 30000 pixels."""
    data = bytearray(_jpeg(64))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (30000).to_bytes(2, "big") * 2
    return bytes(data)


def _stream_all(out: Path, on_error: ErrorMode) -> list[Batch]:
    ds = stream(str(out), batch_size=8, resampled=False, shuffle=0, seed=0, drop_last=False, on_error=on_error)
    return list(ds)


def wrong_size_first_sample(work: Path) -> str:
    out = _copy_build(work, "wrong-size")
    key = _rewrite_first_image(out, _jpeg(128))
    try:
        _stream_all(out, "raise")
        raise AssertionError("no ShardError")
    except ShardError as exc:
        assert key in str(exc), f"blames another sample: {exc}"
    batches = _stream_all(out, "skip")
    assert {tuple(b["image"].shape[1:]) for b in batches} == {(64, 64, 3)}
    assert key not in [k for b in batches for k in b["key"]]
    return f"raise names {key}; skip drops that one sample only"


def decompression_bomb(work: Path) -> str:
    out = _copy_build(work, "bomb")
    key = _rewrite_first_image(out, _bomb())
    try:
        _stream_all(out, "raise")
        raise AssertionError("no ShardError")
    except ShardError as exc:
        assert key in str(exc), str(exc)
    kept = sum(len(b["key"]) for b in _stream_all(out, "skip"))
    total = Manifest.from_json((out / "manifest.json").read_text()).total_samples
    assert kept == total - 1, (kept, total)
    return f"header checked before decoding: a ShardError naming {key}; skip mode keeps {kept} of {total}"


def path_like_shard_names(work: Path) -> str:
    out = _copy_build(work, "paths")
    data = json.loads((out / "manifest.json").read_text())
    data["shards"][0]["name"] = "../../x.tar"
    (out / "manifest.json").write_text(json.dumps(data))
    try:
        stream(str(out), batch_size=8)
        raise AssertionError("a shard name outside the output was followed")
    except ManifestError as exc:
        return f"ManifestError: {str(exc)[-90:]}"


CASES: dict[str, Case] = {
    "overwrite keeps a user's files": overwrite_keeps_foreign_files,
    "a second build into the same output": second_build_is_refused,
    "a slide replaced before a resume": replaced_slide_is_noticed,
    "label tables that were silently wrong": bad_labels_are_usage_errors,
    "option values that were not usage errors": bad_values_are_usage_errors,
    "a worker killed mid-build": killed_worker_does_not_hang,
    "a sample of another size first in a shard": wrong_size_first_sample,
    "a decompression bomb in a shard": decompression_bomb,
    "a manifest naming ../../x.tar": path_like_shard_names,
}


# ---- issue 28, items 1, 2, 5, 6, 8 and 13: nothing lost, nothing leaked, nothing silently wrong ------------------

_SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"


def inspect_html_keeps_the_build(work: Path) -> str:
    out = _copy_build(work, "html-onto-build")
    shard = next(out.glob("shard-*.tar")).name
    for name in ("manifest.json", "slides.jsonl", shard):
        before = (out / name).read_bytes()
        _usage_error(_cli("inspect", str(out), "--html", str(out / name)), f"the build's own {name}")
        assert (out / name).read_bytes() == before, f"{name} was written over"
    return f"--html onto manifest.json, slides.jsonl, {shard}: refused, each file unchanged"


def url_credentials_are_refused_unseen(work: Path) -> str:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    url = f"s3://AKIAEXAMPLEKEYID:{_SECRET}@bucket/in/"
    runs = [
        ("build", url, "-o", str(work / "creds-out"), "-q"),
        ("build", str(_slides(work)), "-o", url, "-q"),
        ("verify", url, "-q"),
        ("inspect", url),
    ]
    for args in runs:
        proc = _cli(*args, env=env)
        _usage_error(proc, "credentials in an s3:// URL are not read", "s3://***@bucket/in/")
        assert not [p for p in _SECRET.split("/") if p in proc.stdout + proc.stderr], proc.stderr
    try:
        stream(url, batch_size=2)
        raise AssertionError("stream() took a URL with credentials")
    except ValueError as exc:
        assert not [p for p in _SECRET.split("/") if p in str(exc)], str(exc)
    return f"build input, -o, verify, inspect, stream(): refused, the secret never shown ({len(runs) + 1} ways)"


def presigned_url_is_not_stored(work: Path) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from servers import running_http  # the test suite's HTTP server: ranged reads, as object stores serve them

    secrets = ("PASSW0RDSECRET", "SIGNATURESECRET", "TOKENSECRET")
    out = work / "presigned"
    with running_http(str(_slides(work))) as server:
        url = (
            f"{server.url.replace('http://', f'http://reader:{secrets[0]}@')}/slide-000.svs"
            f"?X-Amz-Signature={secrets[1]}&token={secrets[2]}"
        )
        proc = _cli("build", url, "-o", str(out), *SMALL)
    assert proc.returncode == 0, proc.stderr[-500:]
    files = [p for p in out.rglob("*") if p.is_file()]
    leaks = [str(p.relative_to(out)) for p in files if any(s.encode() in p.read_bytes() for s in secrets)]
    assert not leaks and not [s for s in secrets if s in proc.stdout + proc.stderr], leaks
    return f"built; none of {len(files)} output files (manifest, slides.jsonl, qc page, shards, state) holds them"


def same_slide_twice_is_built_once(work: Path) -> str:
    slides = work / "aliased"
    shutil.copytree(_slides(work), slides)
    (slides / "alias.svs").symlink_to(slides / "slide-000.svs")
    (slides / "gone.svs").symlink_to(work / "deleted.svs")
    proc = subprocess.run(
        [sys.executable, "-m", "wsishard.cli", "build", "aliased", str(slides), "-o", "aliased-out", *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=work,
    )
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr[-500:]}"  # 1: the dangling link failed
    manifest, _ = load_manifest(str(work / "aliased-out"))
    files = sorted(os.path.basename(s.file) for s in manifest.slides)
    assert files == ["gone.svs", "slide-000.svs", "slide-001.tif", "slide-002.svs"], files
    gone = next(s for s in manifest.slides if s.file.endswith("gone.svs"))
    assert gone.status == "failed" and "dangling" in gone.reason and "is the same file as" in proc.stderr
    return f"4 slides (not 8), alias warned; gone.svs: {gone.reason[-40:]}"


def slurm_ids_that_are_no_part(work: Path) -> str:
    cases = [
        {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3"},
        {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MAX": "7"},
        {"SLURM_ARRAY_TASK_ID": "abc", "SLURM_ARRAY_TASK_COUNT": "3"},
    ]
    for environ in cases:
        out = work / "slurm-out"
        _usage_error(_cli("build", str(_slides(work)), "-o", str(out), *SMALL, env={**os.environ, **environ}), "Slurm")
        assert not (out / "manifest.json").exists(), "a task that is no part built everything"
    return f"{len(cases)} tasks (id 7 of 3, --array=0,5,7, id abc) refused, nothing built"


def tables_that_mean_nothing(work: Path) -> str:
    for text in ("", "slide,label\n", "# later\n"):
        (work / "empty-labels.csv").write_text(text)
        _usage_error(
            _cli(
                "build",
                str(_slides(work)),
                "-o",
                str(work / "t-out"),
                *SMALL,
                "--labels",
                str(work / "empty-labels.csv"),
            ),
            "no slide,label line",
        )
    twins = work / "twins"
    for folder in ("a", "b"):
        shutil.copytree(_slides(work), twins / folder)
    (work / "stem-labels.csv").write_text("slide-000,1\nslide-001,2\nslide-002,3\n")
    labels = str(work / "stem-labels.csv")
    _usage_error(_cli("build", str(twins), "-o", str(work / "t-out"), *SMALL, "--labels", labels), "matches two slides")
    listed = work / "listed"
    shutil.copytree(_slides(work), listed)
    (listed / "slide-000.svs").rename(listed / "a,b.svs")
    (listed / "list.txt").write_text("\ufeffa,b.svs\nslide-001.tif\n", encoding="utf-8")
    proc = _cli("build", str(listed / "list.txt"), "-o", str(work / "listed-out"), *SMALL)
    assert proc.returncode == 0, proc.stderr[-500:]
    manifest, _ = load_manifest(str(work / "listed-out"))
    assert sorted(os.path.basename(s.file) for s in manifest.slides) == ["a,b.svs", "slide-001.tif"]
    out = _copy_build(work, "twice-listed")
    data = json.loads((out / "manifest.json").read_text())
    data["shards"].append(data["shards"][0])
    (out / "manifest.json").write_text(json.dumps(data))
    try:
        stream(str(out), batch_size=8)
        raise AssertionError("a manifest listing a shard twice was streamed")
    except ManifestError as exc:
        assert "again" in str(exc), str(exc)
    return (
        "empty/header/comment-only labels, a stem of two slides: refused; a,b.svs + BOM: read whole; a shard "
        "listed twice: ManifestError"
    )


def wrong_resolutions_say_so(work: Path) -> str:
    from wsishard.testing.synthetic import make_slide

    (work / "screen").mkdir(exist_ok=True)
    make_slide(work / "screen" / "screen.tif", width=2048, height=2048, mpp=25400 / 72, seed=4)
    proc = _cli("build", str(work / "screen"), "-o", str(work / "screen-out"), *SMALL)
    assert proc.returncode == 1 and "resolution metadata looks wrong (72 dpi" in proc.stdout, proc.stdout[-500:]
    assert "--allow-upsample" not in proc.stdout
    proc = _cli("build", str(_slides(work)), "-o", str(work / "tiny-mpp"), *SMALL, "--mpp", "1e-30", "--allow-upsample")
    assert proc.returncode == 1 and "more than --max-upsample 4 allows" in proc.stdout, proc.stdout[-500:]
    assert "MemoryError" not in proc.stdout
    _usage_error(
        _cli("build", str(_slides(work)), "-o", str(work / "thumb-out"), *SMALL, "--thumb-mpp", "1e9"), "thumb_mpp"
    )
    return "72 dpi TIFF: 'metadata looks wrong'; --mpp 1e-30: over --max-upsample; --thumb-mpp 1e9: usage error"


def empty_part_says_why(work: Path) -> str:
    proc = _cli("build", str(_slides(work)), "-o", str(work / "part-out"), *SMALL, "--part", "2/2")
    assert proc.returncode == 0 and "part 2/2 got no group of slides" in proc.stderr, proc.stderr[-500:]
    return proc.stderr.strip().splitlines()[-1][-90:]


CASES.update(
    {
        "inspect --html onto the build's own files": inspect_html_keeps_the_build,
        "credentials written into an s3:// URL": url_credentials_are_refused_unseen,
        "a presigned slide URL with user info": presigned_url_is_not_stored,
        "the same slide twice, a dangling symlink": same_slide_twice_is_built_once,
        "Slurm array ids that are no part": slurm_ids_that_are_no_part,
        "tables and lists that meant nothing": tables_that_mean_nothing,
        "resolutions no microscope gives": wrong_resolutions_say_so,
        "a part that gets no group": empty_part_says_why,
    }
)
# ---- end of issue 28 (items 1, 2, 5, 6, 8, 13) ----------------------------------------------------------------


# ---- issue 28, second run (b): damaged tiles, trusted records, orphaned workers, overflowing labels, deep JSON,
# ---- shortages of the machine -----------------------------------------------------------------------------------


def damaged_tiles_fail_the_slide(work: Path) -> str:
    folder = work / "damaged-in"
    make_slides(folder, 1, seed=7, width=2048, height=2048, mpp=0.5)  # at 0.5 mpp level 0 is decoded as stored
    path = folder / "slide-000.svs"
    with tifffile.TiffFile(path) as tif:
        offsets, counts = tif.pages[0].dataoffsets, tif.pages[0].databytecounts
    with open(path, "r+b") as fh:
        for t in range(0, len(offsets), 2):  # every other tile's second half zeroed: a copy cut short
            fh.seek(offsets[t] + counts[t] // 2)
            fh.write(bytes(counts[t] - counts[t] // 2))
    out = work / "damaged-out"
    proc = _cli("build", str(folder), "-o", str(out), *SMALL)
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr[-500:]}"
    manifest, _ = load_manifest(str(out))
    (failed,) = manifest.failed_slides
    assert "is corrupt: its JPEG data ends" in failed.reason, failed.reason
    assert not _metas(out), "patches of the damaged slide were written"
    return f"slide failed: {failed.reason[:80]}..."


def rerun_redoes_missing_and_damaged_shards(work: Path) -> str:
    out = _copy_build(work, "shards-lost")
    shards = sorted(out.glob("shard-*.tar"))
    assert len(shards) >= 2, "the build needs two shards"
    shards[0].unlink()
    with open(shards[1], "r+b") as fh:
        fh.truncate(shards[1].stat().st_size // 2)
    proc = _cli("build", str(_slides(work)), "-o", str(out), *SMALL)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "recorded as written, is missing" in proc.stderr and "recorded as written, holds" in proc.stderr
    report = verify(str(out))
    assert report.ok, report.problems
    return f"2 shards written again, verify: {report.shards_checked} shards OK"


_STALL = textwrap.dedent(
    """
    import os, time
    import wsishard.builder.scan as scan

    def stalled_scan(task, reader, record):  # a worker that says it is scanning, then scans for a long time
        open(os.path.join(os.environ["TORTURE_MARKS"], str(os.getpid())), "w").close()
        time.sleep(300)

    scan._scan_open = stalled_scan
    """
)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def workers_die_with_a_killed_build(work: Path) -> str:
    if not sys.platform.startswith("linux"):
        return "skipped: reads /proc"
    marks = work / "marks"
    marks.mkdir()
    env = {**_site(work, "stall", _STALL), "TORTURE_MARKS": str(marks)}
    cmd = [
        sys.executable,
        "-m",
        "wsishard.cli",
        "build",
        str(_slides(work)),
        "-o",
        str(work / "orphans"),
        "--jobs",
        "2",
        "-q",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the workers never started"
            time.sleep(0.05)
            workers = [int(p.name) for p in marks.iterdir()]
        proc.kill()
        proc.wait(timeout=30)
        start = time.monotonic()
        while any(map(_running, workers)) and time.monotonic() - start < 30:
            time.sleep(0.05)
        left = [pid for pid in workers if _running(pid)]
        assert not left, f"workers {left} outlived the build's process"
        return f"both workers gone {time.monotonic() - start:.1f} s after the SIGKILL"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers:  # only processes whose environment is this case's own
            with contextlib.suppress(OSError):
                if f"TORTURE_MARKS={marks}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    os.kill(pid, signal.SIGKILL)


def overflowing_labels(work: Path) -> str:
    out = _copy_build(work, "overflow")
    key = _rewrite_member(out, "json", lambda data: json.dumps({**json.loads(data), "label": 2**70}).encode())
    try:
        _stream_all(out, "raise")
        raise AssertionError("no ShardError")
    except ShardError as exc:
        assert key in str(exc) and "int64" in str(exc), str(exc)
    kept = sum(len(b["key"]) for b in _stream_all(out, "skip"))
    total = Manifest.from_json((out / "manifest.json").read_text()).total_samples
    assert kept == total - 1, (kept, total)
    report = verify(str(out))
    assert not report.ok and key in str(report.problems), report.problems
    return f"stream: ShardError naming {key}, skip keeps {kept} of {total}; verify names it"


def deep_json_in_verify(work: Path) -> str:
    out = _copy_build(work, "deep-json")
    key = _rewrite_member(out, "json", lambda _: b"[" * 500_000 + b"]" * 500_000)
    report = verify(str(out))
    assert not report.ok and key in str(report.problems), report.problems
    return f"verify: {report.problems[0][0]}: {report.problems[0][1][:60]}..."


def damaged_loader_state(work: Path) -> str:
    """Item 7: every field of a loader state is checked before anything starts; the good state still resumes."""
    from wsishard import loader

    def fresh() -> Any:
        return loader(stream(str(_built(work)), batch_size=8, seed=1, shuffle=16), num_workers=2)

    reference = [list(b["key"]) for b in itertools.islice(fresh(), 6)]
    first = fresh()
    taken = [list(b["key"]) for b in itertools.islice(first, 2)]
    good = json.loads(json.dumps(first.state_dict()))
    bad = {"batches": [10**30, 0], "epoch": 1e20, "last_worker": 99}
    bad_states: list[tuple[str, Any]] = [(k, {**good, k: v}) for k, v in bad.items()]
    bad_states += [("batches", {**good, "batches": [1.0, 0]}), ("batches", {**good, "batches": [True, 0]})]
    bad_states += [("loader state", "epoch 3"), ("loader state", None)]
    again = fresh()
    for field, state in bad_states:
        try:
            again.load_state_dict(state)
            raise AssertionError(f"accepted {state!r:.80}")
        except ValueError as exc:
            assert field in str(exc), (field, str(exc))
    again.load_state_dict(good)
    assert taken + [list(b["key"]) for b in itertools.islice(again, 4)] == reference
    return f"{len(bad_states)} damaged states refused naming their field; the good one then resumes exactly"


def too_few_file_descriptors(work: Path) -> str:
    if sys.platform == "win32":
        return "skipped: RLIMIT_NOFILE"
    import resource

    folder = work / "many-in"
    folder.mkdir()
    for i in range(10):  # 30 slides: a worker keeps them open as it extracts
        for slide in sorted(_slides(work).iterdir()):
            shutil.copy(slide, folder / f"{i}-{slide.name}")
    out = work / "many-out"
    args = ("build", str(folder), "-o", str(out), "--patch-size", "64", "--jobs", "1", "-q")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (56, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    short = subprocess.run(
        [sys.executable, "-m", "wsishard.cli", *args], capture_output=True, text=True, timeout=600, preexec_fn=limit
    )
    err = _usage_error(short, "too many open files", "run the build again")
    assert not (out / ".wsishard" / "failed.json").exists(), "slides recorded as failed"
    again = _cli(*args)
    assert again.returncode == 0, again.stderr[-500:]
    manifest, _ = load_manifest(str(out))
    assert not manifest.failed_slides and len(manifest.slides) == 30
    return f"stopped ({err.split('error: ', 1)[-1][:70]}...), the re-run built all 30"


CASES.update(
    {
        "JPEG tiles that end early (fast path)": damaged_tiles_fail_the_slide,
        "shards deleted or truncated before a re-run": rerun_redoes_missing_and_damaged_shards,
        "the build's process SIGKILLed": workers_die_with_a_killed_build,
        "a label of 2**70": overflowing_labels,
        "a .json nested 500,000 deep (verify)": deep_json_in_verify,
        "a damaged loader state": damaged_loader_state,
        "ulimit -n 56 with 30 slides": too_few_file_descriptors,
    }
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="wsishard-torture-"))
    work.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    results = {}
    try:
        for name, case in CASES.items():
            start = time.perf_counter()
            try:
                seen, ok = case(work), True
            except AssertionError as exc:
                seen, ok = f"WRONG: {exc}", False
            results[name] = {"ok": ok, "seen": seen, "s": round(time.perf_counter() - start, 1)}
            print(f"{'ok  ' if ok else 'FAIL'} {name:<45} {seen}", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    failed = [n for n, r in results.items() if not r["ok"]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    print("JSON: " + json.dumps({"cases": results, "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
