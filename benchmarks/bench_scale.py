#!/usr/bin/env python
"""Benchmark the build's bookkeeping at archive scale, without pixels, and one real 2-part build from S3.

    python benchmarks/bench_scale.py --sizes 10000,100000
    python benchmarks/bench_scale.py --sizes 10000,100000,1000000 --no-s3
    python benchmarks/bench_scale.py --smoke      # 1,000 slides, a small S3 build, nothing saved (CI)

Synthetic scan records per size, each stage (groups and part splits, every group's plan, the scan state, the
manifest, a rank's stream start-up) in its own child process (its peak RSS its own). What each figure means is on
the docs' performance page.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit as bk
import numpy as np

GROUP_SLIDES, SEED, PARTS, SAMPLES_PER_SHARD, BLOCK = 32, 0, 16, 18_000, 16
MEDIAN_PATCHES, SIGMA, NO_TISSUE = 3000, 0.8, 0.05
STAGES = ("groups", "plan", "state", "manifest", "startup")
log = bk.logger("bench_scale")


def _patches(slide: int) -> int:
    rng = np.random.default_rng((SEED, slide, 0xBE))
    if rng.random() < NO_TISSUE:
        return 0
    return int(min(60_000, rng.lognormal(math.log(MEDIAN_PATCHES), SIGMA)))


def _block_sizes(slide: int) -> list[int]:
    """A slide's blocks: mostly full (16 patches), tissue edges cut some short."""
    n = _patches(slide)
    rng = np.random.default_rng((SEED, slide, 0xB1))
    m = n // 4 + 16  # more blocks than can be needed (a block holds at least 1 patch, 13 on average)
    takes = np.where(rng.random(m) < 0.6, BLOCK, rng.integers(1, BLOCK + 1, m))
    ends = np.cumsum(takes)
    while ends[-1] < n:
        ends = np.r_[ends, ends[-1] + ends]
    k = int(np.searchsorted(ends, n)) + 1 if n else 0
    return np.diff(np.r_[0, np.minimum(ends[:k], n)]).tolist()


def _file_sizes(n: int) -> list[int]:
    return np.random.default_rng((SEED, 0xF5)).lognormal(math.log(1.5e9), 0.6, size=n).astype(np.int64).tolist()


def stage_groups(n: int, _args: Any) -> dict[str, Any]:
    from wsishard.builder.plan.plan import make_groups, part_groups

    t = time.perf_counter()
    groups = make_groups(n, GROUP_SLIDES, SEED)
    sizes = _file_sizes(n)
    parts = [part_groups(groups, sizes, (i, PARTS)) for i in range(1, PARTS + 1)]
    seconds = time.perf_counter() - t
    share = max(sum(len(groups[g]) for g in p) for p in parts) / n
    byte_share = max(sum(sizes[s] for g in p for s in groups[g]) for p in parts) / sum(sizes)
    return {
        "seconds": seconds,
        "groups": len(groups),
        "part_share_x_n": share * PARTS,
        "part_bytes_x_n": byte_share * PARTS,
    }


def stage_plan(n: int, args: Any) -> dict[str, Any]:
    from wsishard.builder.plan.plan import make_groups, plan_group

    t = time.perf_counter()
    groups = make_groups(n, GROUP_SLIDES, SEED)
    grouping = time.perf_counter() - t
    picks = range(len(groups))
    if len(groups) > args.plan_groups:
        picks = sorted(np.random.default_rng(SEED).choice(len(groups), args.plan_groups, replace=False).tolist())
    shards = blocks = planned = 0.0
    for g in picks:
        sizes = {s: _block_sizes(s) for s in groups[g]}  # the group's scan results: not timed
        blocks += sum(map(len, sizes.values()))
        t = time.perf_counter()
        shards += len(plan_group(g, sizes, samples_per_shard=SAMPLES_PER_SHARD, seed=SEED))
        planned += time.perf_counter() - t
    scale = len(groups) / len(picks)
    out = {"seconds": grouping + planned * scale, "sampled": scale > 1, "groups_planned": len(picks)}
    return out | {
        "shards": round(shards * scale),
        "blocks": round(blocks * scale),
        "per_group_ms": 1000 * planned / len(picks),
    }


