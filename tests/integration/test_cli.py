"""The command line end to end: build, inspect, exit codes, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from buildtools import usage_error

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.patchopts import PatchOptions
from wsishard.cli import main
from wsishard.cliargs import parse_size
from wsishard.errors import OptionError
from wsishard.testing.synthetic import make_slide, make_slides


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wsishard.cli", *args], capture_output=True, text=True, timeout=300)


def test_build_then_inspect_end_to_end(tmp_path: Path) -> None:
    make_slides(tmp_path / "slides", 3, seed=4, width=2048, height=2048)
    (tmp_path / "labels.csv").write_text("slide,label\nslide-000.svs,tumour\nslide-001.tif,normal\n")
    out = tmp_path / "out"
    proc = _run(
        "build",
        str(tmp_path / "slides"),
        "-o",
        str(out),
        "--patch-size",
        "64",
        "--shard-samples",
        "50",
        "--labels",
        str(tmp_path / "labels.csv"),
        "--jobs",
        "2",
        "--seed",
        "3",
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 slides (3 ok, 0 failed)" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["shards"] == len(list(out.glob("shard-*.tar"))) >= 2
    assert manifest["options"]["shard_samples"] == 50 and manifest["extra"]["label_names"] == ["normal", "tumour"]
    assert not (out / "qc").exists() and f"wsishard inspect {out} --qc draws the pictures" in proc.stdout
    proc = _run("inspect", str(out), "--qc")  # in two worker processes
    assert proc.returncode == 0, proc.stderr
    assert f"3 QC pictures drawn; review page {out}/qc/index.html" in proc.stdout
    assert sorted(p.name for p in (out / "qc").iterdir()) == ["index.html", *(f"slide-00{i}.png" for i in range(3))]
    proc = _run("inspect", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "slide-002" in proc.stdout and "shard-000000-0000.tar" in proc.stdout and "64 px at 0.5 mpp" in proc.stdout


def test_failed_slides_give_exit_status_1_and_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in").mkdir()
    make_slide(tmp_path / "in" / "good.svs", width=2048, height=2048, seed=1)
    make_slide(tmp_path / "in" / "nompp.tif", width=2048, height=2048, seed=2, include_mpp=False)
    code = main(["build", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--patch-size", "64", "-q", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "1 failed" in out and "FAILED nompp.tif: no microns-per-pixel" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shard-size", "lots"], "not a size"),
        (["--min-tissue", "2"], "between 0 and 1"),
        (["--mpp", "-1"], "must be > 0"),
        (["--format", "gif"], "invalid choice"),
        (["--jobs", "zero"], "not an integer"),
        (["--part", "4/3"], "1 <= I <= N"),
        (["--storage-option", "endpoint_url"], "expected key=value"),
    ],
)
def test_bad_options_are_usage_errors_without_traceback(tmp_path: Path, args: list[str], message: str) -> None:
    proc = _run("build", str(tmp_path), "-o", str(tmp_path / "out"), *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # no usage block burying the error


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "-1"], "argument --seed: must be >= 0: '-1'"),
        (["--seed", "x"], "argument --seed: not an integer: 'x'"),
        (["--quality", "0"], "argument --quality: invalid quality: 0 (need 1..100)"),
        (["--quality", "high"], "argument --quality: not an integer: 'high'"),
        (["--patch-size", "4"], "argument --patch-size: invalid patch_size_px: 4 (need 8..8192)"),
        (["--stride", "9000"], "argument --stride: invalid stride_px: 9000 (need 1..8192)"),
        (["--tissue-threshold", "1"], "argument --tissue-threshold: invalid fixed_threshold: 1.0 (need 0 <= T < 1)"),
        (["--mpp-tolerance", "0.5"], "argument --mpp-tolerance: invalid mpp_tolerance: 0.5 (need 0 <= FRAC < 0.5)"),
        (["--default-mpp", "inf"], "argument --default-mpp: invalid default_mpp: inf (need 0 < UM < 1000)"),
        (["--thumb-mpp", "inf"], "argument --thumb-mpp: invalid thumb_mpp: inf (need 0 < UM <= 1000)"),
        (["--thumb-mpp", "1e9"], "argument --thumb-mpp: invalid thumb_mpp: 1000000000.0 (need 0 < UM <= 1000)"),
        (["--max-upsample", "0.5"], "argument --max-upsample: invalid max_upsample: 0.5 (need a finite X >= 1)"),
        (["--shard-size", "1e400"], "argument --shard-size: not a size: '1e400'"),
        (["--min-tissue", "2"], "argument --min-tissue: must be between 0 and 1: '2'"),
    ],
)
def test_values_the_options_refuse_are_one_line_usage_errors_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    make_slides(tmp_path / "in", 1, seed=1, width=512, height=512)
    out = tmp_path / "out"
    assert usage_error(capsys, str(tmp_path / "in"), "-o", str(out), *args) == f"wsishard build: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_an_mpp_csv_value_that_is_not_a_positive_number_is_ausage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    make_slides(tmp_path / "in", 2, seed=1, width=512, height=512)
    (tmp_path / "mpp.csv").write_text(f"slide,mpp\nslide-000,0.25\nslide-001,{value}\n")
    out = tmp_path / "out"
    err = usage_error(capsys, str(tmp_path / "in"), "-o", str(out), "--mpp-csv", str(tmp_path / "mpp.csv"))
    assert err.startswith("wsishard build: error: argument --mpp-csv: --mpp-csv ")
    assert err.endswith(f"mpp.csv: mpp of 'slide-001' (line 3) is {value}: need a level-0 mpp > 0 and < 1000")
    assert not out.exists()


def test_an_output_that_is_a_file_is_ausage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_slides(tmp_path / "in", 1, seed=1, width=512, height=512)
    (tmp_path / "afile").write_text("not a folder")
    err = usage_error(capsys, str(tmp_path / "in"), "-o", str(tmp_path / "afile"))
    assert err == f"wsishard build: error: -o {tmp_path / 'afile'}: exists and is not a folder"
    err = usage_error(capsys, str(tmp_path / "in"), "-o", str(tmp_path / "afile" / "out"))
    assert err == f"wsishard build: error: -o {tmp_path / 'afile' / 'out'}: {tmp_path / 'afile'} is not a folder"
    assert (tmp_path / "afile").read_text() == "not a folder"


def test_shard_samples_below_the_default_block_shrink_the_blocks(tmp_path: Path) -> None:
    """A block is never split between shards: with ``--shard-samples 5`` the default blocks shrink to fit (2x2
    patches), and the build records the side it chose."""
    make_slides(tmp_path / "in", 1, seed=1, width=2048, height=2048)
    proc = _run(
        "build", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--shard-samples", "5", "--patch-size", "64"
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["options"]["patch"]["block_patches"] == 2
    assert len(manifest["shards"]) > 1 and all(0 < shard["samples"] <= 5 for shard in manifest["shards"])


def test_shard_samples_below_a_chosen_block_are_refused() -> None:
    with pytest.raises(OptionError, match=r"invalid shard_samples: 10 \(need >= 16: one block\)"):
        BuildOptions(shard_samples=10, patch=PatchOptions(block_patches=4))


def test_empty_folder_and_missing_manifest_say_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = _run("build", str(tmp_path / "empty"), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2 and "no slide files" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run("inspect", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "manifest" in proc.stderr and "not found" in proc.stderr


def test_an_error_wsishard_does_not_name_has_its_own_exit_status_and_a_traceback_with_v(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Not 2 (bad usage): a script tells "other arguments" from "fix the environment, or report a bug"."""
    (tmp_path / "taken").write_text("a file where the demo wants a folder")
    argv = ["demo", "-o", str(tmp_path / "taken"), "--slides", "1", "-q"]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("wsishard demo: error: NotADirectoryError: ") and len(err.splitlines()) == 1
    assert err.endswith("(run with -v for the traceback)")
    assert not caplog.records
    assert main(["-v", *argv]) == 3
    assert capsys.readouterr().err.startswith("wsishard demo: error: NotADirectoryError: ")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "wsishard demo failed" in logged and "Traceback (most recent call last)" in logged


