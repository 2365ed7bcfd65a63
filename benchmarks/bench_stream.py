#!/usr/bin/env python
"""Benchmark wsishard's training-time stream: throughput, decode floor, wsistream, S3 vs disk, diversity.

Example::

    python benchmarks/bench_stream.py --quick
    python benchmarks/bench_stream.py --workdir /data/bench --json-only
    python benchmarks/bench_stream.py --quick --context   # only: one context scale against none (bench_stream_context)
    python benchmarks/bench_stream.py --quick --sampling  # only: weights= and select= against none (bench_sampling)

Synthetic slides are generated and built once, then cached in ``--workdir``. What each figure means and how its
rounds are taken (the decode floor, rounds sandwiched between floors, interleaved pairs, the user's first build, the
stage costs, resume, the one-shard split, context, sampling) is written on the docs' performance page. Prints a
Markdown table, then one line ``JSON: {...}``; targets are reported as PASS/MISS, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from benchkit import cpu_s, interleaved, load, logger, markdown, median_range, moto_s3, spread, synthetic_build, verdict
from benchkit import step as _timed_step

SLIDE_MPP = 0.25  # level-0 microns per px of the generated slides (40x)
TARGET_MPP = 0.5
PATCH_PX = 256
BATCH = 256
WS_BATCH = 64  # wsistream's batch: at its rate a 256 batch per worker would take most of a quick run
SEED = 0
TISSUE_FRACTION = 0.5
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BUCKET, PREFIX = "wsishard-bench", "shards"
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TARGETS = {
    "per_worker_vs_floor": 0.85,
    "device_vs_loader": 0.70,
    "vs_wsistream": 20.0,
    "s3_vs_local": 0.80,
    "first_batch_s": 2.0,
    "diversity_vs_uniform": 0.80,
    "resume_late_vs_early": 1.5,
    "one_shard_vs_many": 0.80,
}
USER_MPP, USER_SLIDES, USER_SIZE_PX = 0.2520, 6, 8192  # the user's first build: a real scanner's level-0 mpp, defaults
WIDE_WORKERS = 8  # the many-worker rows, on a machine with at least twice as many cores
PAIR_BATCHES = {1: 8, 2: 12}  # timed batches of a loader slice in an interleaved pair, by workers (~0.5 s)
RESUME_STEPS = (10, 10_000)  # resumed at these steps (2 workers); the batches resumed at the first are checked


@dataclass(frozen=True, kw_only=True)
class Mode:
    """Workload of one benchmark mode."""

    name: str
    n_slides: int
    size_px: int  # level-0 width = height of each slide
    shard_samples: int  # at most this many samples per shard (small, so 2 workers share many shards)
    batches: int  # timed batches per loader run (after the warm-up)
    floor_samples: int  # JPEGs decoded in the floor loop
    ws_batches: int  # timed wsistream batches of WS_BATCH (after the warm-up)
    rounds: int  # rounds of the floors, loaders alone and device-ready, one after the other: ratios per round
    pairs: int  # interleaved pairs of floor and loader slices (measure_pairs): the steadier second reading
    resume_rounds: int = 2  # fresh and resumed loaders, interleaved, the least first-batch time of each kept
    peers: bool = True  # wsistream's row (a peer, the bench extra) and the user's first build (6 slides of 8192 px)
    least_rounds: int = 2  # --context and --sampling: at least this many interleaved rounds (--sampling: one more)


QUICK = Mode(
    name="quick",
    n_slides=6,
    size_px=8192,
    shard_samples=64,
    batches=8,
    floor_samples=2000,
    ws_batches=4,
    rounds=1,
    pairs=3,
)
FULL = Mode(
    name="full",
    n_slides=16,
    size_px=12288,
    shard_samples=128,
    batches=30,
    floor_samples=6000,
    ws_batches=16,
    rounds=5,
    pairs=20,
)
SMOKE = Mode(  # the same code path in seconds (tests/integration/test_benchmarks_smoke.py); no peer, nothing saved
    name="smoke",
    n_slides=2,
    size_px=4096,
    shard_samples=16,
    batches=1,
    floor_samples=32,
    ws_batches=1,
    rounds=1,
    pairs=1,
    resume_rounds=1,
    peers=False,
    least_rounds=0,
)


log = logger("bench_stream")
_step = partial(_timed_step, log)
ROUNDS = 4  # floor rounds per decoder, interleaved
DECODERS = ("pil", "turbo", "turbo_batch")  # every floor's decoders (the performance page says what each is)
CONTEXT_MPP = 2.0  # the context copy's one scale
_STAMP = "source-manifest.sha256"  # a copy's record of the source manifest it was made from
SAMPLING_KINDS = ("unweighted", "class", "select")  # --sampling: the loaders compared
SAMPLING_TARGET = 0.8  # --sampling: weighted or selected samples/s against unweighted


def prepare(workdir: Path, mode: Mode) -> tuple[list[str], Path]:
    """Slides and shards for ``mode``, generated and built once and reused while their parameters match."""
    from wsishard.builder.options.buildopts import BuildOptions
    from wsishard.builder.run.orchestrate import build
    from wsishard.builder.scan.grid import PatchOptions

    want = {
        "n_slides": mode.n_slides,
        "size_px": mode.size_px,
        "shard_samples": mode.shard_samples,
        "tissue_fraction": TISSUE_FRACTION,
        "slide_mpp": SLIDE_MPP,
        "target_mpp": TARGET_MPP,
        "patch_px": PATCH_PX,
    }

    def make(paths: list[str], out: Path) -> None:
        log(f"building shards in {out}")
        opts = BuildOptions(
            patch=PatchOptions(target_mpp=TARGET_MPP, patch_size_px=PATCH_PX),
            jobs=2,
            qc=False,
            shard_samples=mode.shard_samples,
            seed=SEED,
        )
        manifest = build(paths, str(out), opts)
        if manifest.failed_slides:
            raise SystemExit(f"build failed for {[s.file for s in manifest.failed_slides]}")

    return synthetic_build(workdir / mode.name, want, make, seed=1000)


def prepare_user(workdir: Path) -> Path:
    """The user's first build, made once: six slides at a real scanner's level-0 mpp (:data:`USER_MPP`, not an exact
    0.25) built by ``wsishard build SLIDES -o OUT`` with every default (one shard here: fewer shards than readers)."""
    want = {"n_slides": USER_SLIDES, "size_px": USER_SIZE_PX, "slide_mpp": USER_MPP, "tissue_fraction": TISSUE_FRACTION}

    def make(paths: list[str], out: Path) -> None:
        log(f"wsishard build {Path(paths[0]).parent} -o {out} (defaults)")
        cli = "import sys; from wsishard.cli import main; sys.exit(main())"
        subprocess.run(
            [sys.executable, "-c", cli, "build", str(Path(paths[0]).parent), "-o", str(out), "-q"], check=True
        )

    return synthetic_build(workdir / "user", want, make, seed=500)[1]


def time_wsishard(
    source: str,
    workers: int,
    batches: int,
    *,
    to_device: bool = True,
    storage_options: dict[str, Any] | None = None,
    **stream_kw: Any,
) -> dict[str, Any]:
    """wsishard's loader, resampled, batch 256: first-batch latency, samples/s, distinct slides per batch.

    With ``to_device`` each batch goes through GpuCollate (the figure a training loop sees); without it the
    uint8 batch as the DataLoader hands it over (the loader alone). ``cpu_per_worker`` is samples per CPU
    second of the worker processes: what one worker would deliver with a core of its own.
    """
    from wsishard.streaming.collate import GpuCollate
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    collate = GpuCollate(DEVICE, mean=MEAN, std=STD)
    ds = stream(source, batch_size=BATCH, resampled=True, seed=SEED, storage_options=storage_options, **stream_kw)
    dl = loader(ds, num_workers=workers)
    distinct: list[int] = []
    collate_s, procs, cpu0, main0 = 0.0, [], 0.0, 0.0
    t0 = time.perf_counter()
    it = iter(dl)
    warm = max(workers, 2)  # one batch per worker, and at least two: the collate makes its two output buffers
    for i in range(warm + batches):
        if i == warm:  # warm-up done
            procs = psutil.Process().children()
            t_start, cpu0, main0 = time.perf_counter(), cpu_s(procs), time.process_time()
        batch = next(it)
        tc = time.perf_counter()
        if to_device:
            out = collate(batch)
            if DEVICE.type == "cuda":
                torch.cuda.synchronize(DEVICE)
            if out["image"].shape != (BATCH, 3, PATCH_PX, PATCH_PX):
                raise SystemExit(f"unexpected device batch {tuple(out['image'].shape)}")
        if i == 0:
            first_s, first_loader_s = time.perf_counter() - t0, tc - t0
        elif i >= warm:
            collate_s += time.perf_counter() - tc
        distinct.append(len({k.rsplit("_x", 1)[0] for k in batch["key"]}))  # <slide_id>_x<X>_y<Y>: no JSON parsed
    wall, cpu, main_cpu = time.perf_counter() - t_start, cpu_s(procs) - cpu0, time.process_time() - main0
    del it  # shuts the workers down
    rate = batches * BATCH / wall
    return {
        "workers": workers,
        "to_device": to_device,
        "samples_per_s": rate,
        "per_worker": rate / workers,
        "cpu_per_worker": batches * BATCH / cpu if cpu > 0 else None,
        "first_batch_s": first_s,
        "first_batch_loader_s": first_loader_s,
        "collate_ms_per_batch": 1000 * collate_s / batches,
        "main_cpu_ms_per_batch": 1000 * main_cpu / batches,
        "distinct_slides": distinct,
    }


def _import_wsistream() -> Any | None:
    try:
        import wsistream
    except ImportError:
        log("wsistream not installed (the bench extra has it): no wsistream row")
        return None
    return wsistream


def time_wsistream(slides: list[str], workers: int, batches: int) -> dict[str, Any]:
    """wsistream on-the-fly: random 512 px crops at level 0 (0.25 mpp) resized to 256 px = 0.5 mpp.

    ``RandomSampler(target_mpp=0.5)`` would pick the nearest pyramid level (level 0 here, the 4x level being
    1.0 mpp) and read 256 px at 0.25 mpp; ``ContinuousMagnificationSampler`` with a degenerate mpp range
    crops 512 px at level 0 and resizes to 256, the same field of view and resolution as the shards.
    """
    ws = _import_wsistream()
    if ws is None:
        return {"installed": False}
    from torch.utils.data import DataLoader
    from wsistream.torch import WsiStreamDataset

    from wsishard.streaming.collate import GpuCollate

    sampler = ws.ContinuousMagnificationSampler(output_size=PATCH_PX, mpp_range=(TARGET_MPP, TARGET_MPP + 1e-9))
    ds = WsiStreamDataset(
        slides,
        backend=ws.OpenSlideBackend(),
        tissue_detector=ws.OtsuTissueDetector(),
        sampler=sampler,
        seed=SEED,
        output_dtype="uint8",
    )
    collate = GpuCollate(DEVICE, mean=MEAN, std=STD)
    dl = DataLoader(ds, batch_size=WS_BATCH, num_workers=workers)
    t0 = time.perf_counter()
    it = iter(dl)
    for i in range(workers + batches):
        if i == workers:
            t_start = time.perf_counter()
        batch = next(it)
        out = collate.images(batch["image"].permute(0, 2, 3, 1))  # (b, 3, h, w) uint8 -> channels-last view
        if DEVICE.type == "cuda":
            torch.cuda.synchronize(DEVICE)
        if i == 0:
            first_s = time.perf_counter() - t0
        if out.shape != (WS_BATCH, 3, PATCH_PX, PATCH_PX):
            raise SystemExit(f"unexpected wsistream batch {tuple(out.shape)}")
        mpp = float(batch["mpp"].float().mean())
    wall = time.perf_counter() - t_start
    del it
    rate = batches * WS_BATCH / wall
    return {
        "installed": True,
        "version": ws.__version__,
        "workers": workers,
        "samples_per_s": rate,
        "first_batch_s": first_s,
        "mpp_mean": mpp,
    }


def time_collate(repeats: int = 5) -> dict[str, Any]:
    """GpuCollate alone on a uint8 batch of BATCH x PATCH_PX^2 in this process (best of ``repeats``): as the table's
    device-ready figures run it (defaults) and with augmentation (as the examples train)."""
    from wsishard.streaming.collate import GpuCollate

    rng = np.random.default_rng(0)
    image = torch.from_numpy(rng.integers(0, 256, (BATCH, PATCH_PX, PATCH_PX, 3), dtype=np.uint8))
    out: dict[str, Any] = {}
    for name, augment in (("plain_ms", False), ("augment_ms", True)):
        collate, best = GpuCollate(DEVICE, mean=MEAN, std=STD, augment=augment, seed=0), float("inf")
        for _ in range(repeats + 1):  # the first makes the output buffer
            t0 = time.perf_counter()
            collate.images(image)
            if DEVICE.type == "cuda":
                torch.cuda.synchronize(DEVICE)
            best = min(best, time.perf_counter() - t0)
        out[name] = 1000 * best
    return out


def time_metas(shards_dir: str, repeats: int = 20) -> dict[str, Any]:
    """Reading every sample's ``.json`` of a batch in the training loop (``Metas`` parses them when read): ms."""
    from wsishard.streaming.decode import Metas
    from wsishard.streaming.sources import stream
    from wsishard.streaming.stages import read_shard

    ds = stream(shards_dir, batch_size=BATCH, resampled=False, seed=SEED)
    texts = list(itertools.islice((raw["meta"] for ref in ds.shards for raw in read_shard(ref, ds.opener)), BATCH))
    best = math.inf
    for _ in range(repeats):
        metas = Metas(texts)
        t0 = time.perf_counter()
        ids = {m["slide_id"] for m in metas}
        best = min(best, time.perf_counter() - t0)
    return {"read_all_ms": 1000 * best, "slides": len(ids)}


