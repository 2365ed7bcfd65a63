#!/usr/bin/env python
"""What wsishard's one C module (wsishard/_native.c) is worth: each of its functions against the code a user would
run without it, per sample, in CPU seconds, in rounds (the docs' performance page says how).

    python benchmarks/bench_native.py [BUILD] [--rounds 5]   # BUILD: a wsishard build (default: one made and cached)
    python benchmarks/bench_native.py --smoke                # one round of a one-slide build; nothing saved (CI)
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from typing import Any

import benchkit as bk
import numpy as np
import torch

from wsishard.shards.reader import TarSamples
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.decode import checked_label, decode_into
from wsishard.streaming.sources import stream
from wsishard.streaming.stages import RawSample


def _blobs(root: str) -> list[bytes]:
    ds = stream(root, batch_size=1, resampled=False, seed=0)
    return [ds.opener(ref.url).read() for ref in ds.shards]


def _read(blobs: list[bytes], native: bool) -> tuple[float, list[RawSample]]:
    t, raws = time.process_time(), []
    for i, blob in enumerate(blobs):
        for key, members in TarSamples(io.BytesIO(blob), ("jpg", "json", "cls"), native=native):
            kw = {"image": members["jpg"], "meta": members["json"], "label": members.get("cls")}
            raws.append(RawSample(key=key, shard=str(i), image_ext="jpg", **kw))
    return time.process_time() - t, raws


def _work(raws: list[RawSample], hw: tuple[int, int]) -> float:
    slot = np.empty((*hw, 3), np.uint8)
    t = time.process_time()
    for raw in raws:
        checked_label(raw)
        decode_into(raw, slot)
    return time.process_time() - t


def _collate(batch: torch.Tensor, native: bool, collate: GpuCollate) -> float:
    mean, std = torch.tensor(bk.MEAN).view(1, 3, 1, 1), torch.tensor(bk.STD).view(1, 3, 1, 1)
    t = time.process_time()
    if native:
        collate.images(batch)
    else:
        (((batch.permute(0, 3, 1, 2).float() / 255) - mean) / std).contiguous()
    return time.process_time() - t


def _scores_numpy(patch: np.ndarray) -> None:
    """The quality scores as 0.2 computed them without the C pass: Pillow's nearest resize, then numpy."""
    from PIL import Image

    small = np.asarray(Image.fromarray(patch).resize((64, 64), Image.Resampling.NEAREST))
    hi = small.max(axis=2).astype(np.int16)
    lo = small.min(axis=2).astype(np.int16)
    glass = ((hi - lo) * 100 < 8.0 * hi) & (hi > 204)
    lap = (hi[1:-1, :-2] + hi[1:-1, 2:] + hi[:-2, 1:-1] + hi[2:, 1:-1] - 4 * hi[1:-1, 1:-1]).ravel().astype(np.int64)
    np.count_nonzero(glass), np.count_nonzero(hi < 64), np.dot(lap, lap), lap.sum()


