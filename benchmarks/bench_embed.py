#!/usr/bin/env python
"""Benchmark ``wsishard.embed``: patches/s of the whole embedding pass against the model alone on preloaded tensors.

Example::

    python benchmarks/bench_embed.py                      # CPU, a small CNN encoder
    python benchmarks/bench_embed.py --device cuda --model vit_s --dtype bf16

The pass is ``embed()`` end to end on a synthetic build (its shards read, JPEGs decoded in the loader's workers,
``GpuCollate`` on the device, the model, features written); the reference is the same model's forward passes over the
same number of patches held as one normalized float batch already on the device: what the model alone can do. The
ratio says how much of the model's rate the pipeline keeps (1.0: the loader never makes the model wait). Rounds are
interleaved (each round runs both, one after the other), so a ratio sees one machine.

Prints a Markdown table, then one line ``JSON: {...}``; ``benchkit`` saves both to
``benchmarks/results/bench_embed.json`` (``bench_embed_gpu.json`` on CUDA). Wall-clock figures on a shared machine
are what they are: reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import wsishard
from wsishard import BuildOptions, EmbedOptions, PatchOptions


class SmallCNN(torch.nn.Module):
    """A small convolutional encoder (B, 3, H, W) -> (B, 128): four strided conv blocks, global pooling."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        for c_in, c_out in ((3, 16), (16, 32), (32, 64), (64, 128)):
            layers += [torch.nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ViTSmall(torch.nn.Module):
    """A ViT-S/16-sized encoder (384 wide, 12 layers, 6 heads, 16 px patches) -> (B, 384): the class token."""

    def __init__(self, image_px: int = 224) -> None:
        super().__init__()
        self.patchify = torch.nn.Conv2d(3, 384, 16, stride=16)
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, 384))
        self.pos = torch.nn.Parameter(torch.zeros(1, 1 + (image_px // 16) ** 2, 384))
        layer = torch.nn.TransformerEncoderLayer(384, 6, 4 * 384, activation="gelu", batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patchify(x).flatten(2).transpose(1, 2)  # (B, T, 384)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), tokens], 1) + self.pos
        return self.blocks(tokens)[:, 0]


def _source(workdir: Path, smoke: bool) -> Path:
    """A synthetic build, made once and reused (benchkit.synthetic_build)."""
    from benchkit import synthetic_build

    want = {"n_slides": 2 if smoke else 8, "size_px": 2048 if smoke else 8192, "slide_mpp": 0.25}
    want |= {"tissue_fraction": 0.5, "patch_px": 64 if smoke else 256}
    options = BuildOptions(patch=PatchOptions(patch_size_px=want["patch_px"]), shard_samples=256, jobs=2, seed=0)

    def make(paths: list[str], out: Path) -> None:
        wsishard.build(paths, str(out), options)

    return synthetic_build(workdir / ("smoke" if smoke else "full"), want, make)[1]


def _embed_rate(source: Path, model: torch.nn.Module, options: EmbedOptions) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    try:
        t0 = time.perf_counter()
        manifest = wsishard.embed(source, out / "emb", model=model, options=options)
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    assert manifest is not None
    patches = sum(s.patches for s in manifest.slides)
    return {"patches": patches, "seconds": round(seconds, 3), "patches_per_s": round(patches / seconds, 1)}


def _model_rate(model: torch.nn.Module, patches: int, options: EmbedOptions, image_px: int) -> dict[str, Any]:
    device = torch.device(options.device or "cpu")
    batch = torch.randn(options.batch_size, 3, image_px, image_px, device=device)  # preloaded, normalized
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.dtype)
    steps = -(-patches // options.batch_size)
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        model(batch)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            model(batch).float().cpu()  # the features brought back, as embed() does
        seconds = time.perf_counter() - t0
    done = steps * options.batch_size
    return {"patches": done, "seconds": round(seconds, 3), "patches_per_s": round(done / seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", choices=("cnn", "vit_s"), default="cnn")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each times both once)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "wsishard-bench-embed")
    p.add_argument("--smoke", action="store_true", help="a few seconds: a tiny build, one round, nothing saved (CI)")
    args = p.parse_args(argv)
    from benchkit import interleaved, markdown, spread

    rounds = 1 if args.smoke else args.rounds
    source = _source(args.workdir, args.smoke)
    resize = 224 if args.model == "vit_s" else None
    image_px = resize or (64 if args.smoke else 256)
    model = (ViTSmall() if args.model == "vit_s" else SmallCNN()).to(args.device).eval()
    options = EmbedOptions(
        device=args.device, batch_size=args.batch_size, dtype=args.dtype, num_workers=args.workers, resize_px=resize
    )
    options = replace(options, part_samples=1 << 30)  # one part: the pass, not the resume bookkeeping
    patches = _embed_rate(source, model, options)["patches"]  # warm-up, and the count the model alone runs
    runs = interleaved(
        rounds,
        {
            "embed": lambda: _embed_rate(source, model, options),
            "model": lambda: _model_rate(model, patches, options, image_px),
        },
    )
    ratios = [r["embed"]["patches_per_s"] / r["model"]["patches_per_s"] for r in runs]
    rows = [
        [name, f"{patches}", spread([r[name]["patches_per_s"] for r in runs], 1, "")] for name in ("embed", "model")
    ]
    caption = (
        f"embedding {patches} patches of {image_px} px, {args.model} ({args.dtype}) on {args.device}, batch "
        f"{args.batch_size}, {args.workers} workers, {rounds} interleaved round(s): median [range]"
    )
    print(markdown(["pass", "patches", "patches/s"], rows, caption, "lrr"))
    print(f"\nembed / model alone: {spread(ratios)}")
    report = {
        "config": {"device": args.device, "model": args.model, "dtype": args.dtype, "batch": args.batch_size},
        "rounds": runs,
        "ratio": round(sorted(ratios)[len(ratios) // 2], 3),
    }
    print("JSON: " + json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import benchkit  # saves benchmarks/results/bench_embed.json

    on_gpu = "cuda" in " ".join(sys.argv[1:])
    sys.exit(benchkit.run("bench_embed_gpu" if on_gpu else "bench_embed", main, script="bench_embed"))
