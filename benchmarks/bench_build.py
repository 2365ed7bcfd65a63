#!/usr/bin/env python
"""Benchmark ``wsishard build`` with default options at real scanners' resolutions against the naive loop.

Example::

    python benchmarks/bench_build.py --quick
    python benchmarks/bench_build.py --workdir /data/bench --json-only

Per scanner mpp (0.2500, 0.2520, 0.2631, 0.2265, 0.2425): ``build`` with default options at ``--jobs 1`` and
``--jobs 2``, the naive CLAM/Trident-style loop and the floor, each in a child process whose tree is polled (peak
RSS, CPU time); then a many-shard build, the workers' idle time between scan and extraction, and peak RSS per worker.
What each figure means is on the docs' performance page. Slides are cached in ``--workdir``. Prints Markdown tables,
then one line ``JSON: {...}``. Needs ``psutil`` (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from benchkit import interleaved, load, logger, markdown, median_range, spread

SLIDE_MPP = 0.25  # the generated slides' own level-0 mpp; every run overrides it with a scanner's
SCANNERS = {0.25: "exact 2x", 0.2520: "Aperio AT2", 0.2631: "GT450", 0.2265: "NanoZoomer", 0.2425: "3DHistech"}
REFERENCE_MPP = 0.25
MANY_MPP = 0.2520  # the many-shard build and the RSS comparison: the most common scanner
TARGET_MPP, PATCH_PX, QUALITY = 0.5, 256, 90  # the patches: the build's defaults, and the naive loop's
TISSUE, SEED = 0.2, 0  # tissue fraction of the generated slides; seeds the naive loop's subset
# target names (verdicts are looked up by them)
VS_NAIVE_J1, VS_NAIVE_J2 = "jobs 1 / naive (1 core each)", "jobs 2 / 2x naive (2 cores each)"
SPEEDUP, VS_REF = "jobs 2 / jobs 1, one shard", f"jobs 1 / jobs 1 at {REFERENCE_MPP:.4f}"
RSS_FLAT = "peak RSS per worker, large / small slide"
VS_FLOOR, SCAN_QC = "jobs 1 / floor (1 core each; median of side-by-side pairs)", "scan + QC, share of jobs 1 CPU"
VS_HS2P = "jobs 2 / hs2p (2 processes each)"
HS2P_CHILD = Path(__file__).with_name("hs2p_child.py")  # run by --hs2p's interpreter
CONTENDED_CORES = 0.25  # a run during which other processes kept more cores busy is marked '*'


@dataclass(frozen=True, kw_only=True)
class Mode:
    """Workload of one benchmark mode. Sizes are level-0 (width, height) px."""

    name: str
    size: tuple[int, int]  # the main slides: every per-mpp run, the many-shard build, the large RSS slide
    n_slides: int
    small: tuple[int, int]  # the small slide of the RSS comparison
    naive_max: int  # patches timed in the naive loop (a seeded random subset when there are more)
    many_shards: int  # the many-shard build aims at this many shards
    floor_rounds: int = 3  # jobs 1 and the floor run this many times each, side by side: the ratio's median


QUICK = Mode(name="quick", size=(16384, 12288), n_slides=6, small=(8192, 8192), naive_max=200, many_shards=10)
FULL = Mode(name="full", size=(40960, 30720), n_slides=4, small=(16384, 12288), naive_max=600, many_shards=12)
SMOKE = Mode(
    name="smoke", size=(4096, 4096), n_slides=2, small=(2048, 2048), naive_max=8, many_shards=2, floor_rounds=1
)
SMOKE_SCANNERS = (0.25, 0.2520)  # --smoke: the exact 2x and one scanner's mpp, every run kind at each


# ---------------------------------------------------------------------------------------------- child side


# ------------------------------------------------------------------ where a build's CPU goes, per process and stage
# Timers wrapped around the build's own functions, installed in the build child before build() forks its workers
# (which inherit them); each process writes its figures to <folder>/<pid>.json after each unit of work (a slide
# scanned, a segment extracted). Time is exclusive (a stage called from another counts for the innermost one only),
# CPU time of the calling thread. The stages are listed on the docs' performance page.

STAGES = ("scan", "qc", "decode", "resample", "scores", "encode", "write")
# (module, attribute (Class.method allowed), stage); the units end with a dump of this process's figures
_WRAPPED = [
    ("wsishard.builder.scan.scan", "scan_slide", "scan"),
    ("wsishard.builder.scan.scan", "_write_qc", "qc"),
    ("wsishard.builder.extract.patches", "reduced_read", "decode"),
    ("wsishard.builder.extract.context", "reduced_read", "decode"),
    ("wsishard.builder.extract.resample", "Reduced.cut", "resample"),
    ("wsishard.builder.extract.patches", "quality_scores", "scores"),
    ("wsishard.builder.extract.patches", "encode_image", "encode"),
    ("wsishard.builder.extract.context", "encode_image", "encode"),
    ("wsishard.builder.extract.extract", "sample_records", "write"),
    ("wsishard.builder.extract.extract", "ShardWriter.append", "write"),
    ("wsishard.builder.extract.extract", "ShardWriter.commit", "write"),
]
_UNITS = {"scan_slide", "extract_segment"}


class _Timer:
    def __init__(self) -> None:
        self.folder: Path | None = None
        self.cpu_s: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(STAGES, 0)
        self.stack: list[float] = []  # per open call: CPU time its inner stages took

    def wrap(self, fn: Any, stage: str | None, unit: bool) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(0.0)
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - t0
                inner = self.stack.pop()
                if stage is not None:
                    self.cpu_s[stage] += spent - inner
                    self.calls[stage] += 1
                    if self.stack:
                        self.stack[-1] += spent
                elif self.stack:
                    self.stack[-1] += inner
                if unit:
                    self.dump()

        return timed

    def dump(self) -> None:
        if self.folder is not None:
            cpu = time.process_time()
            figures = {"pid": os.getpid(), "cpu_s": cpu, "stages_cpu_s": self.cpu_s, "calls": self.calls}
            tmp = self.folder / f".{os.getpid()}.tmp"
            tmp.write_text(json.dumps(figures))
            os.replace(tmp, self.folder / f"{os.getpid()}.json")


TIMER = _Timer()


def install_stage_timers(folder: str) -> None:
    """Wrap the build's stage functions; every process of the build then reports into ``folder``."""
    import importlib

    TIMER.folder = Path(folder)
    TIMER.folder.mkdir(parents=True, exist_ok=True)
    for module_name, attr, stage in [*_WRAPPED, ("wsishard.builder.extract.extract", "extract_segment", None)]:
        module = importlib.import_module(module_name)
        owner, name = (getattr(module, attr.split(".")[0]), attr.split(".")[1]) if "." in attr else (module, attr)
        setattr(owner, name, TIMER.wrap(getattr(owner, name), stage, name in _UNITS))
    import wsishard.builder.extract.extract as extract
    import wsishard.builder.run.orchestrate as run  # it calls these two through names of its own
    import wsishard.builder.scan.scan as scan

    run.scan_slide, run.extract_segment = scan.scan_slide, extract.extract_segment


