#!/usr/bin/env python
"""Benchmark weighted and selected streaming against the unweighted loader, locally and on S3 (moto).

Example::

    python scripts/bench_sampling.py --quick
    python scripts/bench_sampling.py --workdir /data/bench

The build is bench_stream.py's (synthetic 40x slides at 0.25 mpp, 256 px patches at 0.5 mpp, its cache shared),
with slide labels added (the last slide of every five is label 1: about 80/20), so ``weights="class"`` balances
something. Each round times the same loader (resampled, batch 256, 2 DataLoader workers, one warm-up batch per
worker) three ways one after the other: unweighted; ``weights="class"``; ``select=`` keeping patches with
``tissue >= 0.75``. The verdict per source is the median round's ratio against the unweighted loader (target
>= 0.8x): on a shared machine the rounds are interleaved so that a slow moment weighs on all three. S3: the same
files served by a moto server in this process.

Prints a table and one line ``JSON: {...}``, saved as ``benchmarks/results/bench_sampling.json`` (benchresults.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench_stream import FULL, QUICK, Mode, log, prepare  # this folder's module (scripts/ is on sys.path)
from benchs3 import moto_s3

BATCH, WORKERS, TARGET = 256, 2, 0.8
KINDS = ("unweighted", "class", "select")


def _tissue(t: Any) -> Any:
    return t["tissue"] >= 0.75


def labelled(workdir: Path, mode: Mode) -> Path:
    """bench_stream's build for ``mode``, rebuilt once with slide labels (every fifth slide label 1), and indexed."""
    from wsishard.builder.grid import PatchOptions
    from wsishard.builder.options import BuildOptions
    from wsishard.builder.run import build

    slides, _ = prepare(workdir, mode)
    out = workdir / mode.name / "labelled"
    if (out / "manifest.json").exists() and (out / "index.npz").exists():
        return out
    labels = {p: int(i % 5 == 4) for i, p in enumerate(slides)}
    opts = BuildOptions(patch=PatchOptions(target_mpp=0.5, patch_size_px=256), jobs=2, qc=False,
                        shard_samples=mode.shard_samples, seed=0, labels=labels)  # fmt: skip
    log(f"building labelled shards in {out}")
    build(slides, str(out), opts)
    return out


def time_loader(source: str, kind: str, batches: int, storage_options: dict[str, Any] | None) -> float:
    """Samples/s of a resampled loader (2 workers, batch 256) after one warm-up batch per worker."""
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    extra: dict[str, Any] = {"class": {"weights": "class"}, "select": {"select": _tissue}}.get(kind, {})
    ds = stream(source, batch_size=BATCH, seed=0, storage_options=storage_options, **extra)
    it = iter(loader(ds, num_workers=WORKERS))
    for _ in range(WORKERS):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches * BATCH / (time.perf_counter() - t0)
    del it
    return rate


def rounds(source: str, n: int, batches: int, storage_options: dict[str, Any] | None) -> list[dict[str, float]]:
    out = []
    for r in range(n):
        row = {kind: time_loader(source, kind, batches, storage_options) for kind in KINDS}
        log(f"round {r + 1}/{n}: " + ", ".join(f"{k} {v:.0f}/s" for k, v in row.items()))
        out.append(row)
    return out


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": runs}
    for kind in KINDS[1:]:
        ratio = statistics.median(r[kind] / r["unweighted"] for r in runs)
        out[kind] = {"ratio": ratio, "pass": ratio >= TARGET}
    out["unweighted_samples_per_s"] = statistics.median(r["unweighted"] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="bench_stream's quick build, 3 rounds of 8 batches")
    ap.add_argument("--workdir", default="/tmp/wsishard-bench-stream", help="cache of slides and shards")
    ap.add_argument("--no-s3", action="store_true", help="skip the moto S3 rows")
    args = ap.parse_args()
    mode = QUICK if args.quick else FULL
    n, batches = (3, 8) if args.quick else (5, 30)
    out = labelled(Path(args.workdir), mode)
    result: dict[str, Any] = {"mode": mode.name, "workers": WORKERS, "batch": BATCH,
                              "local": _summary(rounds(str(out), n, batches, None))}  # fmt: skip
    if not args.no_s3:
        with moto_s3(out, "wsishard-sampling", "out") as (url, options):
            result["s3"] = _summary(rounds(url, n, batches, options))
    print(
        f"Loader samples/s against the unweighted loader, {mode.name} build, batch {BATCH}, {WORKERS} workers "
        f"(median of {n} interleaved rounds; target >= {TARGET}x)"
    )
    print("| source | unweighted samples/s | " + " | ".join(f"{k} (ratio)" for k in KINDS[1:]) + " |")
    print("|---|---|" + "---|" * (len(KINDS) - 1))
    for where in ("local", "s3"):
        if where in result:
            r = result[where]
            verdicts = [f"{r[k]['ratio']:.2f}x {'PASS' if r[k]['pass'] else 'MISS'}" for k in KINDS[1:]]
            print(f"| {where} | {r['unweighted_samples_per_s']:.0f} | " + " | ".join(verdicts) + " |")
    print("JSON: " + json.dumps(result))


if __name__ == "__main__":
    from benchresults import run

    raise SystemExit(run("bench_sampling", main))
