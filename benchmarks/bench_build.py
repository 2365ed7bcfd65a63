#!/usr/bin/env python
"""Benchmark ``wsishard build`` with default options at real scanners' resolutions against the naive loop and the floor.

    python benchmarks/bench_build.py --quick
    python benchmarks/bench_build.py --hs2p /tmp/hs2p-venv/bin/python   # adds hs2p's row per mpp
    python benchmarks/bench_build.py --quick --context                   # only: context patches' build cost
    python benchmarks/bench_build.py --smoke                             # seconds, two mpp, nothing saved (CI)

Per scanner mpp: ``build`` with default options at ``--jobs 1`` and ``--jobs 2``, the naive CLAM/Trident-style loop,
the floor and (``--hs2p``) hs2p, each in a child process; ``--jobs 1`` and the floor again in more side-by-side
pairs. Where the build's CPU goes per stage, by timers wrapped around its stage functions. What each figure means is
on the docs' performance page. Slides are cached in ``--workdir``.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import shutil
import sys
import tarfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import benchkit as bk
import numpy as np

SCANNERS = {0.25: "exact 2x", 0.2520: "Aperio AT2", 0.2631: "GT450", 0.2265: "NanoZoomer", 0.2425: "3DHistech"}
REF_MPP, AT2 = 0.25, 0.2520  # the exact 2x reference; the most common scanner (the context rows)
TARGET_MPP, PATCH_PX, QUALITY, TISSUE = 0.5, 256, 90, 0.2  # the build's defaults, and the naive loop's
CONTENDED_CORES = 0.25  # a run during which other processes kept more cores busy is marked '*'
HS2P_CHILD = Path(__file__).with_name("hs2p_child.py")  # run by --hs2p's interpreter
MODES = {  # slide size (level-0 px), slides, patches timed in the naive loop, side-by-side (jobs 1, floor) pairs
    "smoke": {"size": (4096, 4096), "n_slides": 2, "naive_max": 8, "floor_rounds": 1},
    "quick": {"size": (16384, 12288), "n_slides": 6, "naive_max": 200, "floor_rounds": 3},
    "full": {"size": (40960, 30720), "n_slides": 4, "naive_max": 600, "floor_rounds": 3},
}
log = bk.logger("bench_build")

# ------------------------------------------------------------------ where a build's CPU goes, per process and stage
# Timers wrapped around the build's own functions in the build child before build() forks its workers (which inherit
# them); each process writes its figures to <folder>/<pid>.json after each unit of work (a slide scanned, a segment
# extracted). Time is exclusive (a stage called from another counts for the innermost one only), CPU of the thread.

STAGES = ("scan", "qc", "decode", "resample", "scores", "encode", "write")
_WRAPPED = [  # (module, attribute (Class.method allowed), stage; None: a unit of work, after which figures are written)
    ("scan.scan", "scan_slide", "scan"),
    ("scan.scan", "_write_qc", "qc"),
    ("extract.patches", "reduced_read", "decode"),
    ("extract.context", "reduced_read", "decode"),
    ("extract.resample", "Reduced.cut", "resample"),
    ("extract.patches", "quality_scores", "scores"),
    ("extract.patches", "encode_image", "encode"),
    ("extract.context", "encode_image", "encode"),
    ("extract.extract", "sample_records", "write"),
    ("extract.extract", "ShardWriter.append", "write"),
    ("extract.extract", "ShardWriter.commit", "write"),
    ("extract.extract", "extract_segment", None),
]


class _Timer:
    def __init__(self, folder: Path) -> None:
        self.folder, self.stack = folder, []  # per open call: the CPU time its inner stages took
        self.cpu_s: dict[str, float] = dict.fromkeys(STAGES, 0.0)

    def wrap(self, fn: Any, stage: str | None) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(0.0)
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent, inner = time.thread_time() - t0, self.stack.pop()
                if stage is not None:
                    self.cpu_s[stage] += spent - inner
                if self.stack:
                    self.stack[-1] += spent if stage is not None else inner
                if stage in (None, "scan"):
                    self.dump()

        return timed

    def dump(self) -> None:
        tmp = self.folder / f".{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"cpu_s": time.process_time(), "stages_cpu_s": self.cpu_s}))
        os.replace(tmp, self.folder / f"{os.getpid()}.json")


def install_stage_timers(folder: Path) -> _Timer:
    """Wrap the build's stage functions; every process of the build then reports into ``folder``."""
    import importlib

    import wsishard.builder.run.orchestrate as run  # it calls scan_slide and extract_segment by names of its own

    folder.mkdir(parents=True, exist_ok=True)
    timer = _Timer(folder)
    for module_name, attr, stage in _WRAPPED:
        module = importlib.import_module(f"wsishard.builder.{module_name}")
        owner, name = (getattr(module, attr.split(".")[0]), attr.split(".")[1]) if "." in attr else (module, attr)
        setattr(owner, name, timer.wrap(getattr(owner, name), stage))
        if name in ("scan_slide", "extract_segment"):
            setattr(run, name, getattr(owner, name))
    return timer


