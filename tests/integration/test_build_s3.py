"""Building to object storage against a real S3 endpoint (moto's server on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from buildtools import SMALL_BUILD, SMALL_BUILD_ARGS, read_output

from wsishard.builder.qc.qcdraw import draw_pictures
from wsishard.builder.run.orchestrate import build
from wsishard.shards.index import index_name
from wsishard.shards.summary import SUMMARY_NAME
from wsishard.storage.output import Destination
from wsishard.streaming.sources import stream

if TYPE_CHECKING:
    from servers import HttpServer, S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(300)

OPTS = SMALL_BUILD
ARGS = SMALL_BUILD_ARGS


def _download(s3: S3Server, url: str, to: Path) -> Path:
    fs = s3.fs()
    fs.invalidate_cache()
    to.mkdir(parents=True, exist_ok=True)
    for path in fs.ls(url, detail=False):
        name = path.rsplit("/", 1)[-1]
        if fs.isfile(path):
            fs.get_file(path, str(to / name))
    return to


def test_build_to_s3_equals_the_local_build_and_streams_back(
    s3: S3Server, s3_bucket: str, cohort: Path, cohort_build: Path, tmp_path: Path
) -> None:
    url = f"s3://{s3_bucket}/cohort/shards"
    manifest = build([str(cohort)], url, OPTS, storage_options=s3.storage_options)
    s3.fs().invalidate_cache()
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.fs().ls(url, detail=False))
    indexes = [SUMMARY_NAME, *(index_name(s.name) for s in manifest.shards)]  # the per-sample index
    # a default build draws no QC picture (no qc/): inspect --qc draws them
    assert names == sorted([".wsishard", "manifest.json", "slides.jsonl", *(s.name for s in manifest.shards), *indexes])
    copy = _download(s3, url, tmp_path / "copy")
    local_manifest, local_samples = read_output(str(cohort_build))
    s3_manifest, _ = read_output(str(copy))
    assert s3_manifest.shards == local_manifest.shards  # same names, counts, bytes, sha256
    assert s3_manifest.slides == local_manifest.slides
    drawn = draw_pictures(manifest, url, s3.storage_options, jobs=1)  # inspect --qc: from the recorded scans
    assert (drawn.from_slides, drawn.from_records, drawn.without) == (len(os.listdir(cohort)), [], [])
    s3.fs().invalidate_cache()
    qc = [p.rsplit("/", 1)[-1] for p in s3.fs().ls(f"{url}/qc", detail=False)]
    assert len(qc) == len(os.listdir(cohort)) + 1 == 9 and "index.html" in qc  # 8 pictures and the review page
    ds = stream(url, batch_size=16, resampled=False, shuffle=0, drop_last=False, storage_options=s3.storage_options)
    keys = [k for batch in ds for k in batch["key"]]
    assert sorted(keys) == sorted(s.key for s in local_samples)


def test_resume_on_s3_after_sigkill(
    s3: S3Server, s3_bucket: str, cohort: Path, cohort_build: Path, tmp_path: Path
) -> None:
    url = f"s3://{s3_bucket}/shards"
    endpoint = ["--storage-option", f"endpoint_url={s3.endpoint_url}"]
    cmd = [sys.executable, "-m", "wsishard.cli", "build", str(cohort), "-o", url, "--jobs", "1", *ARGS, *endpoint]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    fs = s3.fs()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if len(fs.ls(f"{url}/.wsishard/done", detail=False) if fs.exists(f"{url}/.wsishard/done") else []) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    fs.invalidate_cache()
    assert not fs.exists(f"{url}/manifest.json")
    again = subprocess.run([*cmd[:8], "2", *cmd[9:]], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    copy = _download(s3, url, tmp_path / "copy")
    local_manifest, _ = read_output(str(cohort_build))
    s3_manifest, _ = read_output(str(copy))
    assert s3_manifest.shards == local_manifest.shards
    fs.invalidate_cache()
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(url, detail=False) if p.endswith(".tar"))
    assert listed == [s.name for s in s3_manifest.shards]  # nothing stray, nothing half-uploaded


def test_an_aborted_upload_leaves_no_object(s3: S3Server, s3_bucket: str) -> None:
    dest = Destination(f"s3://{s3_bucket}/out", s3.storage_options)
    out = dest.open_atomic("shard-000000.tar")
    out.write(os.urandom(17 * 2**20))  # past one 16 MiB part: a multipart upload is under way
    out.write(b"tail")
    out.abort()
    s3.fs().invalidate_cache()
    assert not s3.fs().exists(f"s3://{s3_bucket}/out/shard-000000.tar")
    dest.write_bytes("ok.txt", b"done")
    assert s3.fs().cat_file(f"s3://{s3_bucket}/out/ok.txt") == b"done"


def test_credentials_never_reach_output_or_logs(s3: S3Server, s3_bucket: str, cohort: Path) -> None:
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"  # moto accepts any credentials
    url = f"s3://{s3_bucket}/secret-check"
    one = sorted(cohort.iterdir())[0]
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": secret}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wsishard.cli",
            "-v",
            "build",
            str(one),
            "-o",
            url,
            "--patch-size",
            "64",
            "--jobs",
            "1",
            "--storage-option",
            f"endpoint_url={s3.endpoint_url}",
            "--storage-option",
            f"secret={secret}",
            "--storage-option",
            "key=AKIAEXAMPLEKEY",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout + proc.stderr
    bad = subprocess.run(  # a failing run: the error is one line, without the secret
        [
            sys.executable,
            "-m",
            "wsishard.cli",
            "build",
            str(one),
            "-o",
            url + "-2",
            "--storage-option",
            f"endpoint_url={s3.endpoint_url}",
            "--storage-option",
            f"secret={secret}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert bad.returncode == 3 and "Traceback" not in bad.stderr and "Credentials" in bad.stderr  # not named: 3
    assert secret not in bad.stdout + bad.stderr
    fs = s3.fs()
    fs.invalidate_cache()
    for path in fs.find(url):
        assert secret.encode() not in fs.cat_file(path), path


def test_slides_read_from_a_bucket_through_bounded_scratch(
    s3: S3Server, s3_bucket: str, cohort: Path, cohort_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wsishard.builder.inputs.staging
    import wsishard.builder.scan.scan

    s3.fs().mkdir(f"{s3_bucket}/cohort/slides")
    s3.upload(str(cohort), f"s3://{s3_bucket}/cohort/slides")
    live: list[int] = [0, 0]  # copies on disk now, most at once
    copied: list[str] = []  # the URL of every copy made
    original = wsishard.builder.inputs.staging.local_copy

    @contextlib.contextmanager
    def spy(*args: object, **kwargs: object) -> Iterator[str]:
        with original(*args, **kwargs) as path:  # type: ignore[arg-type]
            copied.append(str(args[0]))
            live[0] += 1
            live[1] = max(live)
            try:
                yield path
            finally:
                live[0] -= 1

    monkeypatch.setattr(wsishard.builder.inputs.staging, "local_copy", spy)
    monkeypatch.setattr(wsishard.builder.scan.scan, "local_copy", spy)
    # in place, though these small slides' patches lie on most of their bytes (copied then: test_copy_or_in_place.py)
    monkeypatch.setattr(wsishard.builder.inputs.staging, "COPY_ABOVE_FRACTION", float("inf"))
    scratch = tmp_path / "scratch"
    opts = dataclasses.replace(OPTS, jobs=1)  # in-process, so the spy sees every copy
    out = tmp_path / "out"
    manifest = build(
        [f"s3://{s3_bucket}/cohort/slides/"], str(out), opts, storage_options=s3.storage_options, scratch=str(scratch)
    )
    assert live == [0, 0]  # SVS and TIFF slides are read in place: no copy
    assert not [p for p in scratch.rglob("*") if p.is_file()]  # tile files and staged patches removed
    local_manifest, _ = read_output(str(cohort_build))
    assert manifest.shards == local_manifest.shards  # byte-identical shards from the same slides
    sizes = {p.name: p.stat().st_size for p in cohort.iterdir()}
    assert all(record.bytes_read > 0 for record in manifest.slides)
    # directories (by the scan and again to stage), the low-resolution level and the kept patches' tiles only: these
    # small slides are read at level 0, so that is most of each file, but less in all than whole copies
    assert sum(s.bytes_read for s in manifest.slides) < sum(sizes.values())
    assert not any(s.bytes_read for s in local_manifest.slides)  # local files: nothing downloaded
    assert not copied
    opts = dataclasses.replace(opts, fast_path=False)  # read through OpenSlide: copied once, staged from that copy
    manifest = build(
        [f"s3://{s3_bucket}/cohort/slides/"],
        str(tmp_path / "copied"),
        opts,
        storage_options=s3.storage_options,
        scratch=str(scratch),
    )
    assert live == [0, 1]  # one slide on local disk at a time, and none left
    assert not [p for p in scratch.rglob("*") if p.is_file()]
    assert sorted(copied) == sorted(s.file for s in manifest.slides)  # each slide downloaded exactly once
    assert [s.status for s in manifest.slides] == [s.status for s in local_manifest.slides]
    assert sum(s.patches for s in manifest.slides) == sum(s.patches for s in local_manifest.slides)
    assert all(s.bytes_read == sizes[Path(s.file).name] for s in manifest.slides)
    assert [s.file for s in manifest.slides] == [
        f"s3://{s3_bucket}/cohort/slides/{Path(s.file).name}" for s in local_manifest.slides
    ]


def test_a_copied_slide_is_downloaded_again_only_by_a_resumed_build(
    s3: S3Server, s3_bucket: str, cohort: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wsishard.builder.run.orchestrate

    s3.fs().mkdir(f"{s3_bucket}/resumed/slides")
    s3.upload(str(cohort), f"s3://{s3_bucket}/resumed/slides")
    slides = [f"s3://{s3_bucket}/resumed/slides/"]
    opts = dataclasses.replace(OPTS, jobs=1, fast_path=False)  # through OpenSlide: copied to scratch
    whole = build(slides, str(tmp_path / "whole"), opts, storage_options=s3.storage_options)
    sizes = {p.name: p.stat().st_size for p in cohort.iterdir()}
    assert all(s.bytes_read == sizes[Path(s.file).name] for s in whole.slides)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # after every scan was saved, before any shard

    with monkeypatch.context() as patch:
        patch.setattr(wsishard.builder.run.orchestrate, "_extract_groups", interrupted)
        with pytest.raises(KeyboardInterrupt):
            build(slides, str(tmp_path / "resumed"), opts, storage_options=s3.storage_options)
    resumed = build(slides, str(tmp_path / "resumed"), opts, storage_options=s3.storage_options)
    assert resumed.shards == whole.shards
    assert [s.patches for s in resumed.slides] == [s.patches for s in whole.slides]
    # the patches staged while scanning went with the first run: each slide with patches is copied again
    assert all(s.bytes_read == (2 if s.patches else 1) * sizes[Path(s.file).name] for s in resumed.slides)


def test_bytes_read_is_every_byte_the_server_sent_for_the_slide_and_stays_once_closed(
    http_serve: Any, cohort: Path, tmp_path: Path
) -> None:
    from wsishard.slide import read_lowres
    from wsishard.slide.remote_tiff import RemoteTiffReader

    server: HttpServer = http_serve(str(cohort))
    name = next(p.name for p in sorted(cohort.iterdir()) if p.suffix == ".svs")
    size = (cohort / name).stat().st_size
    with RemoteTiffReader(f"{server.url}/{name}", str(tmp_path)) as reader:
        read_lowres(reader, 16.0)  # directories and the low-resolution level
        reader.read_level(0, 1024, 1024, 512, 512)  # and a few level-0 tiles
        during = reader.bytes_read
    sent = 0
    for method, _, header in server.requests_to(name):
        if method == "GET":
            first, _, last = (header or "bytes=0-").removeprefix("bytes=").partition("-")
            sent += min(size, int(last) + 1 if last else size) - int(first)
    assert reader.bytes_read == during == sent  # the directories' bytes too, after the file closed
    assert 0 < sent < size


def test_a_presigned_slide_url_builds_and_neither_its_query_nor_user_info_is_stored(
    http_serve: Any, cohort: Path, tmp_path: Path
) -> None:
    server: HttpServer = http_serve(str(cohort))
    name = sorted(p.name for p in cohort.iterdir() if p.suffix == ".svs")[0]
    secrets = ("PASSW0RDSECRET", "SIGNATURESECRET", "TOKENSECRET", "OTHERQUERYVALUE", "RESIGNEDSECRET")
    base = server.url.replace("http://", f"http://reader:{secrets[0]}@")
    url = f"{base}/{name}?X-Amz-Signature={secrets[1]}&token={secrets[2]}&x-id={secrets[3]}"
    out = tmp_path / "out"
    again = url.replace(secrets[1], secrets[4])  # the same object, presigned again: one slide
    manifest = build([url, again], str(out), dataclasses.replace(SMALL_BUILD, jobs=1, qc=True))  # and its QC page
    (record,) = manifest.slides
    assert record.status == "ok" and record.patches > 0
    assert record.file == f"{server.url}/{name}" and record.slide_id == name.rsplit(".", 1)[0]
    assert manifest.options["inputs"] == [record.file] * 2
    _, samples = read_output(str(out))
    assert {s.meta["file"] for s in samples} == {name}
    stored = [p for p in out.rglob("*") if p.is_file()]
    assert {"manifest.json", "slides.jsonl", "index.html", "build.json"} <= {p.name for p in stored}
    for path in stored:  # manifest, slide records, the QC page and pictures, every shard (samples' .json), state
        data = path.read_bytes()
        assert not [s for s in secrets if s.encode() in data], path


def test_a_missing_output_bucket_is_named(s3: S3Server, cohort: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from wsishard.cli import main
    from wsishard.errors import OutputError

    with pytest.raises(OutputError, match="the bucket 'no-such-bucket' does not exist"):
        build([str(cohort)], "s3://no-such-bucket/out", OPTS, storage_options=s3.storage_options)
    endpoint = f"endpoint_url={s3.storage_options['endpoint_url']}"
    assert main(["build", str(cohort), "-o", "s3://no-such-bucket/out", "--storage-option", endpoint, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wsishard build: error: cannot write s3://no-such-bucket/out: the bucket 'no-such-bucket'")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_dead_presigned_urls_in_a_list_are_failed_slides_and_their_secrets_are_never_shown(
    http_serve: Any, cohort: Path, tmp_path: Path
) -> None:
    """Issue 42: a list file with a presigned URL that gets 404 and one whose connection is refused built nothing
    (exit 3 from the inputs' stamps); now each is one failed record, and no output, log line or file holds the
    password or the signature."""
    from servers import free_port

    server: HttpServer = http_serve(str(cohort))
    name = sorted(p.name for p in cohort.iterdir() if p.suffix == ".svs")[0]
    secrets = ("PASSW0RDSECRET", "SIGNATURESECRET", "DEADSIGSECRET", "REFUSEDSIGSECRET")
    base = server.url.replace("http://", f"http://reader:{secrets[0]}@")
    refused = f"http://reader:{secrets[0]}@127.0.0.1:{free_port()}"  # nothing listens there
    listing = tmp_path / "slides.txt"
    listing.write_text(
        f"{base}/{name}?X-Amz-Signature={secrets[1]}\n"
        f"{base}/gone.svs?X-Amz-Signature={secrets[2]}\n"
        f"{refused}/refused.svs?X-Amz-Signature={secrets[3]}\n"
    )
    out = tmp_path / "out"
    args = ("-v", "build", str(listing), "-o", str(out), *SMALL_BUILD_ARGS[:-1], "--jobs", "1")
    proc = subprocess.run([sys.executable, "-m", "wsishard.cli", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]  # some slides failed: not 3, the build ran
    shown = proc.stdout + proc.stderr
    assert "FAILED gone.svs: " in shown and "FAILED refused.svs: " in shown
    assert not [s for s in secrets if s in shown]
    manifest, samples = read_output(str(out))
    status = {s.slide_id: s.status for s in manifest.slides}
    assert status == {name.rsplit(".", 1)[0]: "ok", "gone": "failed", "refused": "failed"}
    assert samples and {s.meta["file"] for s in samples} == {name}
    for path in (p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        assert not [s for s in secrets if s.encode() in data], path
