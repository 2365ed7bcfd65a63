#!/usr/bin/env python
"""Benchmark ``wsishard build`` against the naive per-patch OpenSlide loop and the tile-decode floor.

Example::

    python scripts/bench_build.py --quick
    python scripts/bench_build.py --workdir /data/bench --json-only

The baselines process exactly the samples ``build --jobs 1`` wrote (read back from its shards). Each method
runs in its own child process, whose tree is polled with psutil every 50 ms for peak RSS and CPU time (pool
workers are grandchildren under forkserver). Synthetic 40x slides are cached in ``--workdir``. Prints a table,
then one line ``JSON: {...}``. Verdicts use wall time; on a shared machine the CPU-second ratios say more.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
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
from pathlib import Path
from typing import Any

import numpy as np
import psutil

MB = 1024**2
SLIDE_MPP = 0.25  # level-0 microns per px of the generated slides (40x)
TARGET_MPP = 0.5
PATCH_PX = 256
QUALITY = 90
SEED = 0


@dataclass(frozen=True, kw_only=True)
class Mode:
    """Workload of one benchmark mode. Sizes are level-0 (width, height) px."""

    name: str
    size: tuple[int, int]  # the main slides (builds, naive, floor, small side of the RSS comparison)
    n_slides: int
    big: tuple[int, int]  # the large slide of the RSS comparison
    naive_max: int  # patches timed in the naive loop (a seeded random subset when there are more)
    shard_size_bytes: int  # scaled to the small synthetic slides so that 2 jobs have many shards to share


QUICK = Mode(name="quick", size=(8192, 8192), n_slides=4, big=(16384, 8192), naive_max=1500,
             shard_size_bytes=512 * 1024)  # fmt: skip
FULL = Mode(name="full", size=(20480, 20480), n_slides=4, big=(40960, 20480), naive_max=1500,
            shard_size_bytes=3 * MB)  # fmt: skip


# ---------------------------------------------------------------------------------------------- child side


def shard_patches(output: str, slides: list[str]) -> list[tuple[int, int, int, int]]:
    """(slide index, level-0 x, y, extent) of every sample the build wrote, read from its shards' ``.json``."""
    index = {os.path.basename(p): k for k, p in enumerate(slides)}
    found = []
    for name in sorted(os.listdir(output)):
        if not name.endswith(".tar"):
            continue
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
    from wsishard.builder.grid import PatchOptions
    from wsishard.builder.options import BuildOptions
    from wsishard.builder.run import build

    options = BuildOptions(patch=PatchOptions(target_mpp=TARGET_MPP, patch_size_px=PATCH_PX), jobs=spec["jobs"],
                           qc=False, shard_size_bytes=spec["shard_size_bytes"], seed=SEED, fast_path=True,
                           quality=QUALITY)  # fmt: skip
    shutil.rmtree(spec["output"], ignore_errors=True)  # a build into an existing output would resume it
    rss0 = _rss_mb()
    cpu0, t0 = time.process_time(), time.perf_counter()
    manifest = build(spec["slides"], spec["output"], options)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    failed = [f"{s.file}: {s.reason}" for s in manifest.failed_slides]
    per_slide = {os.path.basename(s.file): s.patches for s in manifest.slides}
    return {"patches": manifest.total_samples, "wall_s": wall, "cpu_s": cpu, "shards": len(manifest.shards),
            "per_slide": per_slide, "failed": failed, "rss_before_mb": rss0}  # fmt: skip


def child_naive(spec: dict[str, Any]) -> dict[str, Any]:
    """CLAM/Trident style: per kept patch, read_region at level 0 -> RGB -> PIL resize -> JPEG.

    The resize is Pillow's default filter (bicubic, antialiased when shrinking), as CLAM's ``img.resize``.
    """
    import openslide
    from PIL import Image

    todo = [tuple(p) for p in spec["patches"]]
    total = len(todo)
    if total > spec["max_patches"]:  # seeded subset, kept in grid order (as a CLAM loop walks it)
        pick = np.sort(np.random.default_rng((SEED, 0xBE7C)).choice(total, spec["max_patches"], replace=False))
        todo = [todo[i] for i in pick.tolist()]
    slides = [openslide.OpenSlide(p) for p in spec["slides"]]
    rss0, nbytes = _rss_mb(), 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    for k, x, y, extent in todo:
        image = slides[k].read_region((x, y), 0, (extent, extent)).convert("RGB")
        image = image.resize((PATCH_PX, PATCH_PX), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=QUALITY)
        nbytes += buf.tell()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"patches": len(todo), "kept_total": total, "wall_s": wall, "cpu_s": cpu,
            "mean_bytes": nbytes / max(len(todo), 1), "rss_before_mb": rss0}  # fmt: skip


