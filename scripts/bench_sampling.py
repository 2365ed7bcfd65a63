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

Prints a table and one line ``JSON: {...}``; saves it under ``benchmarks/results/`` if that folder exists.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_stream import FULL, QUICK, Mode, log, prepare  # this folder's module (scripts/ is on sys.path)

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


@contextmanager
def moto(folder: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """A moto S3 server holding every file of ``folder`` (shards, indexes, summary, manifest)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ["AWS_ACCESS_KEY_ID"] = os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"  # moto's dummy values
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="wsishard-sampling")
        for name in sorted(os.listdir(folder)):
            if (folder / name).is_file():
                client.upload_file(str(folder / name), "wsishard-sampling", f"out/{name}")
        yield "s3://wsishard-sampling/out", {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    finally:
        server.stop()


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
        with moto(out) as (url, options):
            result["s3"] = _summary(rounds(url, n, batches, options))
    for where in ("local", "s3"):
        if where in result:
            r = result[where]
            verdicts = [f"{k}: {r[k]['ratio']:.2f}x {'PASS' if r[k]['pass'] else 'MISS'}" for k in KINDS[1:]]
            print(f"{where:<6} unweighted {r['unweighted_samples_per_s']:7.0f} samples/s   " + "   ".join(verdicts))
    line = json.dumps(result)
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    if folder.is_dir():
        (folder / f"bench_sampling-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(line + "\n")
    print("JSON: " + line)


if __name__ == "__main__":
    main()
