#!/usr/bin/env python
"""Benchmark wsishard's training-time stream: the loader against its decode floor, device-ready, S3, resume, splits.

    python benchmarks/bench_stream.py --quick
    python benchmarks/bench_stream.py --quick --context   # only: one context scale against none (bench_stream_context)
    python benchmarks/bench_stream.py --quick --sampling  # only: weights= and select= against none (bench_sampling)
    python benchmarks/bench_stream.py --smoke             # seconds, nothing saved (CI)

Synthetic slides are generated and built once, cached in ``--workdir``. What each figure means and how its rounds are
taken (the decode floor, rounds sandwiched between floors, interleaved pairs, the user's first build, resume, the
one-shard split, context, sampling) is written on the docs' performance page.
"""

from __future__ import annotations

import io
import json
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import benchkit as bk
import numpy as np
import psutil
import torch

BATCH, SLIDE_MPP, TISSUE = 256, 0.25, 0.5  # patches: 256 px at 0.5 mpp (the build's defaults)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TARGETS = {"floor": 0.85, "device": 0.70, "s3": 0.80, "first_s": 2.0, "diversity": 0.80, "resume": 1.5, "one": 0.80}
USER_MPP, USER_SLIDES, USER_SIZE_PX = 0.2520, 6, 8192  # the user's first build: a real scanner's mpp, defaults
WIDE_WORKERS = 8  # the many-worker rows, on a machine with at least twice as many cores
PAIR_BATCHES = {1: 8, 2: 12}  # timed batches of a loader slice in an interleaved pair, by workers (~0.5 s)
RESUME_STEPS = (10, 10_000)  # resumed at these steps (2 workers)
FLOOR_ROUNDS = 4  # floor rounds per decoder, interleaved inside each worker
SAMPLING_TARGET = 0.9  # --sampling: weighted or selected samples/s against unweighted (issue 47)
log = bk.logger("bench_stream")


@dataclass(frozen=True)
class Mode:
    name: str
    n_slides: int
    size_px: int  # level-0 width = height of each slide
    shard_samples: int  # small, so 2 workers share many shards
    batches: int  # timed batches per loader run
    floor_samples: int  # JPEGs decoded per floor worker
    rounds: int  # rounds of floor / loader / floor again: ratios per round
    pairs: int  # interleaved pairs of floor and loader slices
    resume_rounds: int = 2
    least_rounds: int = 2  # --context and --sampling: at least this many interleaved rounds


SMOKE = Mode("smoke", 2, 4096, 16, 1, 32, 1, 1, resume_rounds=1, least_rounds=0)
QUICK = Mode("quick", 6, 8192, 64, 8, 2000, 1, 3)
FULL = Mode("full", 16, 12288, 128, 30, 6000, 5, 20)


def prepare(workdir: Path, mode: Mode) -> Path:
    """The benchmark's build (slides at exactly 0.25 mpp, many small shards), made once."""
    kw = {"slide_mpp": SLIDE_MPP, "tissue_fraction": TISSUE, "shard_samples": mode.shard_samples}
    return bk.cached_build(workdir / "stream" / mode.name, n_slides=mode.n_slides, size_px=mode.size_px, **kw)[1]


def prepare_user(workdir: Path) -> Path:
    """The user's first build: six slides at a real scanner's mpp built by ``wsishard build SLIDES -o OUT`` with
    every default (one shard here: fewer shards than readers)."""
    want = {"n_slides": USER_SLIDES, "size_px": USER_SIZE_PX, "slide_mpp": USER_MPP, "tissue_fraction": TISSUE}

    def make(paths: list[str], out: Path) -> None:
        cli = "import sys; from wsishard.cli import main; sys.exit(main())"
        subprocess.run(
            [sys.executable, "-c", cli, "build", str(Path(paths[0]).parent), "-o", str(out), "-q"], check=True
        )

    return bk.synthetic_build(workdir / "stream" / "user", want, make, seed=500)[1]


def rate(source: str, workers: int, mode: Mode, device_ready: bool = False, **kw: Any) -> dict[str, Any]:
    """The loader alone (uint8 batches as the DataLoader hands them over) or device-ready (through GpuCollate)."""
    from wsishard import GpuCollate

    collate = GpuCollate(DEVICE, mean=bk.MEAN, std=bk.STD) if device_ready else None
    return bk.loader_rate(source, workers, mode.batches, batch=BATCH, collate=collate, **kw)


