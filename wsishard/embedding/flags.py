"""``wsishard embed`` and ``wsishard export``: their flags (plain Python, so ``wsishard --help`` loads no torch) and
their commands, which import the embedding pass when they run."""

from __future__ import annotations

import argparse
import os
from typing import Any

from wsishard import cliargs
from wsishard.buildflags import add_storage_option
from wsishard.embedding.options import DTYPES, IMAGENET_MEAN, IMAGENET_STD, EmbedOptions
from wsishard.errors import OptionError

__all__ = ["add_embed_parser", "embed_options"]


def add_embed_parser(sub: Any) -> None:
    p = sub.add_parser(
        "embed",
        help="run a model over every patch of a build: one sample of features per slide",
        description="Run MODEL over every patch of a build, each exactly once (under torchrun each rank embeds "
        "its own share), and write one sample per slide (features.npy (N, D) float16, coords.npy (N, 2) level-0 "
        "x, y, keys.json) as an output of its own. A killed run, run again, embeds only what it had not.",
    )
    p.add_argument("shards", help="the build output (folder, manifest.json path or URL prefix)")
    p.add_argument("-o", "--output", required=True, help="the embeddings output (folder or URL prefix)")
    p.add_argument(
        "--model",
        required=True,
        metavar="MODULE:CALLABLE",
        help="CALLABLE() returns a torch.nn.Module; or timm:NAME, timm's model NAME (timm installed) without a head",
    )
    p.add_argument(
        "--weights", default=None, metavar="FILE.safetensors", help="weights loaded into the model (never a pickle)"
    )
    p.add_argument("--mean", type=float, nargs=3, default=IMAGENET_MEAN, metavar=("R", "G", "B"))
    p.add_argument("--std", type=float, nargs=3, default=IMAGENET_STD, metavar=("R", "G", "B"))
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu... (default: CUDA when present)")
    p.add_argument("--batch-size", type=cliargs.positive(int), default=64, help="patches per forward pass")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="bf16/fp16: autocast (a CPU takes bf16 only)")
    p.add_argument("--num-workers", type=int, default=2, metavar="N", help="DataLoader workers decoding JPEGs")
    p.add_argument("--resize", type=cliargs.positive(int), default=None, metavar="PX", help="resize patches to PX")
    p.add_argument("--part-samples", type=cliargs.positive(int), default=8192, help="patches per resume unit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_storage_option(p)
    p.set_defaults(func=_cmd_embed)
    p = sub.add_parser(
        "export",
        help="write an embeddings output as one h5 file per slide (CLAM / TRIDENT layout)",
        description="Write every slide of an embeddings output (wsishard embed) as DIR/<slide_id>.h5 with datasets "
        "features (N, D) and coords (N, 2) (level-0 x, y), the patch size and mpp as attributes (needs h5py).",
    )
    p.add_argument("output", help="the embeddings output (folder, manifest.json path or URL prefix)")
    p.add_argument("--format", choices=("h5",), default="h5", help="one h5 file per slide")
    p.add_argument("-o", "--dir", required=True, help="local folder the files are written to")
    add_storage_option(p)
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    try:
        from wsishard.embedding.export import export_h5
    except ModuleNotFoundError as exc:
        raise OptionError(f"export --format h5 needs h5py ({exc}): pip install 'wsishard[h5]'") from exc
    written = export_h5(args.output, args.dir, dict(args.storage_option))
    print(f"{args.dir}: {len(written)} h5 files")
    return 0


def embed_options(args: argparse.Namespace) -> EmbedOptions:
    return EmbedOptions(
        mean=tuple(args.mean),
        std=tuple(args.std),
        device=args.device,
        batch_size=args.batch_size,
        dtype=args.dtype,
        num_workers=args.num_workers,
        resize_px=args.resize,
        part_samples=args.part_samples,
        weights=args.weights,
    )


def _torchrun_group() -> bool:
    """Under torchrun (its ``WORLD_SIZE`` > 1), a gloo process group for the ranks to wait for each other before
    rank 0 joins their parts (the ranks may finish hours apart: no timeout short of a day); True if made here."""
    import datetime

    import torch.distributed

    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or torch.distributed.is_initialized():
        return False
    torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(days=1))
    return True


def _cmd_embed(args: argparse.Namespace) -> int:
    import torch.distributed
    from tqdm import tqdm

    from wsishard.embedding.run import EmbedProgress, embed

    options = embed_options(args)
    bar: tqdm | None = None

    def progress(event: EmbedProgress) -> None:
        nonlocal bar
        if bar is None:
            rank = os.environ.get("RANK")
            desc = "embed" if rank is None else f"embed rank {rank}"
            bar = tqdm(total=event.total, desc=desc, unit="patch", disable=args.quiet or None)
        bar.update(event.done - bar.n)  # tqdm's rate: patches/s

    group = _torchrun_group()
    try:
        manifest = embed(
            args.shards,
            args.output,
            model=args.model,
            options=options,
            storage_options=dict(args.storage_option),
            progress=progress,
        )
    finally:
        if bar is not None:
            bar.close()
        if group:
            torch.distributed.destroy_process_group()
    if manifest is not None:
        dim = manifest.extra["embed"]["dim"]
        print(f"{args.output}: {len(manifest.slides)} slides, {manifest.total_samples} samples, D={dim}")
    return 0