def _hsv_numpy(rgb: np.ndarray) -> None:
    """The scan's HSV planes as numpy computed them before the C pass (float32)."""
    rgbf = rgb.astype(np.float32)
    r, g, b = rgbf[..., 0], rgbf[..., 1], rgbf[..., 2]
    hi, lo = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    delta = hi - lo
    safe = np.where(delta > 0, delta, 1.0)
    hue = np.where(hi == r, (g - b) / safe, np.where(hi == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    np.where(delta > 0, (hue * 60.0) % 360.0, 0.0).astype(np.float32)
    np.where(hi > 0, delta / np.maximum(hi, 1.0), 0.0).astype(np.float32)
    (hi / 255.0).astype(np.float32)


def _build_side(patches: list[np.ndarray], view: np.ndarray) -> dict[str, float]:
    """CPU seconds: the scores of each patch with and without the C pass; the scan's median of one detection view
    with the C pass and with scikit-image's; importing SciPy and scikit-image's rank filters (what the build's
    process loaded before the C median) in a fresh interpreter that has loaded the build."""
    from skimage.filters.rank import median as rank_median

    from wsishard.builder.extract.quality import quality_scores
    from wsishard.builder.scan.morphology import disk, median

    out = {}
    for name, fn in (("scores_c", quality_scores), ("scores_numpy", _scores_numpy)):
        t = time.process_time()
        for patch in patches:
            fn(patch)
        out[name] = (time.process_time() - t) / len(patches)
    for name, fn in (("median_c", median), ("median_skimage", rank_median)):
        t = time.process_time()
        fn(view, disk(3))
        out[name] = time.process_time() - t
    from wsishard.builder.scan.artefacts import hsv_planes

    big = np.random.default_rng(2).integers(0, 256, (960, 1280, 3), dtype=np.uint8)  # a 40960x30720 slide's view
    for name, fn in (("hsv_c", hsv_planes), ("hsv_numpy", _hsv_numpy)):
        t = time.process_time()
        fn(big)
        out[name] = time.process_time() - t
    probe = (
        "import time, wsishard.builder.run.orchestrate\nt = time.process_time()\n"
        "import skimage.filters.rank, scipy.ndimage\nprint(time.process_time() - t)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    out["import_scipy_skimage"] = float(done.stdout.split()[-1])
    return out


def measure(root: str, rounds: int) -> dict[str, Any]:
    blobs = _blobs(root)
    _, raws = _read(blobs, True)
    hw = stream(root, batch_size=1).image_hw
    batch = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (256, *hw, 3), dtype=np.uint8))
    collate = GpuCollate("cpu", mean=bk.MEAN, std=bk.STD)  # default options: its output buffers taken in turn
    collate.images(batch)
    runs: dict[str, list[float]] = {k: [] for k in ("scan_c", "scan_python", "label_decode", "lut_c", "lut_torch")}
    for _ in range(rounds):
        runs["scan_c"].append(_read(blobs, True)[0] / len(raws))
        runs["scan_python"].append(_read(blobs, False)[0] / len(raws))
        runs["label_decode"].append(_work(raws, hw) / len(raws))
        runs["lut_c"].append(_collate(batch, True, collate) / len(batch))
        runs["lut_torch"].append(_collate(batch, False, collate) / len(batch))
    slot = np.empty((*hw, 3), np.uint8)
    patches = []
    for raw in raws[:300]:
        decode_into(raw, slot)
        patches.append(slot.copy())
    view = np.random.default_rng(1).integers(0, 256, (384, 512), dtype=np.uint8)  # a 16384x12288 slide at 8 um/px
    build_runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        for k, v in _build_side(patches, view).items():
            build_runs.setdefault(k, []).append(v)
    med = {k: bk.median_range(v)[0] * 1e6 for k, v in runs.items()}
    build_med = {k: bk.median_range(v)[0] * 1e6 for k, v in build_runs.items()}
    worker = med["scan_c"] + med["label_decode"]
    out = {"samples": len(raws), "patch_px": hw[0], "rounds": rounds, "median_us": med, "worker_us": worker}
    out |= {"range_us": {k: [x * 1e6 for x in bk.median_range(v)[1:]] for k, v in runs.items()}}
    out |= {"scan_removed_pct": (med["scan_python"] - med["scan_c"]) / worker * 100}
    out |= {"lut_removed_pct": (med["lut_torch"] - med["lut_c"]) / worker * 100, "build_median_us": build_med}
    return out | {"build_range_us": {k: [x * 1e6 for x in bk.median_range(v)[1:]] for k, v in build_runs.items()}}


def _build_ms_per_patch() -> float | None:
    """A default ``--jobs 1`` build's CPU per patch at 0.2520 mpp, from the latest saved ``bench_build`` run."""
    saved = bk.RESULTS / "bench_build.json"
    try:
        rate = json.loads(saved.read_text())["report"]["rates"]["0.2520"]["j1"]
    except (OSError, KeyError, ValueError):
        return None
    return float(rate["cpu_s"]) / rate["patches"] * 1e3


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("build", {"nargs": "?", "help": "a wsishard build (default: a build made and cached under --workdir)"}),
        ("--rounds", {"type": int, "default": 5}),
        argv=argv,
    )
    size = {"n_slides": bk.sized(args, 1, 2, 2), "size_px": bk.sized(args, 4096, 8192, 8192)}
    root = args.build or str(bk.cached_build(args.workdir / f"native-{args.mode}", **size)[1])
    res = measure(root, 1 if args.smoke else args.rounds)
    med, rng, tables = res["median_us"], res["range_us"], []
    caption = f"{res['samples']} samples of {res['patch_px']} px: CPU us a sample, median of {res['rounds']} rounds"
    rows = [(k, f"{v:.2f}", f"{rng[k][0]:.2f}-{rng[k][1]:.2f}") for k, v in med.items()]
    tables.append(bk.markdown(("step", "median (us)", "range (us)"), rows, caption))
    caption = f"What removing each C function costs, against a loader worker's {res['worker_us']:.0f} us a sample"
    keys = (("scan", "scan_removed_pct"), ("lut_apply", "lut_removed_pct"))
    rows = [(name, f"+{res[key]:.1f}%", "keep" if res[key] >= 5 else "remove") for name, key in keys]
    tables.append(bk.markdown(("C function", "cost without it", "rule (keep at >= 5%)"), rows, caption))
    bmed, brng = res["build_median_us"], res["build_range_us"]
    caption = (
        "Build side, CPU us: the scores per patch, the scan's median per 512x384 view (radius 3), its HSV planes of "
        "a 1280x960 view, and importing SciPy and scikit-image's rank filters in a process that has loaded the build "
        "(paid before the C median)"
    )
    rows = [(k, f"{v:.1f}", f"{brng[k][0]:.1f}-{brng[k][1]:.1f}") for k, v in bmed.items()]
    tables.append(bk.markdown(("step", "median (us)", "range (us)"), rows, caption))
    if (per_patch := _build_ms_per_patch()) is not None:
        caption = f"What removing each build-side C function costs, against a build's {per_patch:.2f} ms of CPU a patch"
        scores = res["quality_counts_removed_pct"] = (bmed["scores_numpy"] - bmed["scores_c"]) / (per_patch * 1e3) * 100
        hsv = f"+{2 * (bmed['hsv_numpy'] - bmed['hsv_c']) / 1e3:.0f} ms a 40960x30720 slide's scan (2 calls)"
        rows = [("quality_counts", f"+{scores:.1f}%", "keep" if scores >= 5 else "remove")]
        rows += [("rank_median", f"+{bmed['import_scipy_skimage'] / 1e3:.0f} ms a build's start-up", "keep (start-up)")]
        rows += [("hsv_planes", hsv, "keep (scan)")]
        tables.append(bk.markdown(("C function", "cost without it", "rule"), rows, caption))
        res["build_ms_per_patch"] = per_patch
    return bk.emit(res, *tables, json_only=args.json_only)


if __name__ == "__main__":
    import benchkit

    sys.exit(benchkit.run("bench_native", main))