def _record(slide: int) -> Any:
    from wsishard.manifest import SlideRecord

    n, name = _patches(slide), f"TCGA-{slide:07d}"
    kw = {"status": "ok" if n else "failed", "reason": "" if n else "no tissue found", "width": 100_000}
    kw |= {"height": 80_000, "slide_mpp": 0.2520, "mpp_source": "openslide", "patch_mpp": 0.5, "level": 0}
    kw |= {"downsample": 1.0, "tissue_fraction": 0.25, "candidates": 4 * n, "patches": n}
    return SlideRecord(slide_id=f"{name}-01Z-00-DX1", file=f"s3://archive/slides/{name}.svs", **kw)


def _scan(slide: int) -> Any:
    from wsishard.builder.scan.grid import Candidates
    from wsishard.builder.scan.scan import ScanResult

    record = _record(slide)
    count = record.patches
    if not count:
        return ScanResult(record)
    rng = np.random.default_rng((SEED, slide, 0xCA))
    cols, rows, tissue = rng.integers(0, 400, count), rng.integers(0, 300, count), rng.random(count, dtype=np.float32)
    kw = {"l0_per_o": 1.984, "stride": 256, "patch": 256, "total": 4 * count}
    return ScanResult(record, Candidates(col=cols, row=rows, tissue=tissue, **kw))


def stage_state(n: int, args: Any) -> dict[str, Any]:
    from wsishard.builder.scan.scanstate import ScanStore
    from wsishard.storage.output import Destination

    sample = min(n, args.state_slides)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        store = ScanStore(Destination(tmp), ".wsishard")
        t = time.perf_counter()
        for s in range(sample):
            store.save(s, _scan(s))
        seconds = time.perf_counter() - t
        folder = Path(tmp, ".wsishard", "scan")
        nbytes = sum(p.stat().st_size for p in folder.iterdir())
    scale = n / sample
    return {
        "seconds": seconds * scale,
        "sampled": scale > 1,
        "bytes": round(nbytes * scale),
        "bytes_per_slide": nbytes / sample,
    }