def expected_distinct(counts: list[int], k: int) -> float:
    """E[distinct slides] in ``k`` patches drawn uniformly without replacement: sum_s 1 - C(N-n_s,k)/C(N,k)."""
    total = sum(counts)

    def log_comb(n: int, r: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

    k = min(k, total)
    return sum(1.0 - (math.exp(log_comb(total - n, k) - log_comb(total, k)) if total - n >= k else 0.0) for n in counts)


# ------------------------------------------------------------------------ the decode floor and stage costs


def huge_page_slot(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array of ``shape`` inside one 2 MiB-aligned stretch of a numpy allocation (numpy asks
    for transparent huge pages on large ones), starting where the loader's batches start relative to a 32-byte
    boundary (:data:`wsishard.streaming.ring.ROW_OFFSET`: a 32-byte aligned row makes libjpeg-turbo use slower
    non-temporal stores here): the fastest memory the floor's decoder can write into."""
    from wsishard.streaming.ring import ROW_OFFSET

    nbytes = math.prod(shape)
    huge = 2 << 20
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
    """In each worker: ``n`` decodes per decoder, ``ROUNDS`` interleaved rounds; yields one dict of timings."""

    def __init__(self, shards_dir: str, n: int, names: tuple[str, ...] = DECODERS) -> None:
        super().__init__()
        self.shards_dir, self.n, self.names = shards_dir, n, names

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import imagecodecs
        from PIL import Image

        blobs = _blobs(self.shards_dir)
        slot = huge_page_slot((*np.asarray(Image.open(io.BytesIO(blobs[0]))).shape[:2], 3))  # (h, w, 3) uint8

        def pil(data: bytes) -> None:
            np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # (h, w, 3) uint8

        def turbo(data: bytes) -> None:
            imagecodecs.jpeg8_decode(data, out=slot)

        into_batches = _BatchSlots((*slot.shape[:2], 3)) if "turbo_batch" in self.names else None

        def turbo_batch(data: bytes) -> None:
            imagecodecs.jpeg8_decode(data, out=into_batches.next())  # type: ignore[union-attr]

        every: dict[str, Callable[[bytes], None]] = {"pil": pil, "turbo": turbo, "turbo_batch": turbo_batch}
        decoders = {name: every[name] for name in self.names}
        per_round = max(self.n // ROUNDS, 1)
        for fn in decoders.values():
            for data in blobs[:50]:  # warm-up
                fn(data)
        wall = dict.fromkeys(decoders, 0.0)
        cpu = dict.fromkeys(decoders, 0.0)
        for r in range(ROUNDS):  # every image decoded once a round or more (n >= the build's samples)
            work = [blobs[(r * per_round + i) % len(blobs)] for i in range(per_round)]
            for name, fn in decoders.items():
                t0, c0 = time.perf_counter(), time.process_time()
                for data in work:
                    fn(data)
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
        done = per_round * ROUNDS
        yield {name: {"samples_per_s": done / wall[name], "cpu_samples_per_s": done / cpu[name]} for name in decoders}


class _BatchSlots:
    """Successive slots of batches in the loader's own batch memory: a worker's ring of shared-memory buffers
    (:class:`~wsishard.streaming.ring.BatchBuffers`, 4 KiB pages, made and faulted in before the first batch), three
    in turn as under a loader whose main process holds one batch while two are prefetched."""

    def __init__(self, hw_c: tuple[int, int, int], batch: int = 256) -> None:
        from wsishard.streaming.ring import BatchBuffers, Lending

        self.ring = BatchBuffers((batch, *hw_c), shared=True, lending=Lending(reuse=True, prefill=3))
        self.held: list[Any] = []  # tickets of the buffers "the main process" holds, oldest first
        self.batch, self.slots, self.i = batch, np.empty((0, *hw_c), dtype=np.uint8), batch

    def next(self) -> np.ndarray:
        if self.i == self.batch:
            image, ticket = self.ring.take()
            self.held.append(ticket)
            if len(self.held) > 2:
                old = self.held.pop(0)
                old.flags[old.slot] = 0  # handed back, as the main process does once a batch is let go
            self.slots, self.i = image.numpy(), 0
        self.i += 1
        return self.slots[self.i - 1]


def decode_floor(shards_dir: str, workers: int, n: int, decoders: tuple[str, ...] = DECODERS) -> dict[str, Any]:
    """Per-worker decode rates with ``workers`` decoding at once: mean over workers, for each of ``decoders``
    (PIL, libjpeg-turbo into one slot, libjpeg-turbo into batch memory)."""
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


class _StageProbe(torch.utils.data.IterableDataset[dict[str, float]]):
    """In one worker: the pipeline over every shard, cut after each stage; yields CPU seconds per sample."""

    def __init__(self, shards_dir: str, batch: int, shuffle: int) -> None:
        super().__init__()
        self.shards_dir, self.batch, self.shuffle = shards_dir, batch, shuffle

    def __iter__(self) -> Iterator[dict[str, float]]:
        from wsishard.streaming.decode import DecodeIntoBatches, checked_label, decode_into
        from wsishard.streaming.sources import stream
        from wsishard.streaming.stages import read_shard, shuffled

        ds = stream(self.shards_dir, batch_size=self.batch, resampled=False, seed=0)
        n = int(ds.counts.sum())
        hw = ds.image_hw
        slot = huge_page_slot((*hw, 3))  # (h, w, 3) uint8, as the floor's

        def samples() -> Iterator[Any]:
            for i, ref in enumerate(ds.shards):
                yield from shuffled(read_shard(ref, ds.opener), self.shuffle, (0, i))

        def read() -> None:
            for ref in ds.shards:
                for _ in read_shard(ref, ds.opener):
                    pass

        def shuffle() -> None:
            for _ in samples():
                pass

        def fields() -> None:  # the loop's checks (the JSON parsed, the label)
            for raw in samples():
                checked_label(raw)

        def decode() -> None:
            for raw in samples():
                decode_into(raw, slot)

        def batches() -> tuple[float, int]:
            """Timed from the second batch on: the ring's buffer is made (its pages faulted in) with the first, as a
            loader's worker makes its buffers before its first batch."""
            size = min(self.batch, max(1, n // 4))  # a build of fewer batches (a smoke run's) still times three
            made = DecodeIntoBatches(size, hw, drop_last=False)(samples())
            _hand_back(next(made))
            c0, done = time.process_time(), 0
            for batch in made:
                done += len(batch["key"])
                _hand_back(batch)
            return time.process_time() - c0, done

        cuts: dict[str, Callable[[], tuple[float, int] | None]] = {
            "read": read,
            "+ shuffle": shuffle,
            "+ checks (json, header)": fields,
            "+ decode into slot": decode,
            "+ batches": batches,
        }
        best = dict.fromkeys(cuts, float("inf"))
        for _ in range(3):  # the best of three passes (the first also warms the page cache): this VM drifts
            for name, fn in cuts.items():
                c0 = time.process_time()
                timed = fn()
                cpu, done = timed if timed is not None else (time.process_time() - c0, n)
                best[name] = min(best[name], cpu / done)
        yield best


def _hand_back(batch: Any) -> None:
    """Hand a batch's buffer back at once, as the main process does once a batch is let go."""
    ticket = batch.pop("buffer", None)
    if ticket is not None:
        ticket.flags[ticket.slot] = 0


def stage_costs(shards_dir: str, batch: int, shuffle: int = 1000) -> dict[str, float]:
    """CPU seconds per sample of a worker's pipeline cut after each stage (cumulative), in one DataLoader worker."""
    dl = torch.utils.data.DataLoader(_StageProbe(shards_dir, batch, shuffle), batch_size=None, num_workers=1)
    return next(iter(dl))


# ------------------------------------------------------------------------------------------ interleaved pairs


def _floor_process(shards_dir: str, conn: Connection) -> None:
    """A floor process: decode the build's JPEGs by libjpeg-turbo into one hot slot, ``n`` at a time on request,
    answering with the seconds each request took."""
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
    """Until the processes use no CPU over ``poll_s`` (the loader's workers, their prefetched batches made).

    Raises:
        RuntimeError: still busy after ``limit_s`` (a worker that never rests would otherwise hang the benchmark).
    """
    last, deadline = cpu_s(procs), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        now = cpu_s(procs)
        if now == last:
            return
        last = now
    raise RuntimeError(f"the loader's workers were still busy after {limit_s:.0f} s; no pair can be timed")


def interleaved_pairs(source: str, workers: int, pairs: int, k: int, *, batch: int, seed: int) -> dict[str, Any]:
    """``pairs`` pairs of (floor slice, loader slice) with ``workers`` workers; ``k`` timed batches a loader slice.

    Returns the per-pair ratios (loader samples/s per worker over floor samples/s per process) and both rates.
    """
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    ctx = mp.get_context("fork")
    pool: list[tuple[Any, Connection]] = []
    for _ in range(workers):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_floor_process, args=(source, theirs), daemon=True)
        proc.start()
        pool.append((proc, ours))
    for _, conn in pool:
        conn.recv()  # ready
    floor_pids = {proc.pid for proc, _ in pool}
    prefetch = 2  # DataLoader's default, as the benchmark's other loader runs
    dl = loader(
        stream(source, batch_size=batch, resampled=True, seed=seed), num_workers=workers, prefetch_factor=prefetch
    )
    it = iter(dl)
    try:
        for _ in range(3 * workers):  # warm-up: the workers' rings made, their first batches
            next(it)
        procs = [p for p in psutil.Process().children() if p.pid not in floor_pids]
        n_floor = k * batch // workers  # per floor process: as many as each loader worker makes in a slice
        floor, load = [], []
        for _ in range(pairs):
            _wait_idle(procs)
            for _, conn in pool:
                conn.send(n_floor)
            floor.append(float(np.mean([n_floor / conn.recv() for _, conn in pool])))
            for _ in range(prefetch * workers + workers):  # the prefetched batches, then into the steady state
                next(it)
            t0 = time.perf_counter()
            for _ in range(k):
                next(it)
            load.append(k * batch / (time.perf_counter() - t0) / workers)
    finally:
        del it  # shuts the loader's workers down
        for proc, conn in pool:
            conn.send(None)
            proc.join(timeout=10)
    ratios = [lo / fl for lo, fl in zip(load, floor, strict=True)]
    return {
        "workers": workers,
        "pairs": pairs,
        "k": k,
        "ratios": ratios,
        "floor_per_worker": floor,
        "loader_per_worker": load,
    }


# ------------------------------------------------------------------- resume, the one-shard and context copies


def resume_state(state: dict[str, Any], step: int, workers: int) -> dict[str, Any]:
    """``state`` (a fresh loader's :meth:`state_dict`) moved to after ``step`` batches taken round robin: worker
    ``w`` took ``ceil((step - w) / workers)`` batches, the last one came from ``(step - 1) % workers``; epoch 0."""
    taken = [max(math.ceil((step - w) / workers), 0) for w in range(workers)]
    return {**state, "epoch": 0, "batches": taken, "last_worker": (step - 1) % workers if step > 0 else None}


def _run(source: str, workers: int, batch: int, seed: int, n: int, step: int | None) -> tuple[float, list[list[str]]]:
    """Seconds from creating the loader (and loading the state of ``step``, if given) to its first batch, and the
    keys of its first ``n`` batches."""
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    t0 = time.perf_counter()
    dl = loader(stream(source, batch_size=batch, resampled=True, seed=seed), num_workers=workers)
    if step is not None:
        dl.load_state_dict(resume_state(dl.state_dict(), step, workers))
    it = iter(dl)
    keys = [list(next(it)["key"])]
    first_s = time.perf_counter() - t0
    keys += [list(next(it)["key"]) for _ in range(n - 1)]
    del it  # shuts the workers down
    return first_s, keys


def time_resume(
    source: str, *, workers: int, batch: int, seed: int, steps: tuple[int, int] = (10, 10_000), rounds: int = 2
) -> dict[str, Any]:
    """First-batch seconds of a fresh loader and of loaders resumed at each of ``steps`` (best of ``rounds``,
    interleaved so that a shared machine's drift hits all alike), and whether the batches resumed at ``steps[0]``
    (one per worker) have the keys of the uninterrupted run's batches there."""
    check = steps[0]
    fresh: list[float] = []
    resumed: dict[int, list[float]] = {s: [] for s in steps}
    same = True
    for r in range(rounds):
        n = check + workers if r == 0 else 1  # the first fresh run is also the uninterrupted reference
        first_s, ref = _run(source, workers, batch, seed, n, None)
        fresh.append(first_s)
        for step in steps:
            first_s, keys = _run(source, workers, batch, seed, workers if r == 0 and step == check else 1, step)
            resumed[step].append(first_s)
            if r == 0 and step == check:
                same = keys == ref[check:]
    lo, hi = (min(resumed[s]) for s in steps)
    return {
        "workers": workers,
        "steps": list(steps),
        "rounds": rounds,
        "fresh_first_s": min(fresh),
        "resumed_first_s": {str(s): min(resumed[s]) for s in steps},
        "all_first_s": {"fresh": fresh, **{str(s): v for s, v in resumed.items()}},
        "ratio": hi / lo,
        "check_step": check,
        "check_batches": workers,
        "check_keys_equal": same,
    }


def one_shard_copy(shards_dir: Path, out_dir: Path) -> Path:
    """``out_dir``: the samples of the build output ``shards_dir``, in manifest and tar order, in ONE shard, with
    the source's manifest but that one shard record. Reused while the source's manifest is unchanged."""
    from wsishard.format import shard_name
    from wsishard.shards.writer import ShardWriter

    started = _start_copy(shards_dir, out_dir)
    if started is None:
        return out_dir
    manifest, dest, digest = started
    writer = ShardWriter(dest, shard_name(0))
    for rec in manifest.shards:
        for key, members in _samples_of(shards_dir / rec.name).items():
            writer.write(key, members, json.loads(members["json"])["slide_id"])
    record = writer.commit()
    if record.samples != manifest.total_samples:
        raise SystemExit(f"one-shard copy holds {record.samples} samples, the source {manifest.total_samples}")
    _finish_copy(shards_dir, out_dir, dataclasses.replace(manifest, shards=[record]), digest)
    return out_dir


def context_copy(shards_dir: Path, out_dir: Path) -> Path:
    """``out_dir``: the build ``shards_dir``, shard for shard, each sample with one context member: the JPEG of the
    sample after it in its shard. Reused while the source's manifest is unchanged."""
    from wsishard.format import context_ext
    from wsishard.shards.writer import ShardWriter

    started = _start_copy(shards_dir, out_dir)
    if started is None:
        return out_dir
    manifest, dest, digest = started
    image, records = manifest.image_format, []
    for rec in manifest.shards:
        samples = _samples_of(shards_dir / rec.name)
        keys = list(samples)
        writer = ShardWriter(dest, rec.name)
        for i, key in enumerate(keys):
            own, ctx = samples[key], samples[keys[(i + 1) % len(keys)]][image]
            members = {image: own[image], context_ext(0, image): ctx, **{e: d for e, d in own.items() if e != image}}
            writer.write(key, members, json.loads(own["json"])["slide_id"])
        records.append(writer.commit())
    patch_px = manifest.options["patch"]["patch_size_px"]
    options = {**manifest.options, "context_mpp": [CONTEXT_MPP], "context_size": patch_px}
    _finish_copy(shards_dir, out_dir, dataclasses.replace(manifest, shards=records, options=options), digest)
    return out_dir


def _samples_of(shard: Path) -> dict[str, dict[str, bytes]]:
    """A shard's samples in tar order: key -> {extension: bytes}."""
    from wsishard.format import split_member

    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(shard) as tar:
        for info in tar:
            name = split_member(info.name)
            if name is not None:
                samples.setdefault(name[0], {})[name[1]] = tar.extractfile(info).read()  # type: ignore[union-attr]
    return samples


def _start_copy(shards_dir: Path, out_dir: Path) -> tuple[Any, Any, str] | None:
    """None where ``out_dir`` is already a copy of ``shards_dir`` as its manifest is now (its digest in the stamp);
    else the source's manifest, a Destination for ``out_dir`` and the digest to stamp it with."""
    from wsishard.format import MANIFEST_NAME
    from wsishard.storage.opener import load_manifest
    from wsishard.storage.output import Destination

    digest = hashlib.sha256((shards_dir / MANIFEST_NAME).read_bytes()).hexdigest()
    stamp = out_dir / _STAMP
    if stamp.exists() and stamp.read_text() == digest and (out_dir / MANIFEST_NAME).exists():
        return None
    manifest, _ = load_manifest(str(shards_dir))
    dest = Destination(str(out_dir))
    dest.makedirs()
    return manifest, dest, digest


def _finish_copy(shards_dir: Path, out_dir: Path, manifest: Any, digest: str) -> None:
    """End a copy into ``out_dir``: the source's slide records, ``manifest``, then the stamp that lets
    :func:`_start_copy` reuse it."""
    from wsishard.format import MANIFEST_NAME, SLIDES_NAME
    from wsishard.storage.output import Destination

    dest = Destination(str(out_dir))
    if (shards_dir / SLIDES_NAME).exists():  # a version-2 manifest: its slide records beside it, written first
        dest.write_bytes(SLIDES_NAME, (shards_dir / SLIDES_NAME).read_bytes())
    dest.write_bytes(MANIFEST_NAME, manifest.to_json().encode())
    (out_dir / _STAMP).write_text(digest)


# ------------------------------------------------------------------------------------------------ sampling


def _tissue(t: Any) -> Any:
    return t["tissue"] >= 0.75


def labelled(workdir: Path, mode: Mode) -> Path:
    """bench_stream's build for ``mode``, rebuilt once with slide labels (every fifth slide label 1), and indexed."""
    from wsishard.builder.options.buildopts import BuildOptions
    from wsishard.builder.run.orchestrate import build
    from wsishard.builder.scan.grid import PatchOptions

    slides, _ = prepare(workdir, mode)
    out = workdir / mode.name / "labelled"
    if (out / "manifest.json").exists() and (out / "index.npz").exists():
        return out
    labels = {p: int(i % 5 == 4 or i == len(slides) - 1 < 4) for i, p in enumerate(slides)}  # fewer: the last
    opts = BuildOptions(
        patch=PatchOptions(target_mpp=TARGET_MPP, patch_size_px=PATCH_PX),
        jobs=2,
        qc=False,
        shard_samples=mode.shard_samples,
        seed=0,
        labels=labels,
    )
    log(f"building labelled shards in {out}")
    build(slides, str(out), opts)
    return out


def sampling_rounds(source: str, mode: Mode, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The loader alone (2 workers) unweighted, with ``weights="class"`` and with ``select=`` (tissue >= 0.75), in
    interleaved rounds: each round's ratios to the unweighted loader, their median, the unweighted median rate."""
    extra: dict[str, dict[str, Any]] = {"unweighted": {}, "class": {"weights": "class"}, "select": {"select": _tissue}}

    def run(kind: str) -> float:
        return float(
            time_wsishard(source, 2, mode.batches, to_device=False, storage_options=storage_options, **extra[kind])[
                "samples_per_s"
            ]
        )

    least = mode.least_rounds + 1 if mode.least_rounds else 0
    runs = interleaved(max(mode.rounds, least), {k: partial(run, k) for k in SAMPLING_KINDS}, log)
    out: dict[str, Any] = {"rounds": runs, "unweighted_samples_per_s": median_range([r["unweighted"] for r in runs])[0]}
    for kind in SAMPLING_KINDS[1:]:
        ratio = median_range([r[kind] / r["unweighted"] for r in runs])[0]
        out[kind] = {"ratio": ratio, "pass": ratio >= SAMPLING_TARGET}
    return out


def run_sampling(mode: Mode, workdir: Path, s3: bool) -> int:
    """``--sampling``: weighted and selected streaming against unweighted (:func:`sampling_rounds`), local and from
    S3 (moto), on the build for ``mode`` rebuilt with labels (:func:`labelled`); its table and JSON line."""
    out = labelled(workdir, mode)
    result: dict[str, Any] = {
        "mode": mode.name,
        "workers": 2,
        "batch": BATCH,
        "loadavg_1m_start": load(),
        "local": sampling_rounds(str(out), mode, None),
    }
    if s3:
        with moto_s3(out, "wsishard-sampling", "out") as (url, options):
            result["s3"] = sampling_rounds(url, mode, options)
    kinds = SAMPLING_KINDS[1:]
    rows = [
        [
            where,
            f"{r['unweighted_samples_per_s']:.0f}",
            *(f"{r[k]['ratio']:.2f}x {verdict(r[k]['pass'])}" for k in kinds),
        ]
        for where, r in ((w, result[w]) for w in ("local", "s3") if w in result)
    ]
    n = len(result["local"]["rounds"])
    caption = (
        f"Loader samples/s against the unweighted loader, {mode.name} build, batch {BATCH}, 2 workers (median "
        f"of {n} interleaved rounds; target >= {SAMPLING_TARGET}x)"
    )
    print(markdown(("source", "unweighted samples/s", *(f"{k} (ratio)" for k in kinds)), rows, caption))
    print("JSON: " + json.dumps(result))
    return 0


# -------------------------------------------------------------------------------------------- tables, main


def _cells(row: tuple[str, ...]) -> tuple[str, ...]:
    """A row's cells as the table prints them: an indented figure (a detail of the row above) marked with a dot."""
    return tuple(("· " if cell.startswith("  ") else "") + cell.strip() for cell in row)


def _floor_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The decode floors, each decoder's libjpeg-turbo named, and which one the targets use."""
    f1, f2 = r["floor1"], r["floor2"]
    pil, turbo = f1["pil"]["libjpeg_turbo"], f1["turbo"]["libjpeg_turbo"].removeprefix("libjpeg_turbo ")
    return [
        (
            f"decode floor: libjpeg-turbo {turbo} via imagecodecs (the loader's decode) into one slot",
            f"{f1['turbo']['samples_per_s']:,.0f}/s 1 worker; {f2['turbo']['samples_per_s']:,.0f}/s per worker of 2",
            "",
            "target's",
        ),
        (
            "  the same into successive slots of the loader's batch memory (shared, 4 KiB pages)",
            f"{f1['turbo_batch']['samples_per_s']:,.0f}/s 1 worker; {f2['turbo_batch']['samples_per_s']:,.0f}/s per "
            "worker of 2",
            "",
            "",
        ),
        (
            f"decode floor: PIL {r['versions']['pillow']} (libjpeg-turbo {pil}), Image.open().convert('RGB')",
            f"{f1['pil']['samples_per_s']:,.0f}/s 1 worker; {f2['pil']['samples_per_s']:,.0f}/s per worker of 2",
            "",
            "",
        ),
    ]


def _floor(r: dict[str, Any], workers: int) -> tuple[str, dict[str, float]]:
    """The faster decoder's floor with ``workers`` decoding at once: the stricter one, whichever it is. In a round
    with the libjpeg-turbo floor measured again right after the loader alone, that floor's rates are the geometric
    mean of the two (the loader sandwiched between them: a drift of the machine's speed over the round cancels)."""
    fl, after = r[f"floor{workers}"], r.get(f"floor{workers}_after")
    turbo = fl["turbo"]
    if after is not None:
        turbo = {
            key: math.sqrt(fl["turbo"][key] * after["turbo"][key]) for key in ("samples_per_s", "cpu_samples_per_s")
        }
    rate = {k: (turbo if k == "turbo" else fl[k])["samples_per_s"] for k in ("turbo", "pil") if k in fl}
    name = max(rate, key=rate.__getitem__)
    return ("libjpeg-turbo" if name == "turbo" else "PIL"), (turbo if name == "turbo" else fl[name])


def _loader_rows(r: dict[str, Any], w: int) -> list[tuple[str, str, str, str]]:
    """Loader alone against the floor (the target), device-ready against the loader alone: per round, side by side;
    the median round's ratio is the verdict's, the range across rounds in brackets."""
    pd = TARGETS["device_vs_loader"]
    dev, ldr = r[f"w{w}"], r[f"w{w}_loader"]
    name, _ = _floor(r, w)
    rounds = r["rounds"]
    floors = [_floor(rd, w)[1] for rd in rounds]
    z = [rd[f"w{w}_loader"]["cpu_per_worker"] / fl["cpu_samples_per_s"] for rd, fl in zip(rounds, floors, strict=True)]
    batch = [rd[f"w{w}_loader"]["per_worker"] / rd[f"floor{w}"]["turbo_batch"]["samples_per_s"] for rd in rounds]
    pil = [rd[f"w{w}_loader"]["per_worker"] / rd[f"floor{w}"]["pil"]["samples_per_s"] for rd in rounds]
    d = [rd[f"w{w}"]["samples_per_s"] / rd[f"w{w}_loader"]["samples_per_s"] for rd in rounds]
    n = f" ({len(rounds)} rounds: median [range])" if len(rounds) > 1 else ""
    title = f"wsishard local, {w} worker(s), loader alone (uint8 batches)"
    return [
        (title, f"{ldr['samples_per_s']:,.0f}/s", "", ""),
        _verdict_row(
            f"  per worker / {name} floor ({w} worker(s) decoding; before and after){n}", _round_ratios(rounds, w)
        ),
        *_pair_rows(r["pairs"][str(w)]),
        ("  per worker CPU-s / the floor's CPU-s", spread(z), "", ""),
        ("  per worker / the floor into batch memory; / PIL floor", f"{spread(batch)}; {spread(pil)}", "", ""),
        (
            f"  device-ready on {DEVICE.type} (GpuCollate in the main process) / loader alone{n}",
            f"{dev['samples_per_s']:,.0f}/s; {spread(d)}",
            f">= {pd}x",
            verdict(median_range(d)[0] >= pd),
        ),
        (
            "  collate per batch; main process CPU per batch",
            f"{dev['collate_ms_per_batch']:,.0f} ms; {dev['main_cpu_ms_per_batch']:,.0f} ms",
            "",
            "",
        ),
    ]


def _round_ratios(rounds: list[dict[str, Any]], w: int) -> list[float]:
    """Each round's loader alone per worker over its floor with ``w`` workers (:func:`_floor`)."""
    return [rd[f"w{w}_loader"]["per_worker"] / _floor(rd, w)[1]["samples_per_s"] for rd in rounds]


def _verdict_row(label: str, ratios: list[float]) -> tuple[str, str, str, str]:
    """The loader-vs-floor target's row: the median ratio (and range) against the target, PASS or MISS."""
    pf = TARGETS["per_worker_vs_floor"]
    return label, spread(ratios), f">= {pf}x", verdict(median_range(ratios)[0] >= pf)


def _pair_rows(p: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The steadier second reading of the same target: interleaved pairs of short floor and loader slices."""
    n = len(p["ratios"])
    return [
        _verdict_row(
            f"  the same in {n} interleaved pairs of ~0.5 s slices (one loader paused between; median [range])",
            p["ratios"],
        )
    ]


def _stage_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """A worker's CPU per sample by stage: each cut's increment, then the hand-off (what the loader's worker spends
    beyond the whole in-worker pipeline: pickling, passing buffers, the DataLoader's queues)."""
    st = r["stages"]
    cuts = [cut for cut in st if cut != "step_s"]
    parts = [f"{cut.lstrip('+ ')} {1e6 * (st[cut] - (st[cuts[i - 1]] if i else 0)):.0f}" for i, cut in enumerate(cuts)]
    handoff = 1e6 * (1 / r["w1_loader"]["cpu_per_worker"] - st[cuts[-1]])
    parts.append(f"hand-off {handoff:.0f}")
    _, fl = _floor(r, 1)
    return [
        ("a worker's CPU per sample by stage, us (1 worker)", ", ".join(parts), "", ""),
        ("  the floor's decode alone, us", f"{1e6 / fl['cpu_samples_per_s']:.0f}", "", ""),
        (
            f"GpuCollate alone on {DEVICE.type}, a batch of {BATCH}: defaults; augment=True",
            f"{r['collate']['plain_ms']:.1f} ms; {r['collate']['augment_ms']:.1f} ms",
            "",
            "",
        ),
        (
            "every sample's .json of a batch read in the loop (parsed when read; the figures above read none)",
            f"{r['metas']['read_all_ms']:.2f} ms",
            "",
            "",
        ),
    ]


def _rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, value, target, verdict) rows of the table."""
    t = TARGETS
    rows = _floor_rows(r)
    for w in (1, 2):
        rows += _loader_rows(r, w)
    rows += _stage_rows(r)
    first, loader_first = r["w2"]["first_batch_s"], r["w2"]["first_batch_loader_s"]
    rows.append(
        (
            "first batch, local, 2 workers, device-ready",
            f"{first:.2f} s (loader {loader_first:.2f} s)",
            f"< {t['first_batch_s']:.0f} s",
            verdict(first < t["first_batch_s"]),
        )
    )
    if "error" in r["s3"]:
        rows.append(("S3 (moto), 2 workers", f"failed: {r['s3']['error']}", f">= {t['s3_vs_local']}x", "MISS"))
    else:
        for key, name in (("s3", "device-ready"), ("s3_loader", "loader alone")):
            local = r["s3_local" if key == "s3" else "s3_local_loader"]["samples_per_s"]
            x = r[key]["samples_per_s"] / local
            rows.append(
                (
                    f"S3 (moto, in-process), 2 workers, {name}",
                    f"{r[key]['samples_per_s']:,.0f}/s = {x:.2f}x local",
                    f">= {t['s3_vs_local']}x",
                    verdict(x >= t["s3_vs_local"]),
                )
            )
        s3l, w2l = r["s3_loader"], r["s3_local_loader"]
        rows.append(
            (
                "  loader alone, CPU: workers per sample; main",
                f"{1e3 / s3l['cpu_per_worker']:.2f} vs "
                f"{1e3 / w2l['cpu_per_worker']:.2f} ms local; {s3l['main_cpu_ms_per_batch']:,.0f} (moto) vs "
                f"{w2l['main_cpu_ms_per_batch']:,.0f} ms/batch",
                "",
                "",
            )
        )
    rows += _resume_split_rows(r)
    rows += _user_rows(r)
    if "wide" in r:
        lo, dr, fl = r["wide_loader"], r["wide"], r["floor1"]["turbo"]["samples_per_s"]
        rows.append(
            (
                f"wsishard local, {WIDE_WORKERS} workers ({os.cpu_count()} cpus), loader alone; device-ready on "
                f"{DEVICE.type}",
                f"{lo['samples_per_s']:,.0f}/s ({lo['per_worker'] / fl:.2f}x the 1-worker "
                f"floor per worker); {dr['samples_per_s']:,.0f}/s",
                "",
                "",
            )
        )
        main = f"{lo['main_cpu_ms_per_batch']:.1f} ms; {dr['main_cpu_ms_per_batch']:.1f} ms"
        rows.append(("  main process CPU per batch: loader alone; device-ready", main, "", ""))
    ws = r["wsistream"]
    if ws.get("installed"):
        rows.append((f"wsistream {ws['version']}, 2 workers, device-ready", f"{ws['samples_per_s']:,.1f}/s", "", ""))
        for key, name in (("w2_loader", "loader alone"), ("w2", "device-ready")):
            x = r[key]["samples_per_s"] / ws["samples_per_s"]
            target = key == "w2_loader"  # the target is the loader's; device-ready on a CPU shares its cores
            rows.append(
                (
                    f"  wsishard ({name}) / wsistream",
                    f"{x:,.1f}x",
                    f">= {t['vs_wsistream']:.0f}x" if target else "",
                    verdict(x >= t["vs_wsistream"]) if target else "",
                )
            )
    else:
        rows.append(("wsistream", "not installed", f">= {t['vs_wsistream']:.0f}x", "n/a"))
    d = r["diversity"]
    rows.append(
        (
            f"distinct slides / batch of {BATCH} (of {d['slides']})",
            f"{d['mean']:.2f} vs {d['uniform']:.2f} uniform = {d['ratio']:.2f}x",
            f">= {t['diversity_vs_uniform']}x",
            verdict(d["ratio"] >= t["diversity_vs_uniform"]),
        )
    )
    return rows


def _resume_split_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Table rows of the resume cost and the sample-level split."""
    t, res, one, many = TARGETS, r["resume"], r["one_shard_loader"], r["many_shards_loader"]
    early, late = (res["resumed_first_s"][str(s)] for s in RESUME_STEPS)
    x = one["samples_per_s"] / many["samples_per_s"]
    return [
        (
            f"first batch resumed at step {RESUME_STEPS[0]:,} / {RESUME_STEPS[1]:,}, 2 workers, loader",
            f"{early:.2f} / {late:.2f} s = {res['ratio']:.2f}x",
            f"<= {t['resume_late_vs_early']}x",
            verdict(res["ratio"] <= t["resume_late_vs_early"]),
        ),
        ("  fresh loader (not resumed), first batch", f"{res['fresh_first_s']:.2f} s", "", ""),
        (
            f"  resumed batches at step {RESUME_STEPS[0]} == uninterrupted run's",
            f"keys {'equal' if res['check_keys_equal'] else 'DIFFER'} ({res['check_batches']} batches)",
            "equal",
            "PASS" if res["check_keys_equal"] else "FAIL",
        ),
        (
            f"1 shard (sample-level split) vs {many['shards']} shards, 2 workers, loader alone",
            f"{one['samples_per_s']:,.0f} vs {many['samples_per_s']:,.0f}/s = {x:.2f}x",
            f">= {t['one_shard_vs_many']}x",
            verdict(x >= t["one_shard_vs_many"]),
        ),
    ]


def _user_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The loader alone on the user's first build (default options, a scanner's mpp) against its own floor."""
    if "user" not in r:
        return []
    u = r["user"]
    split = " (fewer shards than readers)" if u["shards"] < 2 else ""
    rows = [
        (
            f"user's first build: `wsishard build` defaults, {u['slides']} slides {u['size_px']}^2 px at "
            f"{u['slide_mpp']} mpp -> {u['samples']} patches in {u['shards']} shard(s)",
            "",
            "",
            "",
        )
    ]
    for w in (1, 2):
        n = f" ({len(u['rounds'])} rounds: median [range])" if len(u["rounds"]) > 1 else ""
        rows.append(
            _verdict_row(
                f"  {w} worker(s){split if w > 1 else ''}, loader alone per worker / libjpeg-turbo floor{n}",
                _round_ratios(u["rounds"], w),
            )
        )
        rows += _pair_rows(u["pairs"][str(w)])
    return rows


def measure(mode: Mode, slides: list[str], shards_dir: Path, user_dir: Path | None = None) -> dict[str, Any]:
    """Every figure, in one run. Each S3 run directly follows its local twin: the load of a shared machine
    drifts within minutes, so the S3 / local ratio compares neighbours."""
    local, n = str(shards_dir), mode.batches
    r: dict[str, Any] = {}
    rounds: list[dict[str, Any]] = []
    for k in range(mode.rounds):  # this VM's speed drifts by 10% within minutes: each round's ratios are neighbours'
        tag = f" (round {k + 1} of {mode.rounds})"
        rd: dict[str, Any] = {}
        for w in (1, 2):
            rd.update(_sandwich(local, w, mode, tag, DECODERS))
            rd[f"w{w}"] = _step(f"wsishard, {w} worker(s), device-ready{tag}", time_wsishard, local, w, n)
        rounds.append(rd)
    r["rounds"] = rounds
    r["pairs"] = measure_pairs(mode, local, "")
    for key in rounds[0]:  # the round with the median figure, for the table's absolute rates
        rate = (lambda x: x["turbo"]["samples_per_s"]) if key.startswith("floor") else (lambda x: x["samples_per_s"])
        r[key] = sorted((rd[key] for rd in rounds), key=rate)[len(rounds) // 2]
    r["stages"] = _step("a worker's stages", stage_costs, local, BATCH)
    r["collate"] = _step("GpuCollate alone", time_collate)
    r["metas"] = _step("a batch's .json read", time_metas, local)
    s3_error = ""
    with ExitStack() as stack:
        try:
            url, opts = stack.enter_context(moto_s3(shards_dir, BUCKET, PREFIX))
        except Exception as exc:  # report exactly what fails; the other figures still count
            s3_error = f"{type(exc).__name__}: {exc}"
        for suffix, to_device in (("_loader", False), ("", True)):
            what = "device-ready" if to_device else "loader alone"
            r[f"s3_local{suffix}"] = _step(
                f"wsishard, 2 workers, {what} (S3's local twin)", time_wsishard, local, 2, n, to_device=to_device
            )
            if not s3_error:
                try:
                    r[f"s3{suffix}"] = _step(
                        f"S3, 2 workers, {what}", time_wsishard, url, 2, n, to_device=to_device, storage_options=opts
                    )
                except Exception as exc:
                    s3_error = f"{type(exc).__name__}: {exc}"
    if s3_error:
        r["s3"] = {"error": s3_error[:300]}
    r.update(measure_resume_split(mode, shards_dir))
    if user_dir is not None:
        r.update(measure_user(mode, user_dir))
    r.update(measure_wide(mode, shards_dir))
    if mode.peers:
        r["wsistream"] = _step("wsistream, 2 workers", time_wsistream, slides, 2, mode.ws_batches)
    else:  # a peer of the bench extra: never in a smoke run
        r["wsistream"] = {"installed": False, "skipped": "--smoke"}
    return r


def _sandwich(src: str, w: int, mode: Mode, tag: str, decoders: tuple[str, ...]) -> dict[str, Any]:
    """One round's loader alone with ``w`` workers between two floors: ``decoders`` before it, libjpeg-turbo again
    right after it (the ratio takes the geometric mean of the two, :func:`_floor`)."""
    return {
        f"floor{w}": _step(f"decode floor, {w} worker(s){tag}", decode_floor, src, w, mode.floor_samples, decoders),
        f"w{w}_loader": _step(
            f"wsishard, {w} worker(s), loader alone{tag}", time_wsishard, src, w, mode.batches, to_device=False
        ),
        f"floor{w}_after": _step(
            f"decode floor again, {w} worker(s){tag}", decode_floor, src, w, mode.floor_samples, ("turbo",)
        ),
    }


def measure_pairs(mode: Mode, src: str, tag: str) -> dict[str, Any]:
    """The loader alone against the libjpeg-turbo floor in interleaved pairs (:func:`interleaved_pairs`), 1 and 2
    workers."""
    return {
        str(w): _step(
            f"interleaved pairs, {w} worker(s){tag}",
            interleaved_pairs,
            src,
            w,
            mode.pairs,
            PAIR_BATCHES[w],
            batch=BATCH,
            seed=SEED,
        )
        for w in (1, 2)
    }


def measure_user(mode: Mode, user_dir: Path) -> dict[str, Any]:
    """The loader alone against the libjpeg-turbo floor on the user's first build (:func:`prepare_user`), 1 and 2
    workers, in rounds of floor / loader / floor again as the main rounds."""
    from wsishard.storage.opener import load_manifest

    manifest, _ = load_manifest(str(user_dir))
    rounds, src = [], str(user_dir)
    for k in range(mode.rounds):
        tag, rd = f" (user's build, round {k + 1} of {mode.rounds})", {}
        for w in (1, 2):
            rd.update(_sandwich(src, w, mode, tag, ("turbo",)))
        rounds.append(rd)
    pairs = measure_pairs(mode, src, " (user's build)")
    return {
        "user": {
            "rounds": rounds,
            "pairs": pairs,
            "shards": len(manifest.shards),
            "samples": manifest.total_samples,
            "slides": len(manifest.slides),
            "slide_mpp": USER_MPP,
            "size_px": USER_SIZE_PX,
        }
    }


def measure_wide(mode: Mode, shards_dir: Path) -> dict[str, Any]:
    """With cores to spare (at least twice :data:`WIDE_WORKERS`), the loader with that many workers, alone and
    device-ready: there the training process's work per batch (pinning, the hand-off), not a worker's, can set the
    rate. Nothing on a smaller machine."""
    if (os.cpu_count() or 1) < 2 * WIDE_WORKERS:
        return {}
    local, n, w = str(shards_dir), 4 * mode.batches, WIDE_WORKERS
    return {
        "wide_loader": _step(f"wsishard, {w} workers, loader alone", time_wsishard, local, w, n, to_device=False),
        "wide": _step(f"wsishard, {w} workers, device-ready", time_wsishard, local, w, n),
    }


def measure_resume_split(mode: Mode, shards_dir: Path) -> dict[str, Any]:
    """Resume cost, then the same samples from one shard and from the build's shards, back to back."""
    from wsishard.storage.opener import load_manifest

    r: dict[str, Any] = {}
    r["resume"] = _step(
        f"resume at steps {RESUME_STEPS}, 2 workers",
        time_resume,
        str(shards_dir),
        workers=2,
        batch=BATCH,
        seed=SEED,
        steps=RESUME_STEPS,
        rounds=mode.resume_rounds,
    )
    one_dir = one_shard_copy(shards_dir, shards_dir.parent / "one_shard")
    for key, src in (("many_shards_loader", shards_dir), ("one_shard_loader", one_dir)):
        manifest, _ = load_manifest(str(src))
        r[key] = _step(f"{key}, 2 workers", time_wsishard, str(src), 2, mode.batches, to_device=False)
        r[key]["shards"], r[key]["samples"] = len(manifest.shards), manifest.total_samples
    return r


def measure_context(mode: Mode, shards_dir: Path) -> dict[str, Any]:
    """The loader alone, 2 workers, on the build without context and on its copy with one context scale
    (:func:`context_copy`), in alternating rounds (at least 2): samples/s, and decoded images/s (a sample with
    K context scales decodes 1 + K images)."""
    ctx_dir = context_copy(shards_dir, shards_dir.parent / "context")
    runs = {
        f"scales{n}": partial(
            _step,
            f"{n} context scale(s), 2 workers, loader alone",
            time_wsishard,
            str(src),
            2,
            mode.batches,
            to_device=False,
        )
        for n, src in ((0, shards_dir), (1, ctx_dir))
    }
    rounds = interleaved(max(mode.rounds, mode.least_rounds), runs)
    median = {key: median_range([rd[key]["samples_per_s"] for rd in rounds])[0] for key in runs}
    # a run whose workers showed no CPU time (a batch or two, prefetched) has none: NaN, not a crash
    cpu = {key: median_range([rd[key]["cpu_per_worker"] or math.nan for rd in rounds])[0] for key in runs}
    return {
        "rounds": rounds,
        "samples_per_s": median,
        "images_per_s": {k: v * (1 + int(k[-1])) for k, v in median.items()},
        "one_vs_none": median["scales1"] / median["scales0"],
        "per_image_one_vs_none": 2 * median["scales1"] / median["scales0"],
        "cpu_per_worker": cpu,
        "cpu_one_vs_none": cpu["scales1"] / cpu["scales0"],
    }


def _context_rows(c: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    n = len(c["rounds"])
    rows = [
        (
            f"loader alone, 2 workers, {k} context scale(s): samples/s (median of {n} rounds)",
            f"{c['samples_per_s'][f'scales{k}']:.0f}",
            "",
            f"{c['images_per_s'][f'scales{k}']:.0f} decoded images/s",
        )
        for k in (0, 1)
    ]
    rows.append(("  samples/s, one context scale / none", f"{c['one_vs_none']:.2f}", "", "0.50: decode-bound"))
    rows.append(("  decoded images/s, one context scale / none", f"{c['per_image_one_vs_none']:.2f}", "", ""))
    rows += [
        (
            f"samples per worker CPU second, {k} context scale(s)",
            f"{c['cpu_per_worker'][f'scales{k}']:.0f}",
            "",
            "the load of the machine aside",
        )
        for k in (0, 1)
    ]
    rows.append(("  per worker CPU second, one context scale / none", f"{c['cpu_one_vs_none']:.2f}", "", ""))
    return rows


def run_context(mode: Mode, workdir: Path) -> int:
    """``--context``: the context figure alone (:func:`measure_context`) on the user's first build (a real scanner's
    mpp, every default: :func:`prepare_user`), its table and JSON line."""
    shards_dir = prepare_user(workdir) if mode.peers else prepare(workdir, mode)[1]  # smoke: its own small build
    load0, r = load(), {"context": measure_context(mode, shards_dir)}
    r["config"] = {
        "mode": mode.name,
        "batch": BATCH,
        "slide_mpp": USER_MPP,
        "batches": mode.batches,
        "cpus": os.cpu_count(),
        "loadavg_1m_start": load0,
        "loadavg_1m_end": load(),
    }
    print(
        f"Context patches: the loader alone ({mode.name} mode) on the user's first build ({USER_SLIDES} slides at "
        f"{USER_MPP} mpp, defaults) and on its copy with one context scale; 1-min load {load0:.1f} at start, "
        f"{r['config']['loadavg_1m_end']:.1f} at end, {os.cpu_count()} cpus."
    )
    print(markdown(("figure", "measured", "target", ""), _context_rows(r["context"])))
    print("JSON: " + json.dumps(r, default=float, separators=(",", ":")))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true", help="small workload, under 2 minutes once cached")
    parser.add_argument("--workdir", default="/tmp/wsishard-bench-stream", help="cache of slides and shards")
    parser.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    parser.add_argument(
        "--no-user-build",
        action="store_true",
        help=f"leave out the user's first build (default options, slides at {USER_MPP} mpp): about a minute less",
    )
    parser.add_argument(
        "--context",
        action="store_true",
        help="only the loader with one context scale against none (saved as bench_stream_context.json)",
    )
    parser.add_argument(
        "--sampling",
        action="store_true",
        help="only the loader with weights= and select= against none, local and from S3 (saved as bench_sampling.json)",
    )
    parser.add_argument("--no-s3", action="store_true", help="with --sampling: leave out the S3 (moto) rows")
    parser.add_argument("--smoke", action="store_true", help="tiny build, one batch a run, no peers; nothing saved")
    args = parser.parse_args(argv)
    mode = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.context:
        return run_context(mode, Path(args.workdir))
    if args.sampling:
        return run_sampling(mode, Path(args.workdir), not args.no_s3)
    import imagecodecs
    import PIL
    from webdataset import __version__ as wds_version

    import wsishard
    from wsishard.storage.opener import load_manifest

    t_all, load0 = time.perf_counter(), load()
    slides, shards_dir = prepare(Path(args.workdir), mode)
    manifest, _ = load_manifest(str(shards_dir))
    user = args.no_user_build or not mode.peers  # the user's build is 6 slides of 8192 px: not in a smoke run
    r = measure(mode, slides, shards_dir, None if user else prepare_user(Path(args.workdir)))
    counts = [s.patches for s in manifest.slides]
    runs = [rd[key] for rd in r["rounds"] for key in ("w1", "w1_loader", "w2", "w2_loader")]
    seen = [d for run in runs for d in run["distinct_slides"]]
    uniform = expected_distinct(counts, BATCH)
    r["diversity"] = {
        "slides": len(counts),
        "batches": len(seen),
        "mean": float(np.mean(seen)),
        "min": min(seen),
        "uniform": uniform,
        "ratio": float(np.mean(seen)) / uniform,
    }
    r["targets"], r["versions"] = (
        TARGETS,
        {
            "wsishard": wsishard.__version__,
            "webdataset": wds_version,
            "torch": torch.__version__,
            "pillow": PIL.__version__,
            "python": platform.python_version(),
            "wsistream": r["wsistream"].get("version", "not installed"),
            "imagecodecs": imagecodecs.__version__,
            "libjpeg_turbo_imagecodecs": r["floor1"]["turbo"]["libjpeg_turbo"],
            "libjpeg_turbo_pil": r["floor1"]["pil"]["libjpeg_turbo"],
        },
    )
    r["config"] = {
        **asdict(mode),
        "batch": BATCH,
        "wsistream_batch": WS_BATCH,
        "slide_mpp": SLIDE_MPP,
        "target_mpp": TARGET_MPP,
        "patch_px": PATCH_PX,
        "tissue_fraction": TISSUE_FRACTION,
        "shards": len(manifest.shards),
        "samples": manifest.total_samples,
        "device": str(DEVICE),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m_start": load0,
        "loadavg_1m_end": load(),
        "total_s": round(time.perf_counter() - t_all, 1),
    }
    if not args.json_only:
        print(
            f"wsishard stream benchmark ({mode.name}): {len(counts)} slides {mode.size_px}^2 px at {SLIDE_MPP} mpp"
            f" -> {manifest.total_samples} patches of {PATCH_PX} px at {TARGET_MPP} mpp in {len(manifest.shards)}"
            f" shards; device {r['config']['device']}, {os.cpu_count()} cpus, 1-min load {load0:.1f} at start,"
            f" {r['config']['loadavg_1m_end']:.1f} at end"
        )
        print(markdown(("figure", "value", "target", ""), (_cells(row) for row in _rows(r))))
    print("JSON: " + json.dumps(r, default=float, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    import benchkit

    alone = {"--context": "bench_stream_context", "--sampling": "bench_sampling"}  # runs of one figure, saved apart
    name = next((alone[flag] for flag in alone if flag in sys.argv), "bench_stream")
    name += "_gpu" if DEVICE.type == "cuda" and name == "bench_stream" else ""  # a GPU machine's run beside this one's
    sys.exit(benchkit.run(name, main, script="bench_stream"))