def collect_stage_times(folder: str) -> dict[str, Any]:
    """Every process's figures: ``{"processes": [...], "cpu_s": {stage: total}, "share": {stage: fraction}}``."""
    procs = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    total = sum(p["cpu_s"] for p in procs)
    stages = {s: sum(p["stages_cpu_s"][s] for p in procs) for s in STAGES}
    stages["other"] = max(0.0, total - sum(stages.values()))
    share = {s: v / total if total > 0 else 0.0 for s, v in stages.items()}
    return {"processes": procs, "cpu_s": stages, "total_cpu_s": total, "share": share}


# ------------------------------------------------------------ process trees: peak RSS and CPU over time, per process

MB = 1024**2


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


class TreeWatcher(threading.Thread):
    """Polls a process and its descendants every ``interval_s``: peak RSS, and CPU time over time per pid."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.peak_rss: dict[int, int] = {}
        self.cpu: dict[int, list[tuple[float, float]]] = {}  # pid -> [(time.monotonic(), CPU seconds)]
        self.parent: dict[int, int] = {}
        self.helpers: set[int] = set()
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop_event.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    with proc.oneshot():
                        rss, cpu, ppid = proc.memory_info().rss, proc.cpu_times(), proc.ppid()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                if proc.pid not in self.parent and "resource_tracker" in " ".join(_cmdline(proc)):
                    self.helpers.add(proc.pid)
                now = time.monotonic()
                self.peak_rss[proc.pid] = max(self.peak_rss.get(proc.pid, 0), rss)
                self.cpu.setdefault(proc.pid, [(now - self.interval_s, 0.0)]).append((now, cpu.user + cpu.system))
                self.parent[proc.pid] = ppid
            self._stop_event.wait(self.interval_s)

    def workers(self) -> list[int]:
        """Pool workers: the leaves below the root (root -> worker when forked, root -> forkserver -> worker
        otherwise; multiprocessing's resource tracker is a leaf too but is left out); no pool: the root."""
        parents = set(self.parent.values())
        found = [p for p in self.parent if p != self.pid and p not in parents and p not in self.helpers]
        return found or [self.pid]

    def cpu_between(self, pids: list[int], a: float, b: float) -> float:
        """CPU seconds ``pids`` used between monotonic times ``a`` and ``b`` (interpolated between polls)."""
        total = 0.0
        for pid in pids:
            t, c = np.array(self.cpu.get(pid, [(0.0, 0.0)])).T
            total += float(np.interp(b, t, c) - np.interp(a, t, c))
        return total

    def stop(self) -> dict[str, Any]:
        self._stop_event.set()
        self.join()
        workers = self.workers()
        last = {p: s[-1][1] for p, s in self.cpu.items() if p not in self.helpers}
        return {
            "workers": len(workers),
            "worker_rss_mb": max(self.peak_rss.get(p, 0) for p in workers) / MB,
            "root_rss_mb": self.peak_rss.get(self.pid, 0) / MB,
            "workers_cpu_s": sum(last.get(p, 0.0) for p in workers),
            "tree_cpu_s": sum(last.values()),
        }


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process) since boot."""
    t = psutil.cpu_times()  # Linux: guest time is already in user
    return t.user + t.system + sum(getattr(t, k, 0.0) for k in ("nice", "irq", "softirq", "steal"))


def run_watched(cmd: list[str]) -> tuple[int, str, TreeWatcher, dict[str, Any]]:
    """Run ``cmd`` (stdout captured) under a :class:`TreeWatcher`: exit status, stdout, the watcher, and its figures
    plus ``process_wall_s`` and ``other_load_cores`` (cores other processes of the machine kept busy meanwhile)."""
    busy0, me0, t0 = busy_cpu_s(), psutil.Process().cpu_times(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    watcher = TreeWatcher(proc.pid)
    watcher.start()
    out, _ = proc.communicate()
    polled = watcher.stop()
    wall, me1 = time.perf_counter() - t0, psutil.Process().cpu_times()
    mine = polled["tree_cpu_s"] + (me1.user + me1.system) - (me0.user + me0.system)  # the child's tree + the polling
    others = max(0.0, busy_cpu_s() - busy0 - mine) / wall
    return proc.returncode, out, watcher, {**polled, "process_wall_s": wall, "other_load_cores": others}


# -------------------------------------------------------------------------------------------------- the children


def shard_patches(output: str, slides: list[str]) -> list[tuple[int, int, int, int]]:
    """(slide index, level-0 x, y, extent) of every sample the build wrote, read from its shards' ``.json``."""
    index = {os.path.basename(p): k for k, p in enumerate(slides)}
    found = []
    for name in sorted(n for n in os.listdir(output) if n.endswith(".tar")):
        with tarfile.open(os.path.join(output, name)) as tar:
            for member in tar:
                fh = tar.extractfile(member) if member.name.endswith(".json") else None
                if fh is not None:
                    meta = json.load(fh)
                    if meta.get("level", 0) != 0:
                        raise SystemExit(f"expected the build to read level 0, got {meta}")
                    found.append((index[meta["file"]], meta["x"], meta["y"], meta["extent"]))
    return sorted(found, key=lambda p: (p[0], p[2], p[1]))  # slide, then grid (row-major) order


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def child_build(spec: dict[str, Any]) -> dict[str, Any]:
    """``build`` with default options but ``jobs``, the mpp tag and (for the many-shard run) ``shard_samples``."""
    from wsishard.builder.options.buildopts import BuildOptions, BuildProgress
    from wsishard.builder.run.orchestrate import build

    stages_dir = spec["output"] + ".stages"
    shutil.rmtree(stages_dir, ignore_errors=True)
    install_stage_timers(stages_dir)  # before build(): its forked workers inherit the timers

    overrides = {os.path.basename(p): spec["mpp"] for p in spec["slides"]}
    options = BuildOptions(
        jobs=spec["jobs"],
        mpp_overrides=overrides,
        shard_samples=spec.get("shard_samples"),
        context_mpp=tuple(spec.get("context_mpp", ())),
    )
    shutil.rmtree(spec["output"], ignore_errors=True)  # a build into an existing output would resume it
    events: list[tuple[float, str, int]] = []  # (time.monotonic(): one clock for every process, stage, patches)

    def progress(event: BuildProgress) -> None:
        events.append((time.monotonic(), event.stage, event.patches_done))

    from wsishard.slide.tiff import TILES  # jobs 1 reads in this process: its tile decodes and cache hits

    rss0, hits0, misses0 = _rss_mb(), TILES.hits_at[2], TILES.misses_at[2]  # 2: the patches' 1/2-scale tiles
    cpu0, t0 = time.process_time(), time.monotonic()
    manifest = build(spec["slides"], spec["output"], options, progress=progress)
    t1 = time.monotonic()
    TIMER.dump()
    stages = collect_stage_times(stages_dir)
    shutil.rmtree(stages_dir, ignore_errors=True)
    since_start = time.time() - time.monotonic() - psutil.Process().create_time()  # process start, monotonic
    failed = [f"{s.file}: {s.reason}" for s in manifest.failed_slides]
    per_slide = {os.path.basename(s.file): s.patches for s in manifest.slides}
    scan_end = max((t for t, stage, _ in events if stage == "scan"), default=t0)
    first_write, first_patches = min(
        ((t, n) for t, stage, n in events if stage == "extract" and n > 0), default=(t1, 0)
    )
    return {
        "patches": manifest.total_samples,
        "wall_s": t1 - t0,
        "cpu_s": time.process_time() - cpu0,
        "cpu0_s": cpu0,
        "shards": len(manifest.shards),
        "per_slide": per_slide,
        "failed": failed,
        "rss_before_mb": rss0,
        "t_start": t0,
        "t_scan_end": scan_end,
        "t_first_write": first_write,
        "first_segment_patches": first_patches,
        "t_end": t1,
        "tile_hits": TILES.hits_at[2] - hits0,
        "tile_decodes": TILES.misses_at[2] - misses0,
        "stages": stages,
        "first_write_since_process_start_s": first_write + since_start,
    }