def collect_stage_times(folder: Path) -> dict[str, Any]:
    """Every process's figures summed: CPU seconds per stage (``other``: the rest) and their shares."""
    procs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    total = sum(p["cpu_s"] for p in procs)
    stages = {s: sum(p["stages_cpu_s"][s] for p in procs) for s in STAGES}
    stages["other"] = max(0.0, total - sum(stages.values()))
    return {"cpu_s": stages, "total_cpu_s": total, "share": {s: v / total if total else 0.0 for s, v in stages.items()}}


# -------------------------------------------------------------------------------------------------- the children


def shard_patches(output: str, slides: list[str]) -> list[tuple[int, int, int, int]]:
    """(slide index, level-0 x, y, extent) of every sample the build wrote, in slide then grid (row-major) order."""
    index, found = {os.path.basename(p): k for k, p in enumerate(slides)}, []
    for name in sorted(n for n in os.listdir(output) if n.endswith(".tar")):
        with tarfile.open(os.path.join(output, name)) as tar:
            for member in (m for m in tar if m.name.endswith(".json")):
                meta = json.load(tar.extractfile(member))  # type: ignore[arg-type]
                found.append((index[meta["file"]], meta["x"], meta["y"], meta["extent"]))
    return sorted(found, key=lambda p: (p[0], p[2], p[1]))


def child_build(spec: dict[str, Any]) -> dict[str, Any]:
    """``build`` with default options but ``jobs``, the mpp tag and ``context_mpp``, its stages timed."""
    from wsishard import build
    from wsishard.builder.options.buildopts import BuildOptions

    stages_dir = Path(spec["output"] + ".stages")
    shutil.rmtree(stages_dir, ignore_errors=True)
    timer = install_stage_timers(stages_dir)  # before build(): its forked workers inherit the timers
    overrides = {os.path.basename(p): spec["mpp"] for p in spec["slides"]}
    shutil.rmtree(spec["output"], ignore_errors=True)  # a build into an existing output would resume it
    cpu0, t0 = time.process_time(), time.perf_counter()
    opts = BuildOptions(jobs=spec["jobs"], mpp_overrides=overrides, context_mpp=tuple(spec.get("context_mpp", ())))
    manifest = build(spec["slides"], spec["output"], opts)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    timer.dump()
    stages = collect_stage_times(stages_dir)
    shutil.rmtree(stages_dir, ignore_errors=True)
    return {
        "patches": manifest.total_samples,
        "wall_s": wall,
        "cpu_s": cpu if spec["jobs"] == 1 else stages["total_cpu_s"] - cpu0,  # jobs 2: every process, less start-up
        "per_slide": {os.path.basename(s.file): s.patches for s in manifest.slides},
        "failed": [f"{s.file}: {s.reason}" for s in manifest.failed_slides],
        "stages": stages,
    }


