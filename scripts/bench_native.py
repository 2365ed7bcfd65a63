"""What wsishard's one C module (wsishard/_native.c) is worth: each of its functions against the code a user would
run without it, per sample, in CPU seconds (the docs' performance page says how).

Usage::

    python scripts/bench_native.py [BUILD] [--rounds 5]

BUILD is a wsishard build (default: one made by ``wsishard demo`` in a temporary folder).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from benchkit import markdown, median_range

from wsishard.shards.reader import TarSamples
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.decode import checked_label, decode_into
from wsishard.streaming.sources import stream
from wsishard.streaming.stages import RawSample

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _blobs(root: str) -> list[bytes]:
    ds = stream(root, batch_size=1, resampled=False, seed=0)
    return [ds.opener(ref.url).read() for ref in ds.shards]


def _read(blobs: list[bytes], native: bool) -> tuple[float, list[RawSample]]:
    t, raws = time.process_time(), []
    for i, blob in enumerate(blobs):
        for key, members in TarSamples(io.BytesIO(blob), ("jpg", "json", "cls"), native=native):
            raws.append(
                RawSample(
                    key=key,
                    shard=str(i),
                    image_ext="jpg",
                    image=members["jpg"],
                    meta=members["json"],
                    label=members.get("cls"),
                )
            )
    return time.process_time() - t, raws


def _work(raws: list[RawSample], hw: tuple[int, int]) -> float:
    slot = np.empty((*hw, 3), np.uint8)
    t = time.process_time()
    for raw in raws:
        checked_label(raw)
        decode_into(raw, slot)
    return time.process_time() - t


def _collate(batch: torch.Tensor, native: bool, collate: GpuCollate) -> float:
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    t = time.process_time()
    if native:
        collate.images(batch)
    else:
        (((batch.permute(0, 3, 1, 2).float() / 255) - mean) / std).contiguous()
    return time.process_time() - t


def measure(root: str, rounds: int) -> dict[str, Any]:
    blobs = _blobs(root)
    _, raws = _read(blobs, True)
    hw = stream(root, batch_size=1).image_hw
    batch = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (256, *hw, 3), dtype=np.uint8))
    collate = GpuCollate("cpu", mean=MEAN, std=STD)  # default options: its output buffers taken in turn
    collate.images(batch)
    runs: dict[str, list[float]] = {k: [] for k in ("scan_c", "scan_python", "label_decode", "lut_c", "lut_torch")}
    for _ in range(rounds):
        runs["scan_c"].append(_read(blobs, True)[0] / len(raws))
        runs["scan_python"].append(_read(blobs, False)[0] / len(raws))
        runs["label_decode"].append(_work(raws, hw) / len(raws))
        runs["lut_c"].append(_collate(batch, True, collate) / len(batch))
        runs["lut_torch"].append(_collate(batch, False, collate) / len(batch))
    med = {k: median_range(v)[0] * 1e6 for k, v in runs.items()}
    worker = med["scan_c"] + med["label_decode"]
    return {
        "samples": len(raws),
        "patch_px": hw[0],
        "rounds": rounds,
        "median_us": med,
        "range_us": {k: [x * 1e6 for x in median_range(v)[1:]] for k, v in runs.items()},
        "worker_us": worker,
        "scan_removed_pct": (med["scan_python"] - med["scan_c"]) / worker * 100,
        "lut_removed_pct": (med["lut_torch"] - med["lut_c"]) / worker * 100,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", nargs="?", help="a wsishard build (default: a demo build made here)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.build
        if root is None:
            subprocess.run([sys.executable, "-m", "wsishard.cli", "demo", "-o", tmp, "-q"], check=True)
            root = str(Path(tmp) / "shards")
        res = measure(root, args.rounds)
    med, rng = res["median_us"], res["range_us"]
    caption = f"{res['samples']} samples of {res['patch_px']} px: CPU us a sample, median of {res['rounds']} rounds"
    rows = [(k, f"{v:.2f}", f"{rng[k][0]:.2f}-{rng[k][1]:.2f}") for k, v in med.items()]
    print(markdown(("step", "median (us)", "range (us)"), rows, caption))
    caption = f"What removing each C function costs, against a loader worker's {res['worker_us']:.0f} us a sample"
    rows = [
        (name, f"+{res[key]:.1f}%", "keep" if res[key] >= 5 else "remove")
        for name, key in (("scan", "scan_removed_pct"), ("lut_apply", "lut_removed_pct"))
    ]
    print(markdown(("C function", "cost without it", "rule (keep at >= 5%)"), rows, caption))
    print("JSON: " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchresults import run

    sys.exit(run("bench_native", main))