def test_tissue_options_reach_the_build() -> None:
    from wsishard.buildflags import build_options
    from wsishard.cli import parser

    args = parser().parse_args(
        [
            "build",
            "x",
            "-o",
            "y",
            "--tissue-median-um",
            "12",
            "--min-object-um2",
            "500",
            "--tissue-saturation-only",
            "--tissue-threshold",
            "0.2",
            "--thumb-mpp",
            "4",
        ]
    )
    tissue = build_options(args).tissue
    assert (tissue.median_um, tissue.min_object_um2, tissue.use_darkness) == (12.0, 500.0, False)
    assert (tissue.fixed_threshold, tissue.thumb_mpp, tissue.close_um) == (0.2, 4.0, 16.0)
    proc = _run("build", "x", "-o", "y", "--min-hole-um2", "-5")
    assert proc.returncode == 2 and "must be >= 0" in proc.stderr


def test_parse_size() -> None:
    assert parse_size("512MB") == 512_000_000
    assert parse_size("1GiB") == 1024**3
    assert parse_size("100k") == 100_000
    assert parse_size("4096") == 4096


# ---- issue 28 ------------------------------------------------------------------------------------------------

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("secret", [SECRET, "wJalrXUtnFEMI/K7MDENG+bPxRfiCY/EXAMPLEKEY"])  # AWS secrets hold "/"
@pytest.mark.parametrize("where", ["input", "-o", "verify", "inspect"])
def test_credentials_in_an_s3_url_are_refused_and_never_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, secret: str, where: str
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # no credential lookups on the network, whatever happens
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    url = f"s3://AKIAEXAMPLEKEYID:{secret}@bucket/in/"
    make_slides(tmp_path / "in", 1, seed=1, width=512, height=512)
    argv = {
        "input": ["build", url, "-o", str(tmp_path / "out"), "-q"],
        "-o": ["build", str(tmp_path / "in"), "-o", url, "-q"],
        "verify": ["verify", url, "-q"],
        "inspect": ["inspect", url],
    }[where]
    assert main(argv) == 2
    seen = capsys.readouterr()
    assert "credentials in an s3:// URL are not read" in seen.err and len(seen.err.strip().splitlines()) == 1
    assert "s3://***@bucket/in/" in seen.err
    for part in secret.split("/"):
        assert part not in seen.out + seen.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "environ",
    [
        {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3"},
        {
            "SLURM_ARRAY_TASK_ID": "5",
            "SLURM_ARRAY_TASK_COUNT": "3",
            "SLURM_ARRAY_TASK_MIN": "0",
            "SLURM_ARRAY_TASK_MAX": "7",
        },  # --array=0,5,7
        {"SLURM_ARRAY_TASK_ID": "abc", "SLURM_ARRAY_TASK_COUNT": "3"},
    ],
)
def test_a_slurm_task_that_is_no_part_is_a_usage_error_that_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    make_slides(tmp_path / "in", 1, seed=1, width=512, height=512)
    err = usage_error(capsys, str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--patch-size", "64", "-q")
    assert err.startswith("wsishard build: error: a Slurm array job") and "SLURM_ARRAY_TASK" in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_an_upsample_past_max_upsample_fails_the_slide_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_slides(tmp_path / "in", 1, seed=1, width=512, height=512)
    code = main(
        [
            "build",
            str(tmp_path / "in"),
            "-o",
            str(tmp_path / "out"),
            "--mpp",
            "1e-30",
            "--allow-upsample",
            "--jobs",
            "1",
            "-q",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED slide-000.svs: target 1e-30 mpp would upsample level 0 (0.25 mpp) 2.5e+29x, more than " in out
    assert "--max-upsample 4 allows" in out and "MemoryError" not in out


@pytest.mark.parametrize("command", ["build", "inspect", "verify", "merge", "demo"])
def test_every_command_help_has_a_description_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    blocks = capsys.readouterr().out.split("\n\n")
    assert blocks[0].startswith(f"usage: wsishard {command}")
    assert not blocks[1].startswith(("positional arguments", "options")), blocks[1]  # a description comes first
    assert len(blocks[1].split()) >= 8


def test_the_progress_ends_at_every_shard_written(tmp_path: Path) -> None:
    from wsishard.builder.options.buildopts import BuildProgress
    from wsishard.builder.run.orchestrate import build

    make_slides(tmp_path / "in", 2, seed=3, width=1536, height=1536)
    events: list[BuildProgress] = []
    options = BuildOptions(patch=PatchOptions(patch_size_px=64), shard_samples=30, jobs=1, qc=False)
    manifest = build([str(tmp_path / "in")], str(tmp_path / "out"), options, progress=events.append)
    last = [e for e in events if e.stage == "extract"][-1]
    assert len(manifest.shards) > 1 and last.done == last.total == len(manifest.shards)  # not 6/7 shards
    assert last.patches_done == last.patches_total == manifest.total_samples


def test_the_demo_of_one_slide_speaks_of_one_slide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wsishard.demo

    monkeypatch.setattr(wsishard.demo, "DEMO_SLIDE_PX", 2048)  # a small slide; the build and its summary are real
    monkeypatch.setattr(wsishard.demo, "_stream_batches", lambda *args: None)  # the stream: its own tests
    said: list[str] = []
    assert wsishard.demo.run_demo(str(tmp_path / "demo"), said.append, n_slides=1, jobs=1) == 0
    assert said[0].startswith("generating 1 synthetic slide (2048x2048 px")  # not "1 synthetic slides"
    assert any(line.startswith("1 slide (1 ok, 0 failed)") for line in said)
