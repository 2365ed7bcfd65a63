#!/usr/bin/env python
"""Benchmark the per-sample index at archive scale: its size and load time, and weighted start-up at ~3e8 samples.

    python benchmarks/bench_index.py --quick            # start-up at 3e7 samples; index rows at 1k, 100k, 1M
    python benchmarks/bench_index.py                    # start-up at 3e8 samples (a TCGA-sized build)
    python benchmarks/bench_index.py --smoke            # tiny sizes, the same code path, nothing saved (CI)

Synthetic, no pixels; each part (rows, scan, startup) in its own child process. What each figure means is on the
docs' performance page.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit as bk
import numpy as np

SHARD_SAMPLES, GROUP_SLIDES, SLIDE_SAMPLES = 18_000, 32, 3_000


def _index_bytes(n: int, seed: int = 0) -> bytes:
    """A shard index of ``n`` samples: its rows filled in directly (the build's cost of making them, parsing its
    tar records back, is :func:`_build_cost`'s)."""
    from wsishard.shards.index import COLUMNS, IndexWriter

    rng = np.random.default_rng(seed)
    writer = IndexWriter()
    slides = [f"TCGA-{seed:02d}-{s:04d}-01Z-00-DX1" for s in range(GROUP_SLIDES)]
    for s in slides:
        writer._slides[s] = len(writer._slides)
    x, y = rng.integers(0, 100_000, n), rng.integers(0, 80_000, n)
    tissue, background, sharp = rng.random(n).round(4), (rng.random(n) * 0.2).round(4), rng.gamma(4, 50, n).round(2)
    size = 14_000 + 3 * 512
    # by column name: a column added to the index since is filled with NaN (unknown), never misplaced
    values = {"offset": np.arange(n) * size, "size": np.full(n, size), "slide": np.arange(n) % GROUP_SLIDES, "x": x}
    values |= {"label": (np.arange(n) % 5 == 4).astype(int), "y": y, "patch_mpp": np.full(n, 0.5039), "tissue": tissue}
    values |= {"background": background, "dark": np.zeros(n), "sharpness": sharp}
    columns = [values[c].tolist() if c in values else [float("nan")] * n for c in COLUMNS]
    writer._rows.extend(zip(*columns, strict=True))
    writer._keys.extend(f"{slides[i % GROUP_SLIDES]}_x{x[i]}_y{y[i]}".encode() for i in range(n))
    return writer.to_bytes()


def _build_cost(n: int = 2048) -> float:
    """Seconds per sample the shard writer spends indexing: parsing back the tar records it appends."""
    from wsishard.shards.index import IndexWriter
    from wsishard.shards.writer import sample_records

    records = []
    for i in range(n):
        meta = {"slide_id": f"s{i % GROUP_SLIDES}", "x": i, "y": i, "patch_mpp": 0.5039, "tissue": 0.75, "label": 1}
        meta |= {"background": 0.1, "dark": 0.0, "sharpness": 212.5}
        members = {"jpg": b"\xff" * 14_000, "json": json.dumps(meta).encode(), "cls": b"1"}
        records.append(sample_records(f"s{i % GROUP_SLIDES}_x{i}_y{i}", members))
    chunks = [b"".join(records[k : k + 256]) for k in range(0, n, 256)]  # a segment's records at a time
    writer, t0 = IndexWriter(), time.perf_counter()
    for chunk in chunks:
        writer.add(chunk, 0)
    writer.to_bytes()
    return (time.perf_counter() - t0) / n


def part_rows(n: int, _args: Any) -> dict[str, Any]:
    from wsishard.shards.index import load_index

    t0 = time.perf_counter()
    data = _index_bytes(n)
    made = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = load_index(data)
    loaded = time.perf_counter() - t0
    t0 = time.perf_counter()
    table = index.table("shard-000000-0000.tar")
    mask = table["tissue"] >= 0.5
    tabled = time.perf_counter() - t0
    out = {"samples": n, "bytes": len(data), "bytes_per_sample": len(data) / n, "fill_s": made, "load_s": loaded}
    return out | {"table_select_s": tabled, "selected": int(mask.sum()), "rss_mb": bk.rss_mb()}


def _write_build(root: Path, shards: int, *, with_indexes: bool) -> None:
    """A build's manifest and index summary of ``shards`` shards (and, ``with_indexes``, every shard index)."""
    from wsishard.format import shard_name
    from wsishard.manifest import Manifest, ShardRecord
    from wsishard.shards.index import index_name
    from wsishard.shards.summary import SUMMARY_NAME, Summary

    names = [shard_name(s) for s in range(shards)]
    kw = {"samples": SHARD_SAMPLES, "bytes": SHARD_SAMPLES * 14_000, "sha256": "0" * 64, "slides": 32}
    records = [ShardRecord(name=n, **kw) for n in names]
    options = {"patch": {"target_mpp": 0.5, "patch_size_px": 256, "mpp_tolerance": 0.0}, "patch_size": 256}
    manifest = Manifest(options=options, shards=records, slides=[], wsishard_version="bench")
    (root / "manifest.json").write_text(manifest.to_json())
    # groups of 32 slides of ~3,000 samples each: a group's ~96,000 samples fill ~5.3 shards, each shard mixing
    # all 32 of its group's slides (the build's interleaving); slide s of group g is global slide 32 g + s
    group_of = np.arange(shards) * SHARD_SAMPLES // (GROUP_SLIDES * SLIDE_SAMPLES)
    per = SHARD_SAMPLES // GROUP_SLIDES
    slide_index = (group_of[:, None] * GROUP_SLIDES + np.arange(GROUP_SLIDES)[None, :]).reshape(-1).astype(np.int32)
    n_slides = int(slide_index.max()) + 1
    counts = np.tile([SHARD_SAMPLES * 4 // 5, SHARD_SAMPLES // 5], (shards, 1)).astype(np.int64)
    slides = np.array([f"TCGA-{i:06d}".encode() for i in range(n_slides)])
    ptr = np.arange(0, shards * GROUP_SLIDES + 1, GROUP_SLIDES, dtype=np.int64)
    kw = {"slide_index": slide_index, "slide_count": np.full(shards * GROUP_SLIDES, per, dtype=np.int64)}
    summary = Summary(np.array(names, dtype="S"), np.array([0, 1]), counts, slides, ptr, **kw)
    (root / SUMMARY_NAME).write_bytes(summary.to_bytes())
    if with_indexes:
        data = _index_bytes(SHARD_SAMPLES)  # the same rows in every shard: only the reading is measured
        for n in names:
            (root / index_name(n)).write_bytes(data)


def part_scan(n: int, args: Any) -> dict[str, Any]:
    from wsishard.streaming import selection
    from wsishard.streaming.sources import stream
    from wsishard.streaming.world import World

    shards = max(1, n // SHARD_SAMPLES)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        _write_build(Path(tmp), shards, with_indexes=True)
        base = bk.rss_mb()
        t0 = time.perf_counter()
        ds = stream(tmp, batch_size=256, resampled=False, select=_tissue, world=World(rank=0, world_size=8))
        took = time.perf_counter() - t0
        assert ds.sampling is not None
        t0 = time.perf_counter()  # split_scan=True: one rank's share of 8 (the sum over ranks is one all-reduce)
        selection.scan_shared(ds.sampling, ds.opener, len(ds.sampling.labels), (0, 8, None))
        share_s = time.perf_counter() - t0
    out = {"samples": shards * SHARD_SAMPLES, "shards": shards, "scan_s": took, "selected": int(ds.counts.sum())}
    return out | {"split_of_8_s": share_s, "rss_mb": bk.rss_mb(), "rss_before_mb": base}


def part_startup(n: int, args: Any) -> dict[str, Any]:
    from wsishard.streaming.sources import stream
    from wsishard.streaming.world import World

    shards = n // SHARD_SAMPLES
    out: dict[str, Any] = {"samples": shards * SHARD_SAMPLES, "shards": shards}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        _write_build(Path(tmp), shards, with_indexes=False)
        out["summary_bytes"] = os.path.getsize(Path(tmp) / "index.npz")
        base = bk.rss_mb()
        for weights in ("class", "slide", "select"):
            t0 = time.perf_counter()
            how = {"select": _tissue} if weights == "select" else {"weights": weights}  # select: no index read
            ds = stream(tmp, batch_size=256, seed=1, world=World(rank=3, world_size=64), **how)  # type: ignore[arg-type]
            stream_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            ds.pipeline(World(rank=3, world_size=64, worker=5, num_workers=8), 0, done=1000)  # a resumed reader
            reader_s = time.perf_counter() - t0
            out[weights] = {"stream_s": stream_s, "reader_s": reader_s, "plan_pickle_bytes": len(_pickled(ds))}
    out.update(rss_mb=bk.rss_mb(), rss_before_mb=base)
    return out


def _tissue(t: dict[str, np.ndarray]) -> np.ndarray:
    return t["tissue"] >= 0.5


def _pickled(obj: Any) -> bytes:
    import pickle

    buf = io.BytesIO()
    pickle.dump(obj.sampling, buf)
    return buf.getvalue()


def baseline(_n: int, _args: Any) -> dict[str, Any]:
    import torch  # noqa: F401  # what every rank imports anyway

    import wsishard.streaming.dataset  # noqa: F401

    return {"rss_mb": bk.rss_mb()}


PARTS = {"rows": part_rows, "scan": part_scan, "startup": part_startup, "baseline": baseline}


def _child(part: str, n: int, args: Any) -> dict[str, Any]:
    return bk.child_json(__file__, [part, "--n", str(n), "--workdir", str(args.workdir)])


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("--samples", {"type": int, "default": 300_000_000, "help": "samples of the start-up build"}),
        ("--rows", {"default": "1000,100000,1000000", "help": "index sizes (samples), comma-separated"}),
        ("--n", {"type": int, "default": 0, "help": "a child part's size"}),
        argv=argv,
    )
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(PARTS[args.child](args.n, args)))
        return 0
    sizes = [1000, SHARD_SAMPLES] if args.smoke else [int(s) for s in args.rows.split(",")]
    total = bk.sized(args, 20 * SHARD_SAMPLES, 30_000_000, args.samples)
    result: dict[str, Any] = {"baseline": _child("baseline", 0, args), "build_us_per_sample": 1e6 * _build_cost()}
    result["rows"] = [_child("rows", n, args) for n in sizes]
    result["scan"] = [_child("scan", n, args) for n in sizes if n >= SHARD_SAMPLES]
    result["startup"] = _child("startup", total, args)
    return bk.emit(result, table(result), json_only=args.json_only)


def table(r: dict[str, Any]) -> str:
    rows = [["idle child (torch + wsishard imported)", f"{r['baseline']['rss_mb']:.0f} MB RSS", "", ""]]
    rows.append(["build: indexing the records it writes", f"{r['build_us_per_sample']:.0f} us/sample", "", ""])
    for x in r["rows"]:
        size = f"{x['bytes'] / 1e6:.2f} MB ({x['bytes_per_sample']:.1f} B/sample)"
        times = [f"load {1000 * x['load_s']:.1f} ms", f"table + select {1000 * x['table_select_s']:.1f} ms"]
        rows.append([f"shard index of {x['samples']:,} samples", size, *times])
    for x in r["scan"]:
        rss = [f"peak RSS {x['rss_mb']:.0f} MB", f"(before {x['rss_before_mb']:.0f} MB)"]
        rows.append([f"select= scan, {x['samples']:,} samples / {x['shards']} shards", f"{x['scan_s']:.2f} s", *rss])
        label = f"select= scan, split_scan=True, one rank of 8, {x['samples']:,} samples"
        rows.append([label, f"{x['split_of_8_s']:.2f} s", "", ""])
    s = r["startup"]
    if r["scan"]:
        x, total = r["scan"][-1], s["samples"]
        alone, shared = x["scan_s"] / x["samples"] * total, x["split_of_8_s"] / x["samples"] * 8 * total / 64
        label = f"select= epoch start-up at {total:.1e} samples, one process (extrapolated from {x['samples']:,})"
        rows.append([label, f"{alone:.0f} s", "", ""])
        label = "the same under torchrun, 64 ranks (default: the scan split over them)"
        rows.append([label, f"{shared:.1f} s per rank", "(one rank's share, measured)", bk.verdict(shared < 10)])
    summary = f"{s['summary_bytes'] / 1e6:.1f} MB"
    rows.append([f"summary of {s['samples']:.2e} samples / {s['shards']:,} shards", summary, "", ""])
    for w in ("class", "slide", "select"):
        what = "select=, resampled (default: no index read)" if w == "select" else f"weights={w!r}"
        took, ok = f"{s[w]['stream_s']:.2f} s + {s[w]['reader_s']:.2f} s", s[w]["stream_s"] + s[w]["reader_s"] < 10
        pickled = f"plan pickled {s[w]['plan_pickle_bytes'] / 1e6:.1f} MB"
        rows.append([f"{what} start-up (stream + one reader)", took, pickled, bk.verdict(ok)])
    before = f"(before {s['rss_before_mb']:.0f} MB)"
    rows.append(["start-up peak RSS (one rank)", f"{s['rss_mb']:.0f} MB", before, bk.verdict(s["rss_mb"] < 1024)])
    caption = "Per-sample index at archive scale (targets: start-up < 10.0 s and < 1024.0 MB per rank)"
    return bk.markdown(("what", "measured", "", ""), rows, caption)


if __name__ == "__main__":
    import benchkit

    raise SystemExit(benchkit.run("bench_index", main))