def child_naive(spec: dict[str, Any]) -> dict[str, Any]:
    """CLAM/Trident style, per kept patch: read_region of the level-0 extent -> RGB -> PIL default resize -> JPEG."""
    import openslide

    extent = round(PATCH_PX * TARGET_MPP / spec["mpp"])
    todo = [tuple(p) for p in spec["patches"]]
    total = len(todo)
    if total > spec["max_patches"]:  # seeded subset, kept in grid order (as a CLAM loop walks it)
        pick = np.sort(np.random.default_rng((SEED, 0xBE7C)).choice(total, spec["max_patches"], replace=False))
        todo = [todo[i] for i in pick.tolist()]
    slides = [openslide.OpenSlide(p) for p in spec["slides"]]
    rss0, nbytes = _rss_mb(), 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    for k, x, y, _ in todo:
        image = slides[k].read_region((x, y), 0, (extent, extent)).convert("RGB")
        image = image.resize((PATCH_PX, PATCH_PX))  # Pillow's default filter (bicubic, antialiased), as CLAM
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=QUALITY)
        nbytes += buf.tell()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "patches": len(todo),
        "kept_total": total,
        "wall_s": wall,
        "cpu_s": cpu,
        "extent": extent,
        "extent_as_build": all(p[3] == extent for p in todo),
        "mean_bytes": nbytes / max(len(todo), 1),
        "rss_before_mb": rss0,
    }