def child_naive(spec: dict[str, Any]) -> dict[str, Any]:
    """CLAM/Trident style, per kept patch: read_region of the level-0 extent -> RGB -> PIL default resize -> JPEG."""
    import openslide

    extent, todo = round(PATCH_PX * TARGET_MPP / spec["mpp"]), [tuple(p) for p in spec["patches"]]
    if len(todo) > spec["max_patches"]:  # a seeded subset, kept in grid order (as a CLAM loop walks it)
        pick = np.sort(np.random.default_rng((0, 0xBE7C)).choice(len(todo), spec["max_patches"], replace=False))
        todo = [todo[i] for i in pick.tolist()]
    slides = [openslide.OpenSlide(p) for p in spec["slides"]]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for k, x, y, _ in todo:
        image = slides[k].read_region((x, y), 0, (extent, extent)).convert("RGB")
        image.resize((PATCH_PX, PATCH_PX)).save(io.BytesIO(), "JPEG", quality=QUALITY)  # Pillow's default filter
    return {"patches": len(todo), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}


def _tiles(x0: int, y0: int, w: int, h: int, page: Any) -> list[int]:
    """Indices of the level-0 tiles covering a level-0 rectangle (clipped to the image)."""
    tw, th, across = page.tilewidth, page.tilelength, -(-page.imagewidth // page.tilewidth)
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


def child_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """Each needed level-0 tile decoded once at 1/k (the build's stage 1, by Pillow's decoder driven directly), each
    patch resampled once by bicubic at the rest of the scale (stage 2), each encoded once by the build's encoder; only
    those steps timed (CPU)."""
    import types

    import cv2
    import tifffile

    from wsishard.builder.extract.resample import encode_image
    from wsishard.slide.tiff import _jpeg_scaled

    cv2.setNumThreads(1)  # one core, as a build worker
    scale = TARGET_MPP / spec["mpp"]  # level-0 px per output px
    k = max(1, int(scale * 1.06 + 1e-9))
    rest, t = scale / k, dict.fromkeys(("decode_s", "resample_s", "encode_s"), 0.0)
    for n, path in enumerate(spec["slides"]):
        with tifffile.TiffFile(path) as tif:
            page: Any = tif.pages[0]  # Aperio svs: level 0 is the first page, tiled JPEG
            small = types.SimpleNamespace(
                **{a: getattr(page, a) // k for a in ("tilewidth", "tilelength", "imagewidth", "imagelength")}
            )
            tiles: dict[int, np.ndarray] = {}  # decoded at 1/k; dropped once every later patch is below
            across, side = -(-page.imagewidth // page.tilewidth), math.ceil(PATCH_PX * rest) + 3  # as the build reads
            for _, x, y, _ in (p for p in spec["patches"] if p[0] == n):  # in (y, x) order
                for i in (i for i in _tiles(x, y, side * k, side * k, page) if i not in tiles):
                    tif.filehandle.seek(page.dataoffsets[i])
                    data = tif.filehandle.read(page.databytecounts[i])
                    data = page.jpegtables[:-2] + data[2:] if page.jpegtables else data  # the shared tables spliced in
                    c0 = time.process_time()
                    tiles[i] = _jpeg_scaled(
                        data, small.tilewidth, small.tilelength, k, page.photometric == 2 and not page.is_jfif
                    )
                    t["decode_s"] += time.process_time() - c0
                crop = _patch_pixels(tiles, small, x // k, y // k, side)  # untimed: a copy
                c0 = time.process_time()
                if abs(rest - 1.0) > 1e-9:
                    crop = cv2.resize(crop, None, fx=1 / rest, fy=1 / rest, interpolation=cv2.INTER_CUBIC)
                c1 = time.process_time()
                encode_image(crop[:PATCH_PX, :PATCH_PX], "jpg", QUALITY)
                t["resample_s"], t["encode_s"] = t["resample_s"] + c1 - c0, t["encode_s"] + time.process_time() - c1
                tiles = {i: v for i, v in tiles.items() if i // across >= y // page.tilelength}
    cpu = sum(t.values())
    return {"patches": len(spec["patches"]), "wall_s": cpu, "cpu_s": cpu, **t}


CHILDREN = {"build": child_build, "naive": child_naive, "floor": child_floor}


# --------------------------------------------------------------------------------------------- parent side


def run_child(method: str, spec: dict[str, Any], python: str | None = None) -> dict[str, Any] | None:
    """One run in a child process (hs2p's under ``python``); its figures and ``other_load_cores`` (the cores other
    processes kept busy meanwhile). A failed hs2p run is None (logged): the benchmark goes on without its row."""
    if method == "hs2p":
        shutil.rmtree(spec["output"], ignore_errors=True)
        args = ["--mpp", str(spec["mpp"]), "--out", spec["output"], "--workers", "2", *spec["slides"]]
        cmd = [python or "", str(HS2P_CHILD), *args]
    else:
        spec_path = Path(spec["output"] + ".spec.json")
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--spec", str(spec_path)]
    done = bk.run_tree(cmd)
    found = [line.removeprefix("JSON: ") for line in done["stdout"].splitlines() if line.startswith(("{", "JSON: "))]
    if done["returncode"] or not found:
        if method == "hs2p":
            log(f"WARNING: hs2p failed at {spec['mpp']:.4f} (exit {done['returncode']}): {done['stdout'][-300:]!r}")
            return None
        raise SystemExit(f"{method} child failed (exit {done['returncode']})")
    result = json.loads(found[-1])
    others = (done["busy_s"] - max(done["tree_cpu_s"], result["cpu_s"])) / done["wall_s"]
    return {**result, "other_load_cores": max(0.0, others)}


def ensure_slides(folder: Path, size: tuple[int, int], n: int) -> list[str]:
    """``n`` cached synthetic svs slides of ``size`` at 0.25 mpp (generated once, atomically)."""
    from wsishard.testing.synthetic import make_slide

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in range(n):
        path = folder / f"synth-{size[0]}x{size[1]}-t{TISSUE:g}-s{seed}.svs"
        if not path.exists():
            log(f"generating {path.name} ...")
            tmp = folder / f".tmp-{os.getpid()}-{path.name}"
            make_slide(tmp, width=size[0], height=size[1], mpp=0.25, seed=seed, tissue_fraction=TISSUE)
            os.replace(tmp, path)
        paths.append(str(path))
    return paths


def measure(mode: dict[str, Any], workdir: Path, hs2p: str | None) -> dict[str, dict[str, Any]]:
    """Every run, keyed ``j1@0.2520``, ``j2@0.2520``, ``naive@0.2520``, ``floor@0.2520``, ``hs2p@0.2520`` (with
    ``hs2p``), and the further side-by-side pairs ``j1@0.2520#1``, ``floor@0.2520#1``, ..."""
    slides, raw, patches = ensure_slides(workdir / "slides", mode["size"], mode["n_slides"]), {}, {}

    def run(name: str, method: str, spec: dict[str, Any]) -> None:
        log(f"running {name} ...")
        spec = {"slides": slides, "output": str(workdir / f"out-{name}"), **spec}
        if (found := run_child(method, spec, hs2p)) is not None:
            raw[name] = found
        if name.startswith("j1@") and "#" not in name:  # the baselines process exactly what the build wrote
            patches[spec["mpp"]] = shard_patches(spec["output"], slides)
        shutil.rmtree(spec["output"], ignore_errors=True)

    for r in range(mode["floor_rounds"]):  # more side-by-side pairs: the machine's speed drifts by 10-20%
        for mpp in SCANNERS:
            tag = f"@{mpp:.4f}" + (f"#{r}" if r else "")
            run(f"j1{tag}", "build", {"jobs": 1, "mpp": mpp})
            if r == 0:
                run(f"j2{tag}", "build", {"jobs": 2, "mpp": mpp})
                if hs2p:
                    run(f"hs2p{tag}", "hs2p", {"mpp": mpp})
                run(f"naive{tag}", "naive", {"mpp": mpp, "patches": patches[mpp], "max_patches": mode["naive_max"]})
            run(f"floor{tag}", "floor", {"mpp": mpp, "patches": patches[mpp]})
    return raw


def rates(raw: dict[str, dict[str, Any]], mpp: float) -> dict[str, dict[str, float]]:
    """Per run kind at ``mpp`` (``j1``, ``j2``, ``naive``, ``floor``, ``hs2p`` where it ran): patches, seconds,
    patches per second and per CPU second (less sensitive to other load)."""
    out = {}
    for k in ("j1", "j2", "naive", "floor", "hs2p"):
        if (run := raw.get(f"{k}@{mpp:.4f}")) is not None:
            n, wall, cpu = run["patches"], run["wall_s"], run["cpu_s"]
            out[k] = {
                "patches": n,
                "wall_s": wall,
                "cpu_s": cpu,
                "patches_per_s": n / wall,
                "patches_per_cpu_s": n / cpu,
            }
    return out


GAP_PARTS = ("scan + QC", "scores", "write", "decode", "resample", "encode", "in-build other")


def floor_gap(raw: dict[str, dict[str, Any]], mpp: float) -> dict[str, Any]:
    """Where ``--jobs 1`` spends CPU beyond the floor at ``mpp``, per side-by-side pair, ms per patch: the work the
    build owes beyond the floor's steps (scan + QC, scores, write), each floor step as the build pays it less the
    floor's own, and the rest of ``build()``; ``ceiling``: jobs 1 / floor were all but the owed work free."""
    pairs, r = [], 0
    while (fl := raw.get(f"floor@{mpp:.4f}" + (tag := f"#{r}" if r else ""))) is not None:
        b, r = raw[f"j1@{mpp:.4f}{tag}"], r + 1
        n = max(b["patches"], 1)
        ms = {s: 1000 * v / n for s, v in b["stages"]["cpu_s"].items()}
        floor, build = 1000 * fl["cpu_s"] / max(fl["patches"], 1), 1000 * b["cpu_s"] / n
        parts = {"scan + QC": ms["scan"] + ms["qc"], "scores": ms["scores"], "write": ms["write"]}
        parts |= {s: ms[s] - 1000 * fl[f"{s}_s"] / n for s in ("decode", "resample", "encode")}
        parts["in-build other"] = build - sum(v for s, v in ms.items() if s != "other")
        owed = parts["scan + QC"] + parts["scores"] + parts["write"]
        pairs.append(
            {"floor": floor, "build": build, "ratio": floor / build, "ceiling": floor / (floor + owed), **parts}
        )
    return {k: bk.median_range([p[k] for p in pairs])[0] for k in pairs[0]} | {"pairs": pairs}


def stage_table(raw: dict[str, dict[str, Any]]) -> str:
    names, rows = [*STAGES, "other"], []
    for mpp in SCANNERS:
        fl = raw[f"floor@{mpp:.4f}"]
        floor = [f"{1000 * fl[k] / max(fl['patches'], 1):.2f}" for k in ("decode_s", "resample_s", "encode_s")]
        for jobs in (1, 2):
            run = raw[f"j{jobs}@{mpp:.4f}"]
            st, n = run["stages"], max(run["patches"], 1)
            cells = [f"{st['total_cpu_s']:.2f}", f"{1000 * st['total_cpu_s'] / n:.2f}"]
            cells += [f"{100 * st['share'][s]:.1f}%" for s in names]
            rows.append([f"j{jobs} @ {mpp:.4f}", *cells, *(floor if jobs == 1 else ["", "", ""])])
    head = ("run", "CPU s", "ms/patch", *names, "floor decode", "floor resample", "floor encode")
    caption = "CPU per stage, % of the build's CPU (all its processes; exclusive time), and the floor's ms per patch"
    return bk.markdown(head, rows, caption)


def gap_table(raw: dict[str, dict[str, Any]]) -> str:
    rows = []
    for mpp in SCANNERS:
        g = floor_gap(raw, mpp)
        ratios = (bk.spread([p[k] for p in g["pairs"]]) for k in ("ratio", "ceiling"))
        rows.append(
            [f"{mpp:.4f}", *ratios, f"{g['floor']:.2f}", f"{g['build']:.2f}", *(f"{g[k]:+.3f}" for k in GAP_PARTS)]
        )
    caption = (
        "jobs 1 beyond the floor, CPU ms per patch (median of the side-by-side pairs): the work the build owes beyond "
        "the floor's three steps, each step's cost over the floor's, and the rest of build(); ceiling: jobs 1 / floor "
        "were all but the owed work (scan + QC, scores, write) free"
    )
    head = ("mpp", "jobs 1 / floor (CPU)", "ceiling", "floor ms", "jobs 1 ms", *GAP_PARTS)
    return bk.markdown(head, rows, caption, "lrrrr" + "r" * len(GAP_PARTS))


def mpp_table(raw: dict[str, dict[str, Any]]) -> str:
    """One row per mpp: rates, ratios and the targets' verdicts (``*``: other processes kept more than
    :data:`CONTENDED_CORES` busy during a run compared, so the wall-clock ratio is not on equal cores)."""

    def judge(ok: bool, *runs: str) -> str:
        return bk.verdict(ok) + "*" * any(raw[k]["other_load_cores"] > CONTENDED_CORES for k in runs)

    ref, hs2p, rows = rates(raw, REF_MPP)["j1"]["patches_per_s"], all(f"hs2p@{m:.4f}" in raw for m in SCANNERS), []
    for mpp, scanner in SCANNERS.items():
        at = f"@{mpp:.4f}"
        j1, j2, nv, fl, h = (
            rates(raw, mpp).get(k, {}).get("patches_per_s", 0.0) for k in ("j1", "j2", "naive", "floor", "hs2p")
        )
        row = [f"{mpp:.4f} ({scanner})", raw[f"j1{at}"]["patches"], f"{j1:.0f}", f"{j2:.0f}", f"{nv:.0f}"]
        row += [f"{j1 / nv:.2f}x; {j2 / (2 * nv):.2f}x", f"{fl:.0f}", f"{j1 / ref:.2f}x", f"{j2 / j1:.2f}x"]
        row += [judge(j1 / nv >= 3 and j2 / (2 * nv) >= 3, f"j1{at}", f"j2{at}", f"naive{at}")]
        row += ["-" if mpp == REF_MPP else judge(j1 / ref >= 0.8, f"j1{at}", f"j1@{REF_MPP:.4f}")]
        row += [judge(j2 / j1 >= 1.7, f"j1{at}", f"j2{at}")]
        row += [f"{h:.0f}", f"{j2 / h:.2f}x", judge(j2 / h >= 3, f"j2{at}", f"hs2p{at}")] if hs2p else []
        rows.append(row)
    head = ["level-0 mpp (scanner)", "patches", "jobs 1 patch/s", "jobs 2 patch/s", "naive patch/s (1 core)"]
    head += ["build / naive (j1; j2 vs 2x)", "floor patch/s", "vs 0.25 (j1)", "j2 / j1", ">= 3x naive", ">= 0.8x ref"]
    head += ["j2 >= 1.7x j1", *(("hs2p patch/s (2 processes)", "j2 / hs2p", ">= 3x hs2p") if hs2p else ())]
    return bk.markdown(head, rows)


def main_run(args: Any, mode: dict[str, Any]) -> int:
    if args.hs2p and bk.run_tree([args.hs2p, "-c", "import hs2p"])["returncode"]:  # now, not minutes in
        raise SystemExit(f"bench_build: --hs2p {args.hs2p}: it cannot import hs2p")
    load_before = bk.load()
    raw = measure(mode, args.workdir, args.hs2p)
    same = all(raw[f"j2@{m:.4f}"]["per_slide"] == raw[f"j1@{m:.4f}"]["per_slide"] for m in SCANNERS)
    failed = [f for run in raw.values() for f in run.get("failed", [])]
    config = {**mode, "scanners": {f"{m:.4f}": s for m, s in SCANNERS.items()}, "tissue_fraction": TISSUE}
    config |= {"cpus": os.cpu_count(), "load_before": load_before, "load_after": bk.load()}
    report = {
        "config": config | {"same_patches": same, "failed": failed},
        "rates": {f"{m:.4f}": rates(raw, m) for m in SCANNERS},
        "floor_gap": {f"{m:.4f}": floor_gap(raw, m) for m in SCANNERS},
        "raw": raw,
    }
    return bk.emit(report, stage_table(raw), gap_table(raw), mpp_table(raw), json_only=args.json_only)


CONTEXT_RUNS = {"none": (), "one 4x": (2.0,), "two (4x, 16x)": (2.0, 8.0)}  # context mpp around 0.5 mpp patches


def run_context(args: Any, mode: dict[str, Any]) -> int:
    """Build cost of context patches: default options at 0.2520 mpp, ``--jobs 1``, without context, with one 4x
    scale and with two, in interleaved rounds (the least time of each kept: a shared machine only adds)."""
    slides = ensure_slides(args.workdir / "slides", mode["size"], 2 if args.mode == "quick" else mode["n_slides"])
    spec = {"slides": slides, "output": str(args.workdir / "out-context"), "jobs": 1, "mpp": AT2}
    arms = {name: partial(run_child, "build", {**spec, "context_mpp": list(m)}) for name, m in CONTEXT_RUNS.items()}
    repeats = bk.sized(args, 1, 2, 3)
    rounds = bk.interleaved(repeats, arms, log)
    best = {name: {k: min(rd[name][k] for rd in rounds) for k in ("wall_s", "cpu_s")} for name in CONTEXT_RUNS}
    rows = [{"context": name, "patches": rounds[0][name]["patches"], **best[name]} for name in CONTEXT_RUNS]
    for row in rows:
        row |= {f"{k}_vs_none": row[f"{k}_s"] / best["none"][f"{k}_s"] for k in ("wall", "cpu")}
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
    caption = (
        f"Context patches: {len(slides)} slides of {mode['size'][0]}x{mode['size'][1]} px at {AT2} mpp, default "
        f"options, --jobs 1, least of {repeats} runs ({args.mode} mode)"
    )
    table = bk.markdown(
        ("context", "patches", "wall s", "CPU s", "wall / none", "CPU / none"), cells, caption, "lrrrrr"
    )
    report = {"config": {"mode": args.mode, "slides": len(slides), "mpp": AT2, "repeats": repeats}, "rows": rows}
    return bk.emit(report, table, json_only=args.json_only)


def main(argv: list[str] | None = None) -> int:
    hs2p_help = "an interpreter with hs2p installed (benchmarks/hs2p_child.py): hs2p's row per mpp, against jobs 2"
    args = bk.parse(
        __doc__,
        ("--hs2p", {"metavar": "PYTHON", "default": os.environ.get("WSISHARD_BENCH_HS2P"), "help": hs2p_help}),
        ("--context", {"action": "store_true", "help": "only the build cost of 0, 1 and 2 context scales"}),
        ("--spec", {"help": "a child's spec (JSON file)"}),
        argv=argv,
    )
    if args.child:
        print(json.dumps(CHILDREN[args.child](json.loads(Path(args.spec).read_text()))))
        return 0
    if args.smoke:  # the same runs at two mpp; hs2p needs its own interpreter and venv: never in a smoke run
        global SCANNERS
        SCANNERS, args.hs2p = {m: SCANNERS[m] for m in (REF_MPP, AT2)}, None
    return (run_context if args.context else main_run)(args, MODES[args.mode])


if __name__ == "__main__":
    import benchkit

    sys.exit(benchkit.run("bench_build_context" if "--context" in sys.argv else "bench_build", main, "bench_build"))