# ------------------------------------------------------------------------------------------ the decode floor


def huge_page_slot(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array of ``shape`` inside one 2 MiB-aligned stretch (numpy asks for transparent huge
    pages on large allocations), starting where the loader's batch rows start relative to a 32-byte boundary
    (:data:`wsishard.streaming.ring.ROW_OFFSET`): the fastest memory the floor's decoder can write into."""
    from wsishard.streaming.ring import ROW_OFFSET

    nbytes, huge = math.prod(shape), 2 << 20
    base = np.empty(nbytes + 2 * huge, dtype=np.uint8)
    start = -base.ctypes.data % huge + ROW_OFFSET
    return base[start : start + nbytes].reshape(shape)


def _blobs(shards_dir: str) -> list[bytes]:
    """Every sample's image bytes, in shard order, read by the stream's own reader."""
    from wsishard.streaming.sources import stream
    from wsishard.streaming.stages import read_shard

    ds = stream(shards_dir, batch_size=1, resampled=False, seed=0)
    return [raw["image"] for ref in ds.shards for raw in read_shard(ref, ds.opener)]


class _FloorProbe(torch.utils.data.IterableDataset[dict[str, Any]]):
    """In each worker: ``n`` decodes per decoder (PIL; libjpeg-turbo into one hot slot), in interleaved rounds."""

    def __init__(self, shards_dir: str, n: int, names: tuple[str, ...]) -> None:
        super().__init__()
        self.shards_dir, self.n, self.names = shards_dir, n, names

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import imagecodecs
        from PIL import Image

        blobs = _blobs(self.shards_dir)
        slot = huge_page_slot((*np.asarray(Image.open(io.BytesIO(blobs[0]))).shape[:2], 3))  # (h, w, 3) uint8
        every = {
            "pil": lambda data: np.asarray(Image.open(io.BytesIO(data)).convert("RGB")),
            "turbo": lambda data: imagecodecs.jpeg8_decode(data, out=slot),
        }
        decoders, per_round = {name: every[name] for name in self.names}, max(self.n // FLOOR_ROUNDS, 1)
        for fn in decoders.values():
            for data in blobs[:50]:  # warm-up
                fn(data)
        wall, cpu = dict.fromkeys(decoders, 0.0), dict.fromkeys(decoders, 0.0)
        for r in range(FLOOR_ROUNDS):
            work = [blobs[(r * per_round + i) % len(blobs)] for i in range(per_round)]
            for name, fn in decoders.items():
                t0, c0 = time.perf_counter(), time.process_time()
                for data in work:
                    fn(data)
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
        done = per_round * FLOOR_ROUNDS
        yield {name: {"samples_per_s": done / wall[name], "cpu_samples_per_s": done / cpu[name]} for name in decoders}


def decode_floor(shards_dir: str, workers: int, n: int, decoders: tuple[str, ...]) -> dict[str, Any]:
    """Per-worker decode rates with ``workers`` DataLoader workers decoding at once, for each of ``decoders``."""
    import imagecodecs
    from PIL import features

    dl = torch.utils.data.DataLoader(_FloorProbe(shards_dir, n, decoders), batch_size=None, num_workers=workers)
    results = list(dl)
    out: dict[str, Any] = {"workers": workers, "decodes_per_worker": n}
    for name in decoders:
        out[name] = {key: float(np.mean([r[name][key] for r in results])) for key in results[0][name]}
        out[name]["libjpeg_turbo"] = imagecodecs.jpeg8_version()
    if "pil" in out:
        out["pil"]["libjpeg_turbo"] = features.version("libjpeg_turbo") or "not libjpeg-turbo"
    return out


def sandwich(src: str, w: int, mode: Mode, decoders: tuple[str, ...] = ("pil", "turbo")) -> dict[str, Any]:
    """One round: the floors, the loader alone with ``w`` workers, libjpeg-turbo's floor again (:func:`_floor`)."""
    log(f"floor, loader alone, floor again: {w} worker(s) on {src}")
    return {
        f"floor{w}": decode_floor(src, w, mode.floor_samples, decoders),
        f"w{w}_loader": rate(src, w, mode),
        f"floor{w}_after": decode_floor(src, w, mode.floor_samples, ("turbo",)),
    }


def _floor(rd: dict[str, Any], w: int) -> dict[str, float]:
    """libjpeg-turbo's floor with ``w`` workers in round ``rd``: the geometric mean of the floors before and after
    the loader (a drift of the machine's speed over the round cancels)."""
    before, after = rd[f"floor{w}"]["turbo"], rd.get(f"floor{w}_after", {}).get("turbo")
    keys = ("samples_per_s", "cpu_samples_per_s")
    return before if after is None else {k: math.sqrt(before[k] * after[k]) for k in keys}


# ------------------------------------------------------------------------------------------ interleaved pairs


def _floor_process(shards_dir: str, conn: Connection) -> None:
    """A floor process: decodes the build's JPEGs into one hot slot, ``n`` on request, answering with the seconds."""
    import imagecodecs

    blobs = _blobs(shards_dir)
    slot = huge_page_slot((*imagecodecs.jpeg8_decode(blobs[0]).shape[:2], 3))  # (h, w, 3) uint8
    for data in blobs[:50]:  # warm-up
        imagecodecs.jpeg8_decode(data, out=slot)
    pos = 0
    conn.send("ready")
    while (n := conn.recv()) is not None:
        t0 = time.perf_counter()
        for i in range(n):
            imagecodecs.jpeg8_decode(blobs[(pos + i) % len(blobs)], out=slot)
        pos += n
        conn.send(time.perf_counter() - t0)


def _wait_idle(procs: list[psutil.Process], poll_s: float = 0.05, limit_s: float = 60.0) -> None:
    """Until ``procs`` use no CPU over ``poll_s`` (the loader's workers, their prefetched batches made)."""
    last, deadline = bk.cpu_s(procs), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        if (now := bk.cpu_s(procs)) == last:
            return
        last = now
    raise RuntimeError(f"the loader's workers were still busy after {limit_s:.0f} s; no pair can be timed")


def interleaved_pairs(source: str, workers: int, pairs: int) -> dict[str, Any]:
    """``pairs`` pairs of (floor slice, loader slice): as many floor processes as workers decode as many JPEGs each
    as a loader worker makes in a slice, then the paused loader's prefetched batches are taken untimed, one more batch
    a worker brings it to its steady state, and the next ``PAIR_BATCHES[workers]`` batches are timed."""
    from wsishard import loader, stream

    ctx, pool, k = mp.get_context("fork"), [], PAIR_BATCHES[workers]
    for _ in range(workers):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_floor_process, args=(source, theirs), daemon=True)
        proc.start()
        pool.append((proc, ours))
    for _, conn in pool:
        conn.recv()  # ready
    floor_pids = {proc.pid for proc, _ in pool}
    it = iter(loader(stream(source, batch_size=BATCH, resampled=True, seed=0), num_workers=workers, prefetch_factor=2))
    try:
        for _ in range(3 * workers):  # warm-up: the workers' rings made, their first batches
            next(it)
        procs = [p for p in psutil.Process().children() if p.pid not in floor_pids]
        n_floor, floor, load = k * BATCH // workers, [], []
        for _ in range(pairs):
            _wait_idle(procs)
            for _, conn in pool:
                conn.send(n_floor)
            floor.append(float(np.mean([n_floor / conn.recv() for _, conn in pool])))
            for _ in range(3 * workers):  # the prefetched batches (2 a worker), then into the steady state
                next(it)
            t0 = time.perf_counter()
            for _ in range(k):
                next(it)
            load.append(k * BATCH / (time.perf_counter() - t0) / workers)
    finally:
        del it  # shuts the loader's workers down
        for proc, conn in pool:
            conn.send(None)
            proc.join(timeout=10)
    ratios = [lo / fl for lo, fl in zip(load, floor, strict=True)]
    return {"workers": workers, "k": k, "ratios": ratios, "floor_per_worker": floor, "loader_per_worker": load}


# ------------------------------------------------------------------------------------------ resume, copies


def _first_batch_s(source: str, workers: int, step: int | None) -> float:
    """Seconds from creating the loader (and loading the state of ``step`` batches taken round robin) to its first
    batch."""
    from wsishard import loader, stream

    t0 = time.perf_counter()
    dl = loader(stream(source, batch_size=BATCH, resampled=True, seed=0), num_workers=workers)
    if step is not None:
        taken = [max(math.ceil((step - w) / workers), 0) for w in range(workers)]
        dl.load_state_dict({**dl.state_dict(), "epoch": 0, "batches": taken, "last_worker": (step - 1) % workers})
    it = iter(dl)
    next(it)
    first_s = time.perf_counter() - t0
    del it
    return first_s


def time_resume(source: str, rounds: int) -> dict[str, Any]:
    """First-batch seconds of a fresh loader and of loaders resumed early and late (2 workers), best of ``rounds``
    interleaved rounds."""
    arms = {"fresh": partial(_first_batch_s, source, 2, None)}
    arms |= {str(s): partial(_first_batch_s, source, 2, s) for s in RESUME_STEPS}
    runs = bk.interleaved(rounds, arms, log)
    best = {name: min(rd[name] for rd in runs) for name in arms}
    return {"first_s": best, "ratio": best[str(RESUME_STEPS[1])] / best[str(RESUME_STEPS[0])]}


def rewrite(shards_dir: Path, out_dir: Path, *, one_shard: bool = False, context_mpp: float | None = None) -> Path:
    """A copy of the build ``shards_dir`` in ``out_dir``: its samples in ONE shard (``one_shard``: in order), or shard
    for shard with one context member each (``context_mpp``: the JPEG of the sample after it in its shard, the same
    size and kind of image, so the same decode cost)."""
    import dataclasses

    from wsishard.format import MANIFEST_NAME, SLIDES_NAME, context_ext, shard_name, split_member
    from wsishard.shards.writer import ShardWriter
    from wsishard.storage.opener import load_manifest
    from wsishard.storage.output import Destination

    manifest, _ = load_manifest(str(shards_dir))
    shutil.rmtree(out_dir, ignore_errors=True)
    dest, image, records = Destination(str(out_dir)), manifest.image_format, []
    dest.makedirs()
    writer = ShardWriter(dest, shard_name(0))
    for rec in manifest.shards:
        samples: dict[str, dict[str, bytes]] = {}
        with tarfile.open(shards_dir / rec.name) as tar:
            for info in tar:
                if (name := split_member(info.name)) is not None:
                    samples.setdefault(name[0], {})[name[1]] = tar.extractfile(info).read()  # type: ignore[union-attr]
        writer = writer if one_shard else ShardWriter(dest, rec.name)
        keys = list(samples)
        for i, key in enumerate(keys):
            members = samples[key]
            if context_mpp is not None:
                members = {**members, context_ext(0, image): samples[keys[(i + 1) % len(keys)]][image]}
            writer.write(key, members, json.loads(members["json"])["slide_id"])
        if not one_shard:
            records.append(writer.commit())
    records = [writer.commit()] if one_shard else records
    options = manifest.options
    if context_mpp is not None:
        options = {**options, "context_mpp": [context_mpp], "context_size": options["patch"]["patch_size_px"]}
    if (shards_dir / SLIDES_NAME).exists():  # a version-2 manifest: its slide records beside it, written first
        dest.write_bytes(SLIDES_NAME, (shards_dir / SLIDES_NAME).read_bytes())
    dest.write_bytes(MANIFEST_NAME, dataclasses.replace(manifest, shards=records, options=options).to_json().encode())
    return out_dir


def expected_distinct(counts: list[int], k: int) -> float:
    """E[distinct slides] in ``k`` patches drawn uniformly without replacement: sum_s 1 - C(N-n_s,k)/C(N,k)."""
    total, k = sum(counts), min(k, sum(counts))

    def log_comb(n: int, r: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

    return sum(1.0 - (math.exp(log_comb(total - n, k) - log_comb(total, k)) if total - n >= k else 0.0) for n in counts)


# --------------------------------------------------------------------------------------------- the main run


def measure(mode: Mode, shards_dir: Path, user_dir: Path | None) -> dict[str, Any]:
    """Every figure, in one run; each S3 run directly follows its local twin."""
    local, r = str(shards_dir), {}
    rounds = []
    for _ in range(mode.rounds):  # this VM's speed drifts by 10% within minutes: each round's ratios are neighbours'
        rd: dict[str, Any] = {}
        for w in (1, 2):
            rd |= sandwich(local, w, mode) | {f"w{w}": rate(local, w, mode, device_ready=True)}
        rounds.append(rd)
    r["rounds"], r["pairs"] = rounds, {str(w): interleaved_pairs(local, w, mode.pairs) for w in (1, 2)}
    for key in rounds[0]:  # the round with the median figure, for the table's absolute rates
        fig = (lambda x: x["turbo"]["samples_per_s"]) if key.startswith("floor") else (lambda x: x["samples_per_s"])
        r[key] = sorted((rd[key] for rd in rounds), key=fig)[len(rounds) // 2]
    log("S3 (moto) and its local twins")
    with bk.moto_s3(shards_dir, "wsishard-bench") as (url, opts):
        for suffix, ready in (("_loader", False), ("", True)):
            r[f"s3_local{suffix}"] = rate(local, 2, mode, device_ready=ready)
            r[f"s3{suffix}"] = rate(url, 2, mode, device_ready=ready, storage_options=opts)
    log("resume; one shard against many")
    r["resume"] = time_resume(local, mode.resume_rounds)
    one_dir = rewrite(shards_dir, shards_dir.parent / "one_shard", one_shard=True)
    r["many_shards_loader"], r["one_shard_loader"] = rate(local, 2, mode), rate(str(one_dir), 2, mode)
    if user_dir is not None:
        u = [sandwich(str(user_dir), w, mode, ("turbo",)) for _ in range(mode.rounds) for w in (1, 2)]
        rounds_u = [u[i] | u[i + 1] for i in range(0, len(u), 2)]
        r["user"] = {
            "rounds": rounds_u,
            "pairs": {str(w): interleaved_pairs(str(user_dir), w, mode.pairs) for w in (1, 2)},
        }
    if (os.cpu_count() or 1) >= 2 * WIDE_WORKERS:  # with cores to spare: the main process's work can set the rate
        wide = Mode(**{**asdict(mode), "batches": 4 * mode.batches})
        r["wide_loader"], r["wide"] = (rate(local, WIDE_WORKERS, wide, device_ready=d) for d in (False, True))
    return r


def _ratio_rows(rounds: list[dict[str, Any]], pairs: dict[str, Any], w: int, label: str) -> list[list[str]]:
    """The loader alone per worker over its floor: each round's (median, range) and the interleaved pairs'."""
    ratios = [rd[f"w{w}_loader"]["per_worker"] / _floor(rd, w)["samples_per_s"] for rd in rounds]
    p, n = pairs[str(w)]["ratios"], f" ({len(rounds)} rounds: median [range])" if len(rounds) > 1 else ""
    pairs_label = f"· the same in {len(p)} interleaved pairs of ~0.5 s slices (one loader paused between)"
    return [
        bk.check(label + n, bk.spread(ratios), bk.median_range(ratios)[0], TARGETS["floor"]),
        bk.check(pairs_label, bk.spread(p), bk.median_range(p)[0], TARGETS["floor"]),
    ]


def _loader_rows(r: dict[str, Any], w: int) -> list[list[str]]:
    rounds, dev, alone = r["rounds"], r[f"w{w}"], r[f"w{w}_loader"]
    cpu = [rd[f"w{w}_loader"]["cpu_per_worker"] / _floor(rd, w)["cpu_samples_per_s"] for rd in rounds]
    pil = [rd[f"w{w}_loader"]["per_worker"] / rd[f"floor{w}"]["pil"]["samples_per_s"] for rd in rounds]
    d = [rd[f"w{w}"]["samples_per_s"] / rd[f"w{w}_loader"]["samples_per_s"] for rd in rounds]
    label = f"· per worker / libjpeg-turbo floor ({w} worker(s) decoding; before and after)"
    ready = f"· device-ready on {DEVICE.type} (GpuCollate in the main process) / loader alone"
    main = f"{dev['collate_ms_per_batch']:,.0f} ms; {dev['main_cpu_ms_per_batch']:,.0f} ms"
    return [
        [f"wsishard local, {w} worker(s), loader alone (uint8 batches)", f"{alone['samples_per_s']:,.0f}/s", "", ""],
        *_ratio_rows(rounds, r["pairs"], w, label),
        ["· per worker CPU-s / the floor's CPU-s; / PIL floor", f"{bk.spread(cpu)}; {bk.spread(pil)}", "", ""],
        bk.check(ready, f"{dev['samples_per_s']:,.0f}/s; {bk.spread(d)}", bk.median_range(d)[0], TARGETS["device"]),
        ["· collate per batch; main process CPU per batch", main, "", ""],
    ]


def _rows(r: dict[str, Any]) -> list[list[str]]:
    """(figure, value, target, verdict) rows of the table."""
    t, f1, f2, rows = TARGETS, r["floor1"], r["floor2"], []
    names = {"turbo": "libjpeg-turbo {} via imagecodecs (the loader's decode) into one slot"}
    names["pil"] = "PIL (libjpeg-turbo {}), Image.open().convert('RGB')"
    for k, name in names.items():
        rates = f"{f1[k]['samples_per_s']:,.0f}/s 1 worker; {f2[k]['samples_per_s']:,.0f}/s per worker of 2"
        label = "decode floor: " + name.format(f1[k]["libjpeg_turbo"].removeprefix("libjpeg_turbo "))
        rows.append([label, rates, "", "target's" * (k == "turbo")])
    rows += _loader_rows(r, 1) + _loader_rows(r, 2)
    first = f"{r['w2']['first_batch_s']:.2f} s (loader {r['w2']['first_batch_loader_s']:.2f} s)"
    rows.append(bk.check("first batch, local, 2 workers, device-ready", first, r["w2"]["first_batch_s"], 2, True, " s"))
    for key, name in (("s3", "device-ready"), ("s3_loader", "loader alone")):
        x = r[key]["samples_per_s"] / r[key.replace("s3", "s3_local")]["samples_per_s"]
        shown = f"{r[key]['samples_per_s']:,.0f}/s = {x:.2f}x local"
        rows.append(bk.check(f"S3 (moto, in-process), 2 workers, {name}", shown, x, t["s3"]))
    s3, lo = r["s3_loader"], r["s3_local_loader"]
    cpu = f"{1e3 / s3['cpu_per_worker']:.2f} vs {1e3 / lo['cpu_per_worker']:.2f} ms local"
    main = f"{s3['main_cpu_ms_per_batch']:,.0f} (moto) vs {lo['main_cpu_ms_per_batch']:,.0f} ms/batch"
    rows.append(["· loader alone, CPU: workers per sample; main", f"{cpu}; {main}", "", ""])
    first_s, one, many = r["resume"]["first_s"], r["one_shard_loader"], r["many_shards_loader"]
    (early, late), x = (first_s[str(s)] for s in RESUME_STEPS), one["samples_per_s"] / many["samples_per_s"]
    resume = f"first batch resumed at step {RESUME_STEPS[0]:,} / {RESUME_STEPS[1]:,}, 2 workers, loader"
    rows.append(bk.check(resume, f"{early:.2f} / {late:.2f} s = {late / early:.2f}x", late / early, t["resume"], True))
    rows.append(["· fresh loader (not resumed), first batch", f"{first_s['fresh']:.2f} s", "", ""])
    one_label = f"1 shard (sample-level split) vs {r['config']['shards']} shards, 2 workers, loader alone"
    shown = f"{one['samples_per_s']:,.0f} vs {many['samples_per_s']:,.0f}/s = {x:.2f}x"
    rows.append(bk.check(one_label, shown, x, t["one"]))
    if "user" in r:
        u = r["user"]
        label = f"user's first build: `wsishard build` defaults, {USER_SLIDES} slides {USER_SIZE_PX}^2 px at {USER_MPP}"
        rows.append([f"{label} mpp -> {u['samples']} patches in {u['shards']} shard(s)", "", "", ""])
        for w in (1, 2):
            rows += _ratio_rows(u["rounds"], u["pairs"], w, f"· {w} worker(s), loader alone per worker / floor")
    if "wide" in r:
        lo, dr, floor = r["wide_loader"], r["wide"], f1["turbo"]["samples_per_s"]
        label = f"wsishard local, {WIDE_WORKERS} workers ({os.cpu_count()} cpus), loader alone; device-ready"
        shown = f"{lo['samples_per_s']:,.0f}/s ({lo['per_worker'] / floor:.2f}x the 1-worker floor per worker)"
        rows.append([f"{label} on {DEVICE.type}", f"{shown}; {dr['samples_per_s']:,.0f}/s", "", ""])
        main = f"{lo['main_cpu_ms_per_batch']:.1f} ms; {dr['main_cpu_ms_per_batch']:.1f} ms"
        rows.append(["· main process CPU per batch: loader alone; device-ready", main, "", ""])
    d = r["diversity"]
    shown = f"{d['mean']:.2f} vs {d['uniform']:.2f} uniform = {d['ratio']:.2f}x"
    rows.append(bk.check(f"distinct slides / batch of {BATCH} (of {d['slides']})", shown, d["ratio"], t["diversity"]))
    return rows


def main_run(args: Any, mode: Mode) -> int:
    from wsishard.storage.opener import load_manifest

    load0, shards_dir = os.getloadavg()[0], prepare(args.workdir, mode)
    manifest, _ = load_manifest(str(shards_dir))
    user = None if args.no_user_build or mode is SMOKE else prepare_user(args.workdir)
    r = measure(mode, shards_dir, user)
    if user is not None:
        um, _ = load_manifest(str(user))
        r["user"] |= {"shards": len(um.shards), "samples": um.total_samples}
    seen = [d for rd in r["rounds"] for k in ("w1", "w1_loader", "w2", "w2_loader") for d in rd[k]["distinct_slides"]]
    uniform = expected_distinct([s.patches for s in manifest.slides], BATCH)
    mean = float(np.mean(seen))
    r["diversity"] = {"slides": len(manifest.slides), "mean": mean, "uniform": uniform, "ratio": mean / uniform}
    r["targets"], r["config"] = TARGETS, {**asdict(mode), "batch": BATCH, "slide_mpp": SLIDE_MPP, "device": str(DEVICE)}
    r["config"] |= {"shards": len(manifest.shards), "samples": manifest.total_samples, "cpus": os.cpu_count()}
    r["config"] |= {"loadavg_1m_start": load0, "loadavg_1m_end": os.getloadavg()[0]}
    caption = (
        f"wsishard stream benchmark ({mode.name}): {mode.n_slides} slides {mode.size_px}^2 px at {SLIDE_MPP} mpp -> "
        f"{manifest.total_samples} patches of 256 px at 0.5 mpp in {len(manifest.shards)} shards; device "
        f"{DEVICE}, {os.cpu_count()} cpus, 1-min load {load0:.1f} at start, {r['config']['loadavg_1m_end']:.1f} at end"
    )
    return bk.emit(r, bk.markdown(("figure", "value", "target", ""), _rows(r), caption), json_only=args.json_only)


# ------------------------------------------------------------------------------------ --context, --sampling


def run_context(args: Any, mode: Mode) -> int:
    """The loader alone (2 workers) on the user's first build and on its copy with one context scale, in
    interleaved rounds: samples/s, decoded images/s (1 + K a sample) and samples per worker CPU second."""
    src = prepare(args.workdir, mode) if mode is SMOKE else prepare_user(args.workdir)  # smoke: its own small build
    copy = rewrite(src, src.parent / "context", context_mpp=2.0)
    arms = {f"scales{n}": partial(rate, str(s), 2, mode) for n, s in ((0, src), (1, copy))}
    rounds = bk.interleaved(max(mode.rounds, mode.least_rounds), arms, log)
    med = {k: bk.median_range([rd[k]["samples_per_s"] for rd in rounds])[0] for k in arms}
    cpu = {k: bk.median_range([rd[k]["cpu_per_worker"] or math.nan for rd in rounds])[0] for k in arms}
    c = {"rounds": rounds, "samples_per_s": med, "one_vs_none": med["scales1"] / med["scales0"]}
    c |= {"cpu_per_worker": cpu, "cpu_one_vs_none": cpu["scales1"] / cpu["scales0"]}
    rows = []
    for k in (0, 1):
        label = f"loader alone, 2 workers, {k} context scale(s): samples/s (median of {len(rounds)} rounds)"
        rows.append([label, f"{med[f'scales{k}']:.0f}", "", f"{med[f'scales{k}'] * (1 + k):.0f} decoded images/s"])
    rows.append(["· samples/s, one context scale / none", f"{c['one_vs_none']:.2f}", "", "0.50: decode-bound"])
    rows.append(["· decoded images/s, one context scale / none", f"{2 * c['one_vs_none']:.2f}", "", ""])
    for k in (0, 1):
        label = f"samples per worker CPU second, {k} context scale(s)"
        rows.append([label, f"{cpu[f'scales{k}']:.0f}", "", "the load of the machine aside"])
    rows.append(["· per worker CPU second, one context scale / none", f"{c['cpu_one_vs_none']:.2f}", "", ""])
    report = {"context": c, "config": {"mode": mode.name, "batch": BATCH, "slide_mpp": USER_MPP}}
    caption = f"Context patches: the loader alone ({mode.name}) on the user's first build and its copy with context"
    return bk.emit(report, bk.markdown(("figure", "measured", "target", ""), rows, caption), json_only=args.json_only)


def _tissue(t: Any) -> Any:
    return t["tissue"] >= 0.75


def run_sampling(args: Any, mode: Mode) -> int:
    """The loader alone (2 workers) unweighted, with ``weights="class"`` and with ``select=`` (tissue >= 0.75), in
    interleaved rounds, local and from S3 (moto), on the build rebuilt with slide labels (every fifth slide 1)."""
    kw = {"slide_mpp": SLIDE_MPP, "tissue_fraction": TISSUE, "shard_samples": mode.shard_samples}
    labels = lambda slides: {p: int(i % 5 == 4 or i == len(slides) - 1 < 4) for i, p in enumerate(slides)}  # noqa: E731
    folder, kw = args.workdir / "stream" / f"{mode.name}-labelled", kw | {"labels": labels}
    out = bk.cached_build(folder, n_slides=mode.n_slides, size_px=mode.size_px, **kw)[1]
    extra: dict[str, dict[str, Any]] = {"unweighted": {}, "class": {"weights": "class"}, "select": {"select": _tissue}}

    def rounds(src: str, options: dict[str, Any] | None) -> dict[str, Any]:
        arms = {k: partial(rate, src, 2, mode, storage_options=options, **extra[k]) for k in extra}
        least = mode.least_rounds + 1 if mode.least_rounds else 0
        runs = [
            {k: v["samples_per_s"] for k, v in rd.items()} for rd in bk.interleaved(max(mode.rounds, least), arms, log)
        ]
        res: dict[str, Any] = {
            "rounds": runs,
            "unweighted_samples_per_s": bk.median_range([x["unweighted"] for x in runs])[0],
        }
        for k in ("class", "select"):
            ratio = bk.median_range([x[k] / x["unweighted"] for x in runs])[0]
            res[k] = {"ratio": ratio, "pass": ratio >= SAMPLING_TARGET}
        return res

    result: dict[str, Any] = {"mode": mode.name, "workers": 2, "batch": BATCH, "local": rounds(str(out), None)}
    if not args.no_s3:
        with bk.moto_s3(out, "wsishard-sampling", "out") as (url, options):
            result["s3"] = rounds(url, options)
    rows = []
    for where, res in ((w, result[w]) for w in ("local", "s3") if w in result):
        ratios = (f"{res[k]['ratio']:.2f}x {bk.verdict(res[k]['pass'])}" for k in ("class", "select"))
        rows.append([where, f"{res['unweighted_samples_per_s']:.0f}", *ratios])
    caption = (
        f"Loader samples/s against the unweighted loader, {mode.name} build, batch {BATCH}, 2 workers (median of "
        f"{len(result['local']['rounds'])} interleaved rounds; target >= {SAMPLING_TARGET}x)"
    )
    table = bk.markdown(("source", "unweighted samples/s", "class (ratio)", "select (ratio)"), rows, caption)
    return bk.emit(result, table, json_only=args.json_only)


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("--no-user-build", {"action": "store_true", "help": f"leave out the user's first build ({USER_MPP} mpp)"}),
        ("--context", {"action": "store_true", "help": "only one context scale against none (bench_stream_context)"}),
        ("--sampling", {"action": "store_true", "help": "only weights= and select= against none (bench_sampling)"}),
        ("--no-s3", {"action": "store_true", "help": "with --sampling: leave out the S3 (moto) rows"}),
        argv=argv,
    )
    mode = bk.sized(args, SMOKE, QUICK, FULL)
    return (run_context if args.context else run_sampling if args.sampling else main_run)(args, mode)


if __name__ == "__main__":
    import benchkit

    alone = {"--context": "bench_stream_context", "--sampling": "bench_sampling"}  # runs of one figure, saved apart
    name = next((alone[flag] for flag in alone if flag in sys.argv), "bench_stream")
    name += "_gpu" if DEVICE.type == "cuda" and name == "bench_stream" else ""  # a GPU machine's run beside this one's
    sys.exit(benchkit.run(name, main, script="bench_stream"))
