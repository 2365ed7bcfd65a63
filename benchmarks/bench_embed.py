#!/usr/bin/env python
"""Benchmark ``wsishard.embed``: patches/s of the whole embedding pass against the model alone on preloaded tensors.

    python benchmarks/bench_embed.py                      # CPU, a small CNN encoder
    python benchmarks/bench_embed.py --device cuda --model vit_s --dtype bf16
    python benchmarks/bench_embed.py --smoke              # a tiny build, one round, nothing saved (CI)

The pass is ``embed()`` end to end on a synthetic build (shards read, JPEGs decoded in the loader's workers,
``GpuCollate`` on the device, the model, features written); the reference is the same model's forward passes over as
many patches held as one normalized batch on the device. Their ratio says how much of the model's rate the pipeline
keeps. Rounds are interleaved.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import benchkit as bk
import torch

import wsishard
from wsishard import EmbedOptions


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


def _embed_rate(source: Path, model: torch.nn.Module, options: EmbedOptions) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    try:
        t0 = time.perf_counter()
        manifest = wsishard.embed(source, out / "emb", model=model, options=options)
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    patches = sum(s.patches for s in manifest.slides)
    return {"patches": patches, "seconds": seconds, "patches_per_s": patches / seconds}


def _model_rate(model: torch.nn.Module, patches: int, options: EmbedOptions, image_px: int) -> dict[str, Any]:
    device, steps = torch.device(options.device or "cpu"), -(-patches // options.batch_size)
    batch = torch.randn(options.batch_size, 3, image_px, image_px, device=device)  # preloaded, normalized
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(options.dtype)
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        model(batch)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            model(batch).float().cpu()  # the features brought back, as embed() does
        seconds = time.perf_counter() - t0
    return {
        "patches": steps * options.batch_size,
        "seconds": seconds,
        "patches_per_s": steps * options.batch_size / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    args = bk.parse(
        __doc__,
        ("--device", {"default": "cuda" if torch.cuda.is_available() else "cpu"}),
        ("--model", {"choices": ("cnn", "vit_s"), "default": "cnn"}),
        ("--dtype", {"choices": ("fp32", "bf16", "fp16"), "default": "fp32"}),
        ("--batch-size", {"type": int, "default": 128}),
        ("--workers", {"type": int, "default": 2}),
        ("--rounds", {"type": int, "default": 3, "help": "interleaved rounds (each times both once)"}),
        argv=argv,
    )
    rounds, patch_px = (1, 64) if args.smoke else (args.rounds, 256)
    size = {"n_slides": bk.sized(args, 2, 8, 8), "size_px": bk.sized(args, 2048, 8192, 8192), "slide_mpp": 0.25}
    size |= {"tissue_fraction": 0.5, "patch_size": patch_px, "shard_samples": 256}
    source = bk.cached_build(args.workdir / f"embed-{args.mode}", **size)[1]
    resize = 224 if args.model == "vit_s" else None
    model = (ViTSmall() if args.model == "vit_s" else SmallCNN()).to(args.device).eval()
    options = EmbedOptions(device=args.device, batch_size=args.batch_size, dtype=args.dtype, resize_px=resize)
    options = replace(options, num_workers=args.workers, part_samples=1 << 30)  # one part: the pass, not the resume
    patches = _embed_rate(source, model, options)["patches"]  # warm-up, and the count the model alone runs
    arms = {"embed": lambda: _embed_rate(source, model, options)}
    arms["model"] = lambda: _model_rate(model, patches, options, resize or patch_px)
    runs = bk.interleaved(rounds, arms)
    ratios = [r["embed"]["patches_per_s"] / r["model"]["patches_per_s"] for r in runs]
    rows = [[name, f"{patches}", bk.spread([r[name]["patches_per_s"] for r in runs], 1, "")] for name in arms]
    caption = (
        f"embedding {patches} patches of {resize or patch_px} px, {args.model} ({args.dtype}) on {args.device}, batch "
        f"{args.batch_size}, {args.workers} workers, {rounds} interleaved round(s): median [range]"
    )
    rows.append(["embed / model alone", "", bk.spread(ratios)])
    config = {"device": args.device, "model": args.model, "dtype": args.dtype, "batch": args.batch_size}
    report = {"config": config, "rounds": runs, "ratio": bk.median_range(ratios)[0]}
    return bk.emit(
        report, bk.markdown(["pass", "patches", "patches/s"], rows, caption, "lrr"), json_only=args.json_only
    )


if __name__ == "__main__":
    import benchkit

    on_gpu = "cuda" in " ".join(sys.argv[1:])
    sys.exit(benchkit.run("bench_embed_gpu" if on_gpu else "bench_embed", main, script="bench_embed"))