def _tiles(x0: int, y0: int, w: int, h: int, page: Any) -> list[int]:
    """Indices of the level-0 tiles covering a level-0 rectangle (clipped to the image)."""
    tw, th = page.tilewidth, page.tilelength
    across = -(-page.imagewidth // tw)
    x1, y1 = min(x0 + w, page.imagewidth) - 1, min(y0 + h, page.imagelength) - 1
    return [
        ty * across + tx for ty in range(max(y0, 0) // th, y1 // th + 1) for tx in range(max(x0, 0) // tw, x1 // tw + 1)
    ]


def _patch_pixels(tiles: dict[int, np.ndarray], page: Any, x: int, y: int, e: int) -> np.ndarray:
    """The level-0 square (x, y, e) assembled from decoded tiles: (e, e, 3) uint8."""
    out = np.full((e, e, 3), 255, np.uint8)
    tw, th, across = page.tilewidth, page.tilelength, -(-page.imagewidth // page.tilewidth)
    for i in _tiles(x, y, e, e, page):
        tx0, ty0 = (i % across) * tw, (i // across) * th
        ax, ay = max(x, tx0), max(y, ty0)
        bx, by = min(x + e, tx0 + tw, page.imagewidth), min(y + e, ty0 + th, page.imagelength)
        out[ay - y : by - y, ax - x : bx - x] = tiles[i][ay - ty0 : by - ty0, ax - tx0 : bx - tx0]
    return out


def _decode_reduced(page: Any, data: bytes, k: int) -> np.ndarray:
    """A JPEG tile decoded at 1/``k`` by libjpeg's DCT scaling: (th / k, tw / k, 3) uint8, by the cheapest call the
    build knows (Pillow's decoder driven directly, as ``Image.open`` + ``draft`` would drive it)."""
    from wsishard.slide.tiff import _jpeg_scaled

    if page.jpegtables:  # abbreviated stream: the shared tables spliced in
        data = page.jpegtables[:-2] + data[2:]
    rgb = page.photometric == 2 and not page.is_jfif  # an Aperio tile: RGB whatever its markers say
    return _jpeg_scaled(data, page.tilewidth // k, page.tilelength // k, k, rgb)


def child_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """Each needed level-0 tile decoded once at 1/k (the build's stage 1), each patch resampled once by bicubic at
    the rest of the scale (the build's stage 2, which exactness at the target mpp needs), each patch encoded once,
    each by the cheapest call the build itself uses; only those timed (CPU). ``decode_full_s``: the same tiles
    decoded at full size (the floor before 0.3)."""
    import types

    import cv2
    import tifffile

    from wsishard.builder.extract.resample import encode_image

    cv2.setNumThreads(1)  # one core, as a build worker
    scale = TARGET_MPP / spec["mpp"]  # level-0 px per output px
    k = max(1, int(scale * 1.06 + 1e-9))
    rest = scale / k
    t = dict.fromkeys(("decode_s", "resample_s", "encode_s", "decode_full_s"), 0.0)
    tiles_needed, rss0 = 0, _rss_mb()
    for n, path in enumerate(spec["slides"]):
        with tifffile.TiffFile(path) as tif:
            page: Any = tif.pages[0]  # Aperio svs: level 0 is the first page, tiled JPEG
            dims = {a: getattr(page, a) // k for a in ("tilewidth", "tilelength", "imagewidth", "imagelength")}
            small = types.SimpleNamespace(**dims)  # the page at 1/k
            tiles: dict[int, np.ndarray] = {}  # decoded at 1/k; dropped once every later patch is below
            across = -(-page.imagewidth // page.tilewidth)
            side = math.ceil(PATCH_PX * rest) + 3  # the reduced px stage 2 reads of a patch, as the build
            for _, x, y, _ in (p for p in spec["patches"] if p[0] == n):  # in (y, x) order
                for i in (i for i in _tiles(x, y, side * k, side * k, page) if i not in tiles):
                    tif.filehandle.seek(page.dataoffsets[i])
                    data = tif.filehandle.read(page.databytecounts[i])
                    c0 = time.process_time()
                    tiles[i] = _decode_reduced(page, data, k)
                    c1 = time.process_time()
                    page.decode(data, i, jpegtables=page.jpegtables, jpegheader=page.jpegheader)
                    t["decode_s"] += c1 - c0
                    t["decode_full_s"] += time.process_time() - c1
                    tiles_needed += 1
                crop = _patch_pixels(tiles, small, x // k, y // k, side)  # untimed: a copy
                c0 = time.process_time()
                if abs(rest - 1.0) > 1e-9:
                    crop = cv2.resize(crop, None, fx=1 / rest, fy=1 / rest, interpolation=cv2.INTER_CUBIC)
                patch = crop[:PATCH_PX, :PATCH_PX]
                c1 = time.process_time()
                encode_image(patch, "jpg", QUALITY)  # the build's encoder: OpenCV's libjpeg-turbo, Pillow's bytes
                t["resample_s"] += c1 - c0
                t["encode_s"] += time.process_time() - c1
                row = y // page.tilelength  # tiles of rows above this one: no later patch needs them
                tiles = {i: v for i, v in tiles.items() if i // across >= row}
    cpu = t["decode_s"] + t["resample_s"] + t["encode_s"]
    return {
        "patches": len(spec["patches"]),
        "wall_s": cpu,
        "cpu_s": cpu,
        **t,
        "k": k,
        "rest": rest,
        "tiles_needed": tiles_needed,
        "rss_before_mb": rss0,
    }


CHILDREN = {"build": child_build, "naive": child_naive, "floor": child_floor}


# --------------------------------------------------------------------------------------------- parent side


def phase_idle(watcher: TreeWatcher, result: dict[str, Any]) -> dict[str, float]:
    """How long the pool workers sat idle around the scan -> extraction barrier, as fractions of the build.

    ``gap``: from the last slide scanned to the first segment written (it includes that first segment's own
    work), over the wall time. ``*_idle``: worker-seconds without CPU in the scan phase (the tail where fewer
    slides than workers are left), in that gap and after it, over workers x wall time (waiting for a core that
    another process holds counts too).
    """
    t0, scan, write, t1 = (result[k] for k in ("t_start", "t_scan_end", "t_first_write", "t_end"))
    pids = watcher.workers()
    n, wall = len(pids), t1 - t0
    scan_idle = n * (scan - t0) - watcher.cpu_between(pids, t0, scan)
    gap_idle = n * (write - scan) - watcher.cpu_between(pids, scan, write)
    extract_idle = n * (t1 - write) - watcher.cpu_between(pids, write, t1)
    return {
        "gap_s": write - scan,
        "gap_fraction": (write - scan) / wall,
        "scan_idle_fraction": scan_idle / (n * wall),
        "gap_idle_fraction": gap_idle / (n * wall),
        "extract_idle_fraction": extract_idle / (n * wall),
        "idle_fraction": 1 - watcher.cpu_between(pids, t0, t1) / (n * wall),
    }


def _check_hs2p(python: str) -> None:
    """Exit with one line unless ``python`` runs and imports hs2p."""
    try:
        found = subprocess.run([python, "-c", "import hs2p"], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise SystemExit(f"bench_build: --hs2p {python}: cannot run it ({exc.strerror})") from None
    if found.returncode != 0:
        last = (found.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"bench_build: --hs2p {python}: it cannot import hs2p ({last})")


def run_hs2p(python: str, spec: dict[str, Any], log: Any) -> dict[str, Any] | None:
    """hs2p over the same slides at the same level-0 mpp with 2 workers (``benchmarks/hs2p_child.py`` under ``python``,
    an interpreter with hs2p installed), its process tree polled as the children's are; None (logged) when it
    failed a slide or wrote nothing: the run goes on without that row."""
    shutil.rmtree(spec["output"], ignore_errors=True)
    cmd = [python, str(HS2P_CHILD), "--mpp", str(spec["mpp"]), "--out", spec["output"], "--workers", "2"]
    returncode, out, _, polled = run_watched(cmd + spec["slides"])
    found = [line for line in out.splitlines() if line.startswith("JSON: ")]
    if returncode != 0 or not found:
        log(f"WARNING: hs2p failed at {spec['mpp']:.4f} (exit {returncode}), no hs2p row: {out[-300:]!r}")
        return None
    return {**json.loads(found[-1][len("JSON: ") :]), **polled}


def run_child(method: str, spec: dict[str, Any], stem: Path) -> dict[str, Any]:
    """Run one method in a child process (spec in ``stem``.json), polling its process tree."""
    spec_path = stem.parent / f"{stem.name}.json"  # not with_suffix: names hold an mpp (a dot)
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--spec", str(spec_path)]
    returncode, out, watcher, polled = run_watched(cmd)
    if returncode != 0:
        raise SystemExit(f"{method} child failed (exit {returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    if method == "build" and spec["jobs"] > 1:
        result["idle"] = phase_idle(watcher, result)
    return {**result, **polled}


def ensure_slides(folder: Path, size: tuple[int, int], n: int, log: Any) -> list[str]:
    """``n`` cached synthetic svs slides of ``size`` (generated once, atomically)."""
    from wsishard.testing.synthetic import make_slide

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in range(n):
        path = folder / f"synth-{size[0]}x{size[1]}-t{TISSUE:g}-s{seed}.svs"
        if not path.exists():
            log(f"generating {path.name} ...")
            tmp = folder / f".tmp-{os.getpid()}-{path.name}"
            make_slide(tmp, width=size[0], height=size[1], mpp=SLIDE_MPP, seed=seed, tissue_fraction=TISSUE)
            os.replace(tmp, path)
        paths.append(str(path))
    return paths


def versions() -> dict[str, str]:
    import imagecodecs
    import openslide
    import PIL
    import tifffile
    from PIL import features

    import wsishard

    return {
        "wsishard": wsishard.__version__,
        "openslide_python": openslide.__version__,
        "openslide": openslide.__library_version__,
        "tifffile": tifffile.__version__,
        "imagecodecs": imagecodecs.__version__,
        "imagecodecs_libjpeg": imagecodecs.jpeg8_version(),
        "pillow": PIL.__version__,
        "pillow_libjpeg_turbo": str(features.version("libjpeg_turbo")),
        "numpy": np.__version__,
        "psutil": psutil.__version__,
        "python": platform.python_version(),
    }


def measure(mode: Mode, workdir: Path, log: Any, hs2p: str | None = None) -> dict[str, dict[str, Any]]:
    """Every run, keyed ``build_j1@0.2520``, ``naive@0.2520``, ..., ``many_j2``, ``rss_big``; ``hs2p@0.2520``, ...
    with ``hs2p`` (an interpreter that has it)."""
    slides = ensure_slides(workdir / "slides", mode.size, mode.n_slides, log)
    small = ensure_slides(workdir / "slides", mode.small, 1, log)
    raw: dict[str, dict[str, Any]] = {}
    patch_lists: dict[float, list[Any]] = {}  # per mpp: the patches the first jobs 1 build wrote

    def run(name: str, method: str, spec: dict[str, Any], keep: bool = False) -> None:
        log(f"running {name} ...")
        output = workdir / f"out-{name}"
        spec = {"slides": slides, "output": str(output), **spec}
        if method == "hs2p" and hs2p:
            if (found := run_hs2p(hs2p, spec, log)) is not None:
                raw[name] = found
        else:
            raw[name] = run_child(method, spec, workdir / name)
        if not keep:
            shutil.rmtree(output, ignore_errors=True)

    for mpp in SCANNERS:
        run(f"build_j1@{mpp:.4f}", "build", {"jobs": 1, "mpp": mpp}, keep=True)
        run(f"build_j2@{mpp:.4f}", "build", {"jobs": 2, "mpp": mpp})
        if hs2p:
            run(f"hs2p@{mpp:.4f}", "hs2p", {"mpp": mpp})
        j1_output = workdir / f"out-build_j1@{mpp:.4f}"
        patches = shard_patches(str(j1_output), slides)  # the baselines process exactly what the build wrote
        shutil.rmtree(j1_output, ignore_errors=True)
        run(f"naive@{mpp:.4f}", "naive", {"mpp": mpp, "patches": patches, "max_patches": mode.naive_max})
        run(f"floor@{mpp:.4f}", "floor", {"mpp": mpp, "patches": patches})
        patch_lists[mpp] = patches
    for r in range(1, mode.floor_rounds):  # more side-by-side pairs: the machine's speed drifts by 10-20%
        for mpp in SCANNERS:
            run(f"build_j1@{mpp:.4f}#{r}", "build", {"jobs": 1, "mpp": mpp})
            run(f"floor@{mpp:.4f}#{r}", "floor", {"mpp": mpp, "patches": patch_lists[mpp]})
    per_shard = max(16, raw[f"build_j1@{MANY_MPP:.4f}"]["patches"] // mode.many_shards)
    for jobs in (1, 2):
        run(f"many_j{jobs}", "build", {"jobs": jobs, "mpp": MANY_MPP, "shard_samples": per_shard})
    run("rss_small", "build", {"jobs": 2, "mpp": MANY_MPP, "slides": small})
    run("rss_big", "build", {"jobs": 2, "mpp": MANY_MPP, "slides": slides[:1]})
    return raw


@dataclass(frozen=True)
class Rate:
    """One run's throughput; ``cpu_s``: of every process doing the work."""

    patches: int
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.patches / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def per_cpu_s(self) -> float:  # robust to other load on a shared machine
        return self.patches / self.cpu_s if self.cpu_s > 0 else 0.0


def rate(run: dict[str, Any], pool: bool = False) -> Rate:
    # jobs 2 (and hs2p): the workers' and the parent's CPU, less the parent's start (interpreter, imports)
    cpu = run["tree_cpu_s"] - run["cpu0_s"] if pool else run["cpu_s"]
    return Rate(run["patches"], run["wall_s"], cpu)


def per_mpp(raw: dict[str, dict[str, Any]]) -> dict[float, dict[str, Rate]]:
    """Per mpp: ``j1``, ``j2``, ``naive``, ``floor`` and, where it ran, ``hs2p``."""
    return {
        mpp: {
            "j1": rate(raw[f"build_j1@{mpp:.4f}"]),
            "j2": rate(raw[f"build_j2@{mpp:.4f}"], pool=True),
            "naive": rate(raw[f"naive@{mpp:.4f}"]),
            "floor": rate(raw[f"floor@{mpp:.4f}"]),
            **({"hs2p": rate(raw[f"hs2p@{mpp:.4f}"], pool=True)} if f"hs2p@{mpp:.4f}" in raw else {}),
        }
        for mpp in SCANNERS
    }


def floor_pairs(raw: dict[str, dict[str, Any]], mpp: float) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The side-by-side ``(jobs 1 build, floor)`` runs at ``mpp``, in the order they ran."""
    pairs, r = [], 0
    while f"floor@{mpp:.4f}" + (tag := f"#{r}" if r else "") in raw:
        pairs.append((raw[f"build_j1@{mpp:.4f}{tag}"], raw[f"floor@{mpp:.4f}{tag}"]))
        r += 1
    return pairs


def floor_ratios(raw: dict[str, dict[str, Any]], mpp: float) -> tuple[float, float, list[float]]:
    """jobs 1 / floor at ``mpp``: the median over the side-by-side pairs of the wall-clock ratio and of the
    CPU-second ratio, and each pair's wall-clock ratio."""
    rates = [(rate(b), rate(fl)) for b, fl in floor_pairs(raw, mpp)]
    walls = [j1.per_s / floor.per_s for j1, floor in rates]
    cpus = [j1.per_cpu_s / floor.per_cpu_s for j1, floor in rates]
    return median_range(walls)[0], median_range(cpus)[0], walls


GAP_PARTS = ("scan + QC", "scores", "write", "decode", "resample", "encode", "in-build other")


def floor_gap(raw: dict[str, dict[str, Any]], mpp: float) -> dict[str, Any]:
    """Where ``--jobs 1`` spends CPU beyond the floor at ``mpp``, per side-by-side pair, in ms per patch: the work
    the build owes beyond decode, resample and encode (scan + QC, the quality scores, writing the tar and its index),
    each of the floor's three steps as the build pays it less the floor's own, and what no stage timer covers inside
    ``build()`` (the pool, planning, sample metadata, the manifest; not the interpreter's start). ``ceiling``: the
    jobs 1 / floor CPU ratio were everything but the owed work free, ``floor / (floor + scan + QC + scores +
    write)``; a target above it cannot be met while those cost what they do. Medians over the pairs."""
    pairs: list[dict[str, float]] = []
    for b, fl in floor_pairs(raw, mpp):
        n, st = max(b["patches"], 1), b["stages"]["cpu_s"]
        floor, build = 1000 * fl["cpu_s"] / max(fl["patches"], 1), 1000 * b["cpu_s"] / n
        ms = {s: 1000 * v / n for s, v in st.items()}
        parts = {
            "scan + QC": ms["scan"] + ms["qc"],
            "scores": ms["scores"],
            "write": ms["write"],
            "decode": ms["decode"] - 1000 * fl["decode_s"] / n,
            "resample": ms["resample"] - 1000 * fl["resample_s"] / n,
            "encode": ms["encode"] - 1000 * fl["encode_s"] / n,
            "in-build other": build - sum(v for s, v in ms.items() if s != "other"),
        }
        owed = parts["scan + QC"] + parts["scores"] + parts["write"]
        pairs.append(
            {"floor": floor, "build": build, "ratio": floor / build, "ceiling": floor / (floor + owed), **parts}
        )
    return {k: median_range([p[k] for p in pairs])[0] for k in pairs[0]} | {"pairs": pairs}


def gap_table(raw: dict[str, dict[str, Any]]) -> list[str]:
    """:func:`floor_gap` per mpp, a Markdown table (the performance page shows it)."""
    rows = []
    for mpp in SCANNERS:
        g = floor_gap(raw, mpp)
        rows.append(
            [
                f"{mpp:.4f}",
                spread([p["ratio"] for p in g["pairs"]]),
                spread([p["ceiling"] for p in g["pairs"]]),
                f"{g['floor']:.2f}",
                f"{g['build']:.2f}",
                *(f"{g[k]:+.3f}" for k in GAP_PARTS),
            ]
        )
    caption = (
        "jobs 1 beyond the floor, CPU ms per patch (median of the side-by-side pairs): the work the build owes beyond "
        "the floor's three steps, each step's cost over the floor's, and the rest of build(); ceiling: jobs 1 / floor "
        "were all but the owed work (scan + QC, scores, write) free"
    )
    head = ("mpp", "jobs 1 / floor (CPU)", "ceiling", "floor ms", "jobs 1 ms", *GAP_PARTS)
    return [*markdown(head, rows, caption, "lrrrr" + "r" * len(GAP_PARTS)).splitlines(), ""]


def verdicts(raw: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target, per mpp: the wall-clock ratio (the verdict) and the same ratio from CPU-seconds."""
    rates = per_mpp(raw)
    items: list[tuple[str, float, float, float | None, str, float, tuple[str, ...]]] = []  # ..., runs compared
    ref = rates[REFERENCE_MPP]["j1"]
    small, big = raw["rss_small"]["worker_rss_mb"], raw["rss_big"]["worker_rss_mb"]
    for mpp, r in rates.items():
        j1, j2, naive = r["j1"], r["j2"], r["naive"]
        k1, k2, kn = (f"{k}@{mpp:.4f}" for k in ("build_j1", "build_j2", "naive"))
        items += [
            (VS_NAIVE_J1, mpp, j1.per_s / naive.per_s, j1.per_cpu_s / naive.per_cpu_s, ">=", 3.0, (k1, kn)),
            (VS_NAIVE_J2, mpp, j2.per_s / (2 * naive.per_s), j2.per_cpu_s / naive.per_cpu_s, ">=", 3.0, (k2, kn)),
            (SPEEDUP, mpp, j2.per_s / j1.per_s, 2 * j2.per_cpu_s / j1.per_cpu_s, ">=", 1.7, (k1, k2)),
        ]
        if "hs2p" in r:
            h = r["hs2p"]
            items.append(
                (VS_HS2P, mpp, j2.per_s / h.per_s, j2.per_cpu_s / h.per_cpu_s, ">=", 3.0, (k2, f"hs2p@{mpp:.4f}"))
            )
        share = raw[k1]["stages"]["share"]
        items += [
            (VS_FLOOR, mpp, *floor_ratios(raw, mpp)[:2], ">=", 0.85, (k1,)),
            (SCAN_QC, mpp, share["scan"] + share["qc"], None, "<=", 0.10, ()),
        ]
        if mpp != REFERENCE_MPP:
            items.append(
                (
                    VS_REF,
                    mpp,
                    j1.per_s / ref.per_s,
                    j1.per_cpu_s / ref.per_cpu_s,
                    ">=",
                    0.8,
                    (k1, f"build_j1@{REFERENCE_MPP:.4f}"),
                )
            )
    items.append((RSS_FLAT, MANY_MPP, big / small, None, "<=", 1.3, ()))
    return [
        {
            "name": n,
            "mpp": m,
            "value": v,
            "cpu_value": c,
            "target": f"{op} {t:g}x",
            "pass": v >= t if op == ">=" else v <= t,
            "contended": any(raw[k]["other_load_cores"] > CONTENDED_CORES for k in runs),
        }
        for n, m, v, c, op, t, runs in items
    ]


def _verdict_of(checks: list[dict[str, Any]], mpp: float, *names: str) -> str:
    found = [c for c in checks if c["mpp"] == mpp and c["name"] in names]
    mark = "*" if any(c["contended"] for c in found) else ""
    return ("PASS" if all(c["pass"] for c in found) else "MISS") + mark if found else "-"


def mpp_table(raw: dict[str, dict[str, Any]], checks: list[dict[str, Any]]) -> list[str]:
    """One row per mpp, for the performance page."""
    head: tuple[str, ...] = (
        "level-0 mpp (scanner)",
        "patches",
        "jobs 1 patch/s",
        "jobs 2 patch/s",
        "naive patch/s (1 core)",
        "build / naive (j1; j2 vs 2x)",
        "floor patch/s",
        "vs 0.25 (j1)",
        "j2 / j1",
        ">= 3x naive",
        ">= 0.8x ref",
        "j2 >= 1.7x j1",
    )
    rows = []
    rates = per_mpp(raw)
    hs2p = all("hs2p" in r for r in rates.values())
    if hs2p:
        head += ("hs2p patch/s (2 processes)", "j2 / hs2p", ">= 3x hs2p")
    for mpp, r in rates.items():
        j1, j2, naive, floor = r["j1"], r["j2"], r["naive"], r["floor"]
        verdicts = [_verdict_of(checks, mpp, *names) for names in ((VS_NAIVE_J1, VS_NAIVE_J2), (VS_REF,), (SPEEDUP,))]
        if hs2p:
            verdicts += [
                f"{r['hs2p'].per_s:.0f}",
                f"{j2.per_s / r['hs2p'].per_s:.2f}x",
                _verdict_of(checks, mpp, VS_HS2P),
            ]
        cells = [
            f"{mpp:.4f} ({SCANNERS[mpp]})",
            str(j1.patches),
            f"{j1.per_s:.0f}",
            f"{j2.per_s:.0f}",
            f"{naive.per_s:.0f}",
            f"{j1.per_s / naive.per_s:.2f}x; {j2.per_s / (2 * naive.per_s):.2f}x",
            f"{floor.per_s:.0f}",
            f"{j1.per_s / rates[REFERENCE_MPP]['j1'].per_s:.2f}x",
            f"{j2.per_s / j1.per_s:.2f}x",
            *verdicts,
        ]
        rows.append(cells)
    return markdown(head, rows).splitlines()


def idle_figures(raw: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The scan -> extraction figures of each jobs 2 build; ``wait_fraction``: the gap less the first segment's
    own work (its patches at the extraction rate of jobs 1 on the same workload), over the wall time."""
    out = {}
    for name, j1 in [("many_j2", raw["many_j1"])] + [(f"build_j2@{m:.4f}", raw[f"build_j1@{m:.4f}"]) for m in SCANNERS]:
        run = raw[name]
        rest = j1["patches"] - j1["first_segment_patches"]  # s per patch: jobs 1 after its first segment
        per_patch = (j1["t_end"] - j1["t_first_write"]) / rest if rest > 0 else j1["wall_s"] / j1["patches"]
        wait = run["idle"]["gap_s"] - run["first_segment_patches"] * per_patch
        out[name] = {**run["idle"], "wait_fraction": max(0.0, wait) / run["wall_s"]}
    return out


def details(mode: Mode, raw: dict[str, dict[str, Any]], env: dict[str, Any]) -> list[str]:
    """Header, rates per mpp (wall and CPU), the many-shard build, idle time, RSS and the floor's parts."""
    (w, h), rates = mode.size, per_mpp(raw)
    lines = [
        f"bench_build ({mode.name}): {mode.n_slides} slides {w}x{h}, {TISSUE:.0%} tissue, tagged with each "
        f"scanner's mpp -> {PATCH_PX} px at {TARGET_MPP} mpp, default build options (256 MB shards: one shard), "
        f"JPEG q{QUALITY}; {env['cpus']} CPUs, load avg {env['load_before']:.2f} before / "
        f"{env['load_after']:.2f} after",
        "",
        f"{'':<17}{'patches per second':^34}{'per CPU-second (robust to load)':^34}{'others, cores':^15}",
        f"{'mpp':<8}{'patches':>9}"
        + 2 * f"{'jobs 1':>9}{'jobs 2':>9}{'naive':>8}{'floor':>8}"
        + f"{'j1':>5}{'j2':>5}{'nv':>5}   naive: subset, level-0 extent",
        "-" * 120,
    ]
    for mpp, r in rates.items():
        nv, j1, j2 = (raw[f"{k}@{mpp:.4f}"] for k in ("naive", "build_j1", "build_j2"))
        cells = [
            f"{getattr(r[k], a):>{9 if k[0] == 'j' else 8}.1f}"
            for a in ("per_s", "per_cpu_s")
            for k in ("j1", "j2", "naive", "floor")
        ]
        same = "" if nv["extent_as_build"] else " (not the build's!)"
        others = "".join(f"{run['other_load_cores']:>5.2f}" for run in (j1, j2, nv))
        lines.append(
            f"{mpp:<8.4f}{r['j1'].patches:>9}{''.join(cells)}{others}   {nv['patches']} of "
            f"{nv['kept_total']}, {nv['extent']} px{same}"
        )
    m1, m2 = raw["many_j1"], raw["many_j2"]
    figures, fl = idle_figures(raw), raw[f"floor@{MANY_MPP:.4f}"]
    idle, one_shard = figures["many_j2"], {m: figures[f"build_j2@{m:.4f}"] for m in SCANNERS}
    lines += [
        "",
        "others: cores that other processes kept busy during the run (the machine is shared); the "
        "build/naive ratios are on the same cores only when both are near 0",
        "",
        f"many shards at {MANY_MPP:.4f}: jobs 1 {m1['patches'] / m1['wall_s']:.0f} patch/s "
        f"({m1['shards']} shards), jobs 2 {m2['patches'] / m2['wall_s']:.0f} patch/s ({m2['shards']} shards): "
        f"{m1['wall_s'] / m2['wall_s']:.2f}x; others {m1['other_load_cores']:.2f} / "
        f"{m2['other_load_cores']:.2f} cores; jobs 1 decoded {m1['tile_decodes']} tiles at 1/2 "
        f"({m1['tile_decodes'] / max(m1['patches'], 1):.2f} a patch; one shard: "
        f"{raw[f'build_j1@{MANY_MPP:.4f}']['tile_decodes']}; the floor needs {fl['tiles_needed']})",
        f"scan -> extraction (many shards, jobs 2, {mode.n_slides} slides): last slide scanned to first "
        f"segment written {idle['gap_s']:.2f} s = {idle['gap_fraction']:.1%} of the wall time, less that "
        f"segment's own work {idle['wait_fraction']:.1%}; workers without CPU in that gap "
        f"{idle['gap_idle_fraction']:.1%}, in the scan phase {idle['scan_idle_fraction']:.1%}, after it "
        f"{idle['extract_idle_fraction']:.1%}, in all {idle['idle_fraction']:.1%} of workers x wall (target: "
        "overlap the phases if the wait > 10%)",
        "  one-shard jobs 2 builds, gap / less the first segment: "
        + ", ".join(f"{m:.4f} {i['gap_fraction']:.0%} / {i['wait_fraction']:.0%}" for m, i in one_shard.items()),
        f"peak RSS per worker (jobs 2, one slide, {MANY_MPP:.4f}): {mode.small[0]}x{mode.small[1]}: "
        f"{raw['rss_small']['worker_rss_mb']:.0f} MB, {w}x{h}: {raw['rss_big']['worker_rss_mb']:.0f} MB; "
        f"jobs 2 parent: {raw[f'build_j2@{MANY_MPP:.4f}']['root_rss_mb']:.0f} MB; naive child before its "
        f"loop: {raw[f'naive@{MANY_MPP:.4f}']['rss_before_mb']:.0f} MB",
        f"floor parts at {MANY_MPP:.4f}: decode {fl['decode_s']:.2f} s ({fl['tiles_needed']} tiles, "
        f"{1000 * fl['decode_s'] / max(fl['tiles_needed'], 1):.2f} ms/tile), encode {fl['encode_s']:.2f} s "
        f"({1000 * fl['encode_s'] / max(fl['patches'], 1):.2f} ms/patch)",
        "jobs 1 tile decodes at 1/2 scale per patch (tile cache hits; tiles the floor needs per patch): "
        + ", ".join(_tile_line(m, raw) for m in sorted(SCANNERS)),
        *_hs2p_lines(raw),
        "",
    ]
    return lines


def stage_table(raw: dict[str, dict[str, Any]]) -> list[str]:
    """Where each build's CPU went, per stage (every process of the build: :func:`install_stage_timers`), and the
    floor's parts; a Markdown table (the performance page shows it)."""

    names = [*STAGES, "other"]
    lines = [
        "CPU per stage, % of the build's CPU (all its processes, start-up included; exclusive time), ms of CPU "
        "per patch written, and the floor's parts in ms per patch:",
        "",
        "| run | CPU s | ms/patch | " + " | ".join(names) + " | floor decode | floor resample | floor encode |",
        "|" + "---|" * (len(names) + 6),
    ]
    for mpp in SCANNERS:
        fl = raw[f"floor@{mpp:.4f}"]
        floor = [f"{1000 * fl[k] / max(fl['patches'], 1):.2f}" for k in ("decode_s", "resample_s", "encode_s")]
        for jobs in (1, 2):
            st = raw[f"build_j{jobs}@{mpp:.4f}"]["stages"]
            n = max(raw[f"build_j{jobs}@{mpp:.4f}"]["patches"], 1)
            shares = [f"{100 * st['share'][s]:.1f}%" for s in names]
            cells = [
                f"j{jobs} @ {mpp:.4f}",
                f"{st['total_cpu_s']:.2f}",
                f"{1000 * st['total_cpu_s'] / n:.2f}",
                *shares,
                *(floor if jobs == 1 else ["", "", ""]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    one = raw["rss_big"]
    first, called = one["first_write_since_process_start_s"], one["t_first_write"] - one["t_start"]
    lines += [
        "",
        f"one-slide build (jobs 2, {MANY_MPP:.4f}): first segment written {first:.2f} s after its process "
        f"started ({called:.2f} s after build() was called)",
        "",
    ]
    return lines


def _hs2p_lines(raw: dict[str, Any]) -> list[str]:
    runs = {m: raw[f"hs2p@{m:.4f}"] for m in SCANNERS if f"hs2p@{m:.4f}" in raw}
    if not runs:
        return ["hs2p: not run (--hs2p PYTHON names an interpreter that has it)"]
    first = next(iter(runs.values()))
    return [
        f"hs2p {first['hs2p']}, 2 processes (its defaults, Otsu, tiles to tar; its own tissue and grid, so its own "
        "patches): patches, wall s (import before the clock: "
        f"{first['import_s']:.1f} s) per mpp: "
        + ", ".join(f"{m:.4f} {r['patches']} in {r['wall_s']:.1f} s" for m, r in runs.items()),
        f"  call: {first['call']}",
    ]


def _tile_line(mpp: float, raw: dict[str, Any]) -> str:
    b, floor = raw[f"build_j1@{mpp:.4f}"], raw[f"floor@{mpp:.4f}"]
    decodes, hits, patches = b.get("tile_decodes", 0), b.get("tile_hits", 0), max(b["patches"], 1)
    needed = floor["tiles_needed"] / patches
    return f"{mpp:.4f} {decodes / patches:.2f} ({hits / max(hits + decodes, 1):.0%}; {needed:.2f})"


def targets(checks: list[dict[str, Any]]) -> list[str]:
    """One line per target, the mpps side by side (the CPU-second ratio in brackets)."""
    lines = [
        "targets (wall clock; [the same ratio from CPU-seconds]; *: other processes kept more than "
        f"{CONTENDED_CORES} cores busy during a run compared, so the wall-clock ratio is not on equal cores):"
    ]
    for name in dict.fromkeys(c["name"] for c in checks):
        mine = [c for c in checks if c["name"] == name]
        cells = [
            f"{c['mpp']:.4f} {c['value']:.2f}x"
            + (f" [{c['cpu_value']:.2f}]" if c["cpu_value"] else "")
            + f" {'PASS' if c['pass'] else 'MISS'}{'*' if c['contended'] else ''}"
            for c in mine
        ]
        lines.append(f"  {name} {mine[0]['target']}: " + " | ".join(cells))
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller slides and subsets: a few minutes on 2 cores")
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "wsishard-bench",
        help="slides (cached between runs) and build outputs",
    )
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    p.add_argument("--context", action="store_true", help="only the context rows: build cost of 0, 1 and 2 scales")
    p.add_argument("--smoke", action="store_true", help="tiny slides, two mpp, one round, no hs2p; nothing saved")
    p.add_argument(
        "--hs2p",
        metavar="PYTHON",
        default=os.environ.get("WSISHARD_BENCH_HS2P"),
        help="an interpreter with hs2p installed (its own venv: see benchmarks/hs2p_child.py): adds hs2p's row per "
        "mpp, 2 processes against jobs 2 (default: $WSISHARD_BENCH_HS2P; none: no hs2p row)",
    )
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child](json.loads(Path(args.spec).read_text()))))
        return 0
    mode = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.smoke:  # the same runs at two mpp; hs2p needs its own interpreter and venv: never in a smoke run
        global SCANNERS
        SCANNERS, args.hs2p = {m: SCANNERS[m] for m in SMOKE_SCANNERS}, None

    log = (lambda _msg: None) if args.json_only else logger("bench_build")

    if args.context:
        return context_main(mode, args.workdir, log, args.json_only)

    if args.hs2p:  # before the first run, not when its row comes (minutes in)
        _check_hs2p(args.hs2p)
    load_before, t0 = load(), time.perf_counter()
    raw = measure(mode, args.workdir, log, args.hs2p)
    env = {
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": load(),
        "bench_wall_s": time.perf_counter() - t0,
    }
    same = all(raw[f"build_j2@{m:.4f}"]["per_slide"] == raw[f"build_j1@{m:.4f}"]["per_slide"] for m in SCANNERS)
    failed = [f for run in raw.values() for f in run.get("failed", [])]
    if not same or failed:
        log(f"WARNING: jobs 1 and 2 wrote different patches, or slides failed: {failed}")
    checks = verdicts(raw)
    hs2p_runs = [name for name in raw if name.startswith("hs2p@")]
    if not args.json_only:
        pairs = " | ".join(f"{m:.4f} {spread(floor_ratios(raw, m)[2])}" for m in SCANNERS)
        floor_line = [f"  jobs 1 / floor per side-by-side pair (median [range] of {mode.floor_rounds}): {pairs}"]
        print("\n".join(details(mode, raw, env) + stage_table(raw) + gap_table(raw) + mpp_table(raw, checks)))
        print("\n".join(["", *targets(checks)]))
        print("\n".join(floor_line))
    report = {
        "config": {
            **asdict(mode),
            "scanners": {f"{m:.4f}": s for m, s in SCANNERS.items()},
            "slide_mpp": SLIDE_MPP,
            "target_mpp": TARGET_MPP,
            "patch_size_px": PATCH_PX,
            "jpeg_quality": QUALITY,
            "tissue_fraction": TISSUE,
            "seed": SEED,
            **env,
            "same_patches": same,
            "failed": failed,
        },
        "versions": {**versions(), **({"hs2p": raw[hs2p_runs[0]]["hs2p"]} if hs2p_runs else {})},
        "rates": {
            f"{m:.4f}": {
                k: {**asdict(r), "patches_per_s": r.per_s, "patches_per_cpu_s": r.per_cpu_s} for k, r in rs.items()
            }
            for m, rs in per_mpp(raw).items()
        },
        "targets": checks,
        "floor_pairs": {f"{m:.4f}": floor_ratios(raw, m)[2] for m in SCANNERS},
        "floor_gap": {f"{m:.4f}": floor_gap(raw, m) for m in SCANNERS},
        "scan_to_extract": idle_figures(raw),
        "raw": raw,
    }
    print("JSON: " + json.dumps(report, sort_keys=True))
    return 0


# ------------------------------------------------------------------------------------ context patches (--context)

CONTEXT_RUNS = {"none": (), "one 4x": (2.0,), "two (4x, 16x)": (2.0, 8.0)}  # context mpp around 0.5 mpp patches
CONTEXT_TARGET = 1.5  # one 4x context scale costs at most +50% build time


def context_main(mode: Mode, workdir: Path, log: Any, json_only: bool) -> int:
    """Build cost of context patches: default options at Aperio's 0.2520 mpp, ``--jobs 1``, without context, with
    one 4x scale (2.0 mpp) and with two (2.0, 8.0), each run ``repeats`` times interleaved (the least time kept: a
    shared machine only adds). Saved as ``bench_build_context.json``."""
    slides = ensure_slides(workdir / "slides", mode.size, 2 if mode is QUICK else mode.n_slides, log)
    repeats = 1 if mode is SMOKE else 2 if mode is QUICK else 3

    def run(mpps: tuple[float, ...]) -> dict[str, Any]:
        spec = {
            "slides": slides,
            "output": str(workdir / "out-context"),
            "jobs": 1,
            "mpp": MANY_MPP,
            "context_mpp": list(mpps),
        }
        return run_child("build", spec, workdir / "context")

    rounds = interleaved(repeats, {name: partial(run, mpps) for name, mpps in CONTEXT_RUNS.items()}, log)
    raw = {name: [rd[name] for rd in rounds] for name in CONTEXT_RUNS}
    best = {name: {key: min(r[key] for r in runs) for key in ("wall_s", "cpu_s")} for name, runs in raw.items()}
    rows = [
        {
            "context": name,
            "context_mpp": list(CONTEXT_RUNS[name]),
            "patches": raw[name][0]["patches"],
            **best[name],
            "wall_vs_none": best[name]["wall_s"] / best["none"]["wall_s"],
            "cpu_vs_none": best[name]["cpu_s"] / best["none"]["cpu_s"],
        }
        for name in CONTEXT_RUNS
    ]
    one = rows[1]["cpu_vs_none"]
    verdict = {
        "target": f"one 4x context scale / none <= {CONTEXT_TARGET}",
        "cpu_ratio": one,
        "wall_ratio": rows[1]["wall_vs_none"],
        "met": one <= CONTEXT_TARGET,
    }
    if not json_only:
        print(
            f"Context patches: {len(slides)} slides of {mode.size[0]}x{mode.size[1]} px at {MANY_MPP} mpp, default "
            f"options, --jobs 1, least of {repeats} runs ({mode.name} mode)"
        )
        cells = [
            (
                r["context"],
                f"{r['patches']:,}",
                f"{r['wall_s']:.1f}",
                f"{r['cpu_s']:.1f}",
                f"{r['wall_vs_none']:.2f}",
                f"{r['cpu_vs_none']:.2f}",
            )
            for r in rows
        ]
        print(markdown(("context", "patches", "wall s", "CPU s", "wall / none", "CPU / none"), cells, align="lrrrrr"))
        print(f"\n{verdict['target']}: {one:.2f} by CPU time ({'met' if verdict['met'] else 'NOT met'})")
    config = {
        "mode": mode.name,
        "size": mode.size,
        "slides": len(slides),
        "mpp": MANY_MPP,
        "jobs": 1,
        "repeats": repeats,
        "load_after": load(),
    }
    print(
        "JSON: "
        + json.dumps(
            {"config": config, "versions": versions(), "rows": rows, "target": verdict, "raw": raw}, sort_keys=True
        )
    )
    shutil.rmtree(workdir / "out-context", ignore_errors=True)
    return 0


if __name__ == "__main__":
    import benchkit

    name = "bench_build_context" if "--context" in sys.argv else "bench_build"
    sys.exit(benchkit.run(name, main, script="bench_build"))