def _tiles(x0: int, y0: int, w: int, h: int, page: Any) -> list[int]:
    """Indices of the level-0 tiles covering a level-0 rectangle (clipped to the image)."""
    tw, th = page.tilewidth, page.tilelength
    across = -(-page.imagewidth // tw)
    x1, y1 = min(x0 + w, page.imagewidth) - 1, min(y0 + h, page.imagelength) - 1
    return [ty * across + tx for ty in range(max(y0, 0) // th, y1 // th + 1)
            for tx in range(max(x0, 0) // tw, x1 // tw + 1)]  # fmt: skip


def _block_rects(patches: list[tuple[int, int, int, int]], block: int) -> list[tuple[int, int, int, int]]:
    """Level-0 bounding boxes of the kept cells of each ``block`` x ``block`` group of grid cells."""
    cells: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for _, x, y, extent in patches:
        col, row = x // extent, y // extent
        cells.setdefault((row // block, col // block), []).append((col, row))
    ext = patches[0][3] if patches else 0
    rects = []
    for members in cells.values():
        cols, rows = [c for c, _ in members], [r for _, r in members]
        rects.append((min(cols) * ext, min(rows) * ext, (max(cols) - min(cols) + 1) * ext,
                      (max(rows) - min(rows) + 1) * ext))  # fmt: skip
    return rects


def child_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """Decode each needed level-0 tile once (tifffile + imagecodecs), encode each patch once; timed alone."""
    import tifffile
    from PIL import Image

    from wsishard.builder.grid import PatchOptions
    from wsishard.slide import open_slide

    t = {"decode_s": 0.0, "shrink_s": 0.0, "encode_s": 0.0, "cpu_s": 0.0}  # cpu_s: of decode + encode
    tiles_needed = tiles_build = 0
    rss0, cpu0 = _rss_mb(), time.process_time()
    for k, path in enumerate(spec["slides"]):
        mine = [tuple(p) for p in spec["patches"] if p[0] == k]
        with tifffile.TiffFile(path) as tif:
            page: Any = tif.pages[0]  # Aperio svs: level 0 is the first page, tiled JPEG
            needed = sorted({i for _, x, y, e in mine for i in _tiles(x, y, e, e, page)})
            fh, c0, t0 = tif.filehandle, time.process_time(), time.perf_counter()
            for i in needed:
                fh.seek(page.dataoffsets[i])
                data = fh.read(page.databytecounts[i])
                page.decode(data, i, jpegtables=page.jpegtables, jpegheader=page.jpegheader)
            t["decode_s"] += time.perf_counter() - t0
            t["cpu_s"] += time.process_time() - c0
            tiles_needed += len(needed)
            rects = _block_rects(mine, PatchOptions().block_patches)
            tiles_build += sum(len(_tiles(*r, page)) for r in rects)
        reader = open_slide(path, fast=True)
        for _, x, y, extent in mine:
            crop = Image.fromarray(reader.read_level(0, x, y, extent, extent))  # untimed: decoding is timed above
            t0 = time.perf_counter()
            factor = extent // PATCH_PX
            small = crop.reduce(factor) if factor * PATCH_PX == extent else crop.resize((PATCH_PX, PATCH_PX))
            c1, t1 = time.process_time(), time.perf_counter()
            buf = io.BytesIO()
            small.save(buf, "JPEG", quality=QUALITY)
            t["encode_s"] += time.perf_counter() - t1
            t["cpu_s"] += time.process_time() - c1
            t["shrink_s"] += t1 - t0
        reader.close()
    return {"patches": len(spec["patches"]), "wall_s": t["decode_s"] + t["encode_s"], **t,
            "tiles_needed": tiles_needed, "tiles_build_decodes": tiles_build,
            "cpu_s_whole_child": time.process_time() - cpu0, "rss_before_mb": rss0}  # fmt: skip


CHILDREN = {"build": child_build, "naive": child_naive, "floor": child_floor}


# --------------------------------------------------------------------------------------------- parent side


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


class TreeWatcher(threading.Thread):
    """Polls a process and its descendants every ``interval_s``: peak RSS and last CPU time per pid."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.peak_rss: dict[int, int] = {}
        self.cpu_s: dict[int, float] = {}
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
                self.peak_rss[proc.pid] = max(self.peak_rss.get(proc.pid, 0), rss)
                self.cpu_s[proc.pid] = cpu.user + cpu.system
                self.parent[proc.pid] = ppid
            self._stop_event.wait(self.interval_s)

    def stop(self) -> dict[str, Any]:
        self._stop_event.set()
        self.join()
        # pool workers are the leaves below the root (root -> worker when forked directly, root -> forkserver ->
        # worker otherwise; multiprocessing's resource tracker is a leaf too but is left out); no pool: the root
        parents = set(self.parent.values())
        workers = [p for p in self.parent if p != self.pid and p not in parents and p not in self.helpers]
        workers = workers or [self.pid]
        return {"workers": len(workers), "worker_rss_mb": max(self.peak_rss.get(p, 0) for p in workers) / MB,
                "root_rss_mb": self.peak_rss.get(self.pid, 0) / MB,
                "workers_cpu_s": sum(self.cpu_s.get(p, 0.0) for p in workers)}  # fmt: skip


def run_child(method: str, spec: dict[str, Any], stem: Path) -> dict[str, Any]:
    """Run one method in a child process (spec in ``stem``.json), polling its process tree."""
    spec_path = stem.with_suffix(".json")
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--spec", str(spec_path)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    watcher = TreeWatcher(proc.pid)
    watcher.start()
    out, _ = proc.communicate()
    polled = watcher.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{method} child failed (exit {proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, **polled, "process_wall_s": time.perf_counter() - t0}


def ensure_slides(folder: Path, size: tuple[int, int], n: int, log: Any) -> list[str]:
    """``n`` cached synthetic svs slides of ``size`` (generated once, atomically)."""
    from wsishard.testing.synthetic import make_slide

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in range(n):
        path = folder / f"synth-{size[0]}x{size[1]}-s{seed}.svs"
        if not path.exists():
            log(f"generating {path.name} ...")
            tmp = folder / f".tmp-{os.getpid()}-{path.name}"
            make_slide(tmp, width=size[0], height=size[1], mpp=SLIDE_MPP, seed=seed, tissue_fraction=0.3)
            os.replace(tmp, path)
        paths.append(str(path))
    return paths


def versions() -> dict[str, str]:
    import imagecodecs
    import openslide
    import PIL
    import tifffile

    import wsishard

    return {"wsishard": wsishard.__version__, "openslide_python": openslide.__version__,
            "openslide": openslide.__library_version__, "tifffile": tifffile.__version__,
            "imagecodecs": imagecodecs.__version__, "pillow": PIL.__version__, "numpy": np.__version__,
            "psutil": psutil.__version__, "python": platform.python_version()}  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One method's figures; ``cores`` is the number of processes doing the work."""

    method: str
    patches: int
    wall_s: float
    cores: int
    cpu_s: float
    rss_mb: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.patches / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rate_per_core(self) -> float:
        return self.rate / self.cores

    @property
    def rate_per_cpu_s(self) -> float:  # robust to other load on a shared machine
        return self.patches / self.cpu_s if self.cpu_s > 0 else 0.0


def measure(mode: Mode, workdir: Path, log: Any) -> dict[str, Any]:
    slides = ensure_slides(workdir / "slides", mode.size, mode.n_slides, log)
    big = ensure_slides(workdir / "slides", mode.big, 1, log)[0]
    spec: dict[str, Any] = {"slides": slides, "shard_size_bytes": mode.shard_size_bytes}
    raw: dict[str, dict[str, Any]] = {}
    runs: list[tuple[str, str, dict[str, Any]]] = [
        ("build_j1", "build", {"jobs": 1}), ("build_j2", "build", {"jobs": 2}),
        ("naive", "naive", {"max_patches": mode.naive_max}), ("floor", "floor", {}),
        ("rss_small_j2", "build", {"jobs": 2, "slides": slides[:1]}),
        ("rss_big_j2", "build", {"jobs": 2, "slides": [big]}),
    ]  # fmt: skip
    for name, method, extra in runs:
        if name == "naive":  # the baselines process exactly the samples the build wrote
            spec["patches"] = shard_patches(str(workdir / "out-build_j1"), slides)
        log(f"running {name} ...")
        raw[name] = run_child(method, {**spec, "output": str(workdir / f"out-{name}"), **extra}, workdir / name)
    return raw


def rows_from(raw: dict[str, dict[str, Any]]) -> list[Row]:
    j1, j2, nv, fl = raw["build_j1"], raw["build_j2"], raw["naive"], raw["floor"]
    sub = "" if nv["patches"] == nv["kept_total"] else f"seeded subset {nv['patches']} of {nv['kept_total']}"
    return [
        Row("wsishard build --jobs 1", j1["patches"], j1["wall_s"], 1, j1["cpu_s"], j1["worker_rss_mb"],
            f"{j1['shards']} shards, incl. scan"),
        Row("wsishard build --jobs 2", j2["patches"], j2["wall_s"], 2, j2["workers_cpu_s"], j2["worker_rss_mb"],
            f"{j2['shards']} shards, incl. scan + pool start; RSS per worker"),
        Row("naive OpenSlide loop", nv["patches"], nv["wall_s"], 1, nv["cpu_s"], nv["root_rss_mb"],
            f"read_region+RGB+bicubic+JPEG {sub}"),
        Row("floor: decode + encode", fl["patches"], fl["wall_s"], 1, fl["cpu_s"],
            fl["root_rss_mb"], f"{fl['tiles_needed']} tiles once; timed parts only"),
    ]  # fmt: skip


def verdicts(raw: dict[str, dict[str, Any]], rows: list[Row]) -> list[dict[str, Any]]:
    j1, j2, naive, floor = rows
    small, big = raw["rss_small_j2"]["worker_rss_mb"], raw["rss_big_j2"]["worker_rss_mb"]
    items = [  # name, wall-clock value (the verdict), the same ratio from CPU seconds (information only)
        ("build -j1 / naive (1 core each)", j1.rate / naive.rate, j1.rate_per_cpu_s / naive.rate_per_cpu_s,
         ">=", 3.0),
        ("build -j2 per core / naive", j2.rate_per_core / naive.rate, j2.rate_per_cpu_s / naive.rate_per_cpu_s,
         ">=", 3.0),
        ("floor / build -j1 (distance to floor)", floor.rate / j1.rate, floor.rate_per_cpu_s / j1.rate_per_cpu_s,
         "<=", 1.6),
        ("build -j2 / build -j1", j2.rate / j1.rate, 2 * j2.rate_per_cpu_s / j1.rate_per_cpu_s, ">=", 1.7),
        ("peak RSS per worker, big / small slide", big / small, None, "<=", 1.3),
    ]  # fmt: skip
    return [{"name": n, "value": v, "cpu_value": c, "target": f"{op} {t:g}x", "pass": v >= t if op == ">=" else v <= t}
            for n, v, c, op, t in items]  # fmt: skip


def table(mode: Mode, raw: dict[str, dict[str, Any]], rows: list[Row], checks: list[dict[str, Any]],
          env: dict[str, Any]) -> str:  # fmt: skip
    w, h = mode.size
    lines = [f"bench_build ({mode.name}): {mode.n_slides} slides {w}x{h} at {SLIDE_MPP} mpp -> {PATCH_PX} px "
             f"patches at {TARGET_MPP} mpp, JPEG q{QUALITY}; {env['cpus']} CPUs, load avg {env['load_before']:.2f}"
             f" before / {env['load_after']:.2f} after (shared machine: other work competes for the cores)",
             "",
             f"{'method':<26}{'patches':>8}{'wall s':>8}{'patch/s':>9}{'/core':>8}{'/cpu-s':>8}{'cpu%':>6}"
             f"{'RSS MB':>8}  note", "-" * 118]  # fmt: skip
    for r in rows:
        cpu_pct = 100 * r.cpu_s / (r.wall_s * r.cores) if r.wall_s else 0
        lines.append(f"{r.method:<26}{r.patches:>8}{r.wall_s:>8.2f}{r.rate:>9.1f}{r.rate_per_core:>8.1f}"
                     f"{r.rate_per_cpu_s:>8.1f}{cpu_pct:>6.0f}{r.rss_mb:>8.0f}  {r.note}")  # fmt: skip
    fl = raw["floor"]
    lines += [f"{'hs2p tiling + tar':<26}{'-':>8}  {env['hs2p']}",
              "/cpu-s: patches per CPU-second of the working processes; cpu%: CPU-s / (wall s x cores): well below "
              "100 means the work waited for a core.", "",
              f"floor parts: decode {fl['decode_s']:.2f} s ({fl['tiles_needed']} tiles, "
              f"{1000 * fl['decode_s'] / max(fl['tiles_needed'], 1):.2f} ms/tile), encode {fl['encode_s']:.2f} s "
              f"({1000 * fl['encode_s'] / max(fl['patches'], 1):.2f} ms/patch); not in the floor: 2x reduce "
              f"{fl['shrink_s']:.2f} s. Tiles the build's block rectangles cover: {fl['tiles_build_decodes']} "
              f"({fl['tiles_build_decodes'] / max(fl['tiles_needed'], 1):.2f}x the needed ones)",
              f"peak RSS per worker (--jobs 2, one slide): {w}x{h}: {raw['rss_small_j2']['worker_rss_mb']:.0f} MB, "
              f"{mode.big[0]}x{mode.big[1]}: {raw['rss_big_j2']['worker_rss_mb']:.0f} MB; build -j2 parent: "
              f"{raw['build_j2']['root_rss_mb']:.0f} MB; naive child before its loop: "
              f"{raw['naive']['rss_before_mb']:.0f} MB", "", "targets:"]  # fmt: skip
    for c in checks:
        by_cpu = f"   (same ratio from CPU-seconds: {c['cpu_value']:.2f}x)" if c["cpu_value"] is not None else ""
        lines.append(f"  {c['name']:<42}{c['value']:>7.2f}x  target {c['target']:<7} "
                     f"{'PASS' if c['pass'] else 'MISS'}{by_cpu}")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small slides, well under 2 minutes")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "wsishard-bench",
                   help="slides (cached between runs) and build outputs")  # fmt: skip
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child](json.loads(Path(args.spec).read_text()))))
        return 0
    mode = QUICK if args.quick else FULL

    def log(msg: str) -> None:
        if not args.json_only:
            print(f"[bench] {msg}", file=sys.stderr, flush=True)

    load_before = os.getloadavg()[0]
    raw = measure(mode, args.workdir, log)
    hs2p = "installed, not benchmarked by this script" if importlib.util.find_spec("hs2p") else "not installed"
    env = {"cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()[0], "hs2p": hs2p}
    rows = rows_from(raw)
    same = raw["build_j2"]["per_slide"] == raw["build_j1"]["per_slide"] and all(
        raw[k]["patches"] == raw["build_j1"]["patches"] for k in ("build_j2", "floor")
    )
    if not same:
        log("WARNING: the methods did not process the same patches")
    checks = verdicts(raw, rows)
    if not args.json_only:
        print(table(mode, raw, rows, checks, env))
    report = {
        "config": {"mode": mode.name, **asdict(mode), "slide_mpp": SLIDE_MPP, "target_mpp": TARGET_MPP,
                   "patch_size_px": PATCH_PX, "jpeg_quality": QUALITY, "seed": SEED, **env,
                   "same_patches": same},
        "versions": versions(),
        "methods": {r.method: {**asdict(r), "patches_per_s": r.rate, "patches_per_s_per_core": r.rate_per_core,
                               "patches_per_cpu_s": r.rate_per_cpu_s} for r in rows},
        "targets": checks,
        "raw": raw,
    }  # fmt: skip
    print("JSON: " + json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