def _manifest(n: int, n_shards: int) -> Any:
    from wsishard.format import shard_index, shard_name
    from wsishard.manifest import Manifest, ShardRecord

    per_group = max(1, n_shards // max(1, math.ceil(n / GROUP_SLIDES)))
    kw = {"samples": SAMPLES_PER_SHARD, "slides": GROUP_SLIDES}
    names = (shard_name(shard_index(i // per_group, i % per_group)) for i in range(n_shards))
    shards = [ShardRecord(name=name, bytes=256_000_000 + i, sha256=f"{i:064x}", **kw) for i, name in enumerate(names)]
    slides = [_record(s) for s in range(n)]
    options = {"inputs": ["s3://archive/slides/"], "patch": {"patch_size_px": 256, "target_mpp": 0.5}, "seed": SEED}
    return Manifest(options=options, shards=shards, slides=slides, wsishard_version="bench")


def _shard_count(n: int) -> int:
    """The shards of a build of ``n`` slides, as the planner makes them (its per-group count, estimated)."""
    groups = math.ceil(n / GROUP_SLIDES)
    per_group = math.ceil(GROUP_SLIDES * MEDIAN_PATCHES * math.exp(SIGMA**2 / 2) / SAMPLES_PER_SHARD)
    return groups * per_group


def stage_manifest(n: int, args: Any) -> dict[str, Any]:
    from wsishard.manifest import manifest_files
    from wsishard.storage.output import Destination

    manifest = _manifest(n, _shard_count(n))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        t = time.perf_counter()
        dest = Destination(tmp)
        for name, data in manifest_files(manifest):
            dest.write_bytes(name, data)
        seconds = time.perf_counter() - t
        sizes = {p.name: p.stat().st_size for p in Path(tmp).iterdir()}
    out = {"seconds": seconds, "shards": len(manifest.shards), "manifest_bytes": sizes["manifest.json"]}
    return out | {"slides_bytes": sizes["slides.jsonl"], "bytes_per_slide": sizes["slides.jsonl"] / n}


def _startup(n_slides: int, n_shards: int, workdir: str | None) -> tuple[float, int]:
    from wsishard.manifest import manifest_files
    from wsishard.storage.opener import load_manifest
    from wsishard.storage.urls import join

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for name, data in manifest_files(_manifest(n_slides, n_shards)):
            Path(tmp, name).write_bytes(data)
        t = time.perf_counter()
        manifest, root = load_manifest(tmp, slides=False)
        refs = [(join(root, rec.name), rec.samples) for rec in manifest.shards]
        return time.perf_counter() - t, len(refs)


def stage_startup(n: int, args: Any) -> dict[str, Any]:
    seconds, shards = _startup(n, _shard_count(n), args.workdir)
    fixed, _ = _startup(1000, 100_000, args.workdir)
    return {"seconds": seconds, "shards": shards, "seconds_100k_shards": fixed}


def _run_child(stage: str, n: int, args: Any) -> dict[str, Any]:
    flags = ["--sizes", str(n), "--plan-groups", str(args.plan_groups), "--state-slides", str(args.state_slides)]
    return bk.child_json(__file__, [stage, *flags, "--workdir", str(args.workdir)])


def s3_two_parts(workdir: str, smoke: bool = False) -> dict[str, Any]:
    """Two parts of a build of generated slides (SVS and TIFF) read from a local moto S3 server, in place (by range)
    and copied (through OpenSlide): the slide bytes each part read (its slide records' ``bytes_read``)."""
    from wsishard import build
    from wsishard.builder.run.merge import merge
    from wsishard.testing.synthetic import make_slides

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        n, px = (4, 2048) if smoke else (6, 4096)
        slides, per_part, shards = make_slides(Path(tmp, "slides"), n, seed=3, width=px, height=px), [], {}
        with bk.moto_s3(Path(tmp, "slides"), "bench", "slides") as (url, options):
            for how, fast in (("in place", True), ("copied", False)):
                kw = {"patch_size": 128, "shard_samples": 200, "group_slides": 2, "jobs": 2, "fast_path": fast}
                for i in (1, 2):
                    t = time.perf_counter()
                    manifest = build([url + "/"], str(Path(tmp, how)), storage_options=options, part=(i, 2), **kw)
                    files = {Path(s.file).name for s in manifest.slides}
                    own = sum(os.path.getsize(Path(tmp, "slides", f)) for f in files)
                    row = {"reads": how, "part": i, "slides": len(files), "slide_bytes": own}
                    row |= {
                        "seconds": time.perf_counter() - t,
                        "bytes_read": sum(s.bytes_read for s in manifest.slides),
                    }
                    per_part.append(row)
                shards[how] = len(merge(str(Path(tmp, how))).shards)
        total = sum(os.path.getsize(s.path) for s in slides)
    return {"slides": len(slides), "slide_bytes": total, "parts": per_part, "shards": shards}


def _cell(r: dict[str, Any], extra: str = "") -> str:
    return ("~" if r.get("sampled") else "") + f"{r['seconds']:.2f} s, " + (extra or f"{r['peak_rss_mb']:.0f} MB")


def tables(rows: dict[int, dict[str, dict[str, Any]]], baseline: float) -> tuple[list[str], dict[str, Any]]:
    """One row per size, then the targets (those a run did not reach: ``not run``)."""
    cells = []
    for n, r in rows.items():
        g, p, st, m, su = (r[s] for s in STAGES)
        plan = _cell(p, f"{p['peak_rss_mb']:.0f} MB ({p['per_group_ms']:.1f} ms/group)")
        state = _cell(st, f"{st['bytes'] / 1e9:.2f} GB, {st['peak_rss_mb']:.0f} MB")
        manifest = _cell(m, f"{m['slides_bytes'] / 1e6:.1f} MB slides.jsonl, {m['peak_rss_mb']:.0f} MB RSS")
        cells.append([f"{n:,}", _cell(g), plan, state, manifest, f"{su['seconds']:.2f} s ({su['shards']:,})"])
    caption = f"Synthetic scan records, groups of {GROUP_SLIDES}, {PARTS} parts, each stage in its own child process "
    caption += f"(an idle child: {baseline:.0f} MB); `~`: extrapolated from a sample"
    head = (
        "slides",
        f"groups + {PARTS} part splits",
        "plan (all groups)",
        "scan state",
        "manifest write",
        "stream start-up (its shards)",
    )
    big, targets = rows.get(1_000_000), {}
    if big:
        planned, peak = (
            big["groups"]["seconds"] + big["plan"]["seconds"],
            max(big[s]["peak_rss_mb"] for s in ("groups", "plan")),
        )
        targets["1M slides planned in < 60 s"] = (f"{planned:.1f} s", planned < 60)
        targets["1M slides planned in < 4 GB"] = (f"{peak:.0f} MB peak", peak < 4096)
    share = max(r["groups"]["part_share_x_n"] for r in rows.values())
    targets["per-part work falling as 1/N (largest part x N <= 1.05)"] = (f"{share:.3f}x", share <= 1.05)
    startup = max(r["startup"]["seconds_100k_shards"] for r in rows.values())
    targets["stream start-up with 100k shards < 2 s per rank"] = (f"{startup:.2f} s", startup < 2)
    per_slide = {k: [r[k]["bytes_per_slide"] for r in rows.values()] for k in ("state", "manifest")}
    dev = max(max(abs(v / b[0] - 1) for v in b) for b in per_slide.values())
    linear = f"{dev:.1%} from linear ({per_slide['state'][0] / 1e3:.1f} KB scan state, "
    linear += f"{per_slide['manifest'][0]:.0f} B slide record a slide)"
    targets["state and manifest growth linear (within 10%)"] = (linear, dev <= 0.1 if len(rows) > 1 else None)
    out = {k: {"value": v, "verdict": "not run" if ok is None else bk.verdict(ok)} for k, (v, ok) in targets.items()}
    target_rows = [(k, t["value"], t["verdict"]) for k, t in out.items()]
    return [bk.markdown(head, cells, caption), bk.markdown(("target", "measured", ""), target_rows)], out


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("--sizes", {"default": "10000,100000,1000000", "help": "slide counts, comma-separated"}),
        ("--plan-groups", {"type": int, "default": 400, "help": "plan at most this many groups, extrapolate"}),
        ("--state-slides", {"type": int, "default": 10_000, "help": "write at most this many scan files"}),
        ("--no-s3", {"action": "store_true", "help": "skip the real 2-part build from a local S3 server"}),
        argv=argv,
    )
    if args.smoke:
        args.sizes, args.plan_groups, args.state_slides = "1000", 8, 50
    sizes = [int(s) for s in args.sizes.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        result = {} if args.child == "baseline" else globals()[f"stage_{args.child}"](sizes[0], args)
        print(json.dumps({**result, "peak_rss_mb": bk.rss_mb()}))
        return 0
    baseline, rows = _run_child("baseline", 1, args)["peak_rss_mb"], {}
    for n in sizes:
        log(f"{n:,} slides: {', '.join(STAGES)}")
        rows[n] = {stage: _run_child(stage, n, args) for stage in STAGES}
    printed, targets = tables(rows, baseline)
    s3 = None if args.no_s3 else s3_two_parts(str(args.workdir), args.smoke)
    if s3:
        head = ("reads", "part", "slides", "slide bytes", "bytes_read", "/ its slides", "seconds")
        cells = [
            [p["reads"], p["part"], p["slides"], f"{p['slide_bytes']:,}", f"{p['bytes_read']:,}"] for p in s3["parts"]
        ]
        for row, p in zip(cells, s3["parts"], strict=True):
            row += [f"{p['bytes_read'] / max(p['slide_bytes'], 1):.2f}x", f"{p['seconds']:.1f}"]
        printed.append(bk.markdown(head, cells, f"S3 2-part build: {s3['slides']} slides, {s3['slide_bytes']:,} bytes"))
    report = {"sizes": sizes, "baseline_rss_mb": baseline, "rows": rows, "s3": s3, "targets": targets}
    return bk.emit(report, *printed, json_only=args.json_only)


if __name__ == "__main__":
    import benchkit

    sys.exit(benchkit.run("bench_scale", main))
